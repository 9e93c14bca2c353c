"""The restart runbook resumes from this run's own newest valid checkpoint, or a named one."""

from __future__ import annotations

import pytest
from support.artifacts import artifact_text
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


def test_a_second_restart_of_the_same_job_submits_nothing_and_says_so(prefect_server, sim) -> None:
    """A rerun (or a replayed request) finds the job already resubmitted: no second copy, and
    the report says it was found done, not that this run resubmitted it."""
    from flows.restart import RestartRequest, restart

    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="twice", nodes=1, steps=100_000, checkpoint_every=20))
    wait_step(job, 25)
    first = restart(RestartRequest(job_id=job.job_id))
    assert "| resubmit | job" in artifact_text(first.report_id)
    again = restart(RestartRequest(job_id=job.job_id))
    assert again.new_job_id == first.new_job_id
    copies = [j.job_id for j in scheduler.jobs() if j.resubmission_of == job.job_id]
    assert copies == [first.new_job_id]
    text = artifact_text(again.report_id)
    assert f"already resubmitted as job {first.new_job_id} (earlier): not again" in text
    assert f"job {first.new_job_id} from step" not in text
