"""The restart runbook resumes from this run's own newest valid checkpoint, or a named one."""

from __future__ import annotations

import pytest
from support.waits import wait_step

from trainmedic.core.errors import CheckpointError
from trainmedic.core.models import JobSpec

pytestmark = pytest.mark.server


def test_restart_resumes_from_the_newest_or_the_named_checkpoint(prefect_server, sim) -> None:
    from flows.restart import RestartRequest, restart

    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="resume", nodes=1, steps=100_000, checkpoint_every=20))
    wait_step(job, 45)
    newest = restart(RestartRequest(job_id=job.job_id))
    assert newest.checkpoint_step is not None and newest.checkpoint_step >= 40
    named = restart(RestartRequest(job_id=newest.new_job_id, from_checkpoint=20))
    assert named.checkpoint_step == 20
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        restart(RestartRequest(job_id=named.new_job_id, from_checkpoint=30))
