"""The circuit breaker stops automatic destructive actions after K in a window, on a real
Prefect server with the simulated cluster, until a human resets it."""

from __future__ import annotations

import pytest
from support.waits import wait_finished, wait_step

from trainmedic.cli.main import main
from trainmedic.core.errors import PolicyRefused
from trainmedic.core.models import JobSpec, NodeState
from trainmedic.core.settings import get_settings

pytestmark = pytest.mark.server


def failed(sim, name: str):  # type: ignore[no-untyped-def]
    cluster, scheduler = sim
    job = scheduler.submit(JobSpec(name=name, nodes=2, steps=100_000, checkpoint_every=20))
    wait_step(job, 25)
    cluster.inject(job.nodes[1], "ecc")
    return wait_finished(scheduler, job.job_id)


def test_breaker_refuses_after_the_limit_until_reset(prefect_server, sim, monkeypatch) -> None:
    from flows.triage import TriageRequest, triage

    monkeypatch.setenv("TRAINMEDIC_BREAKER_LIMIT", "2")
    monkeypatch.setenv("TRAINMEDIC_DRAIN_MIN_DRAINABLE", "4")
    get_settings.cache_clear()
    _, scheduler = sim
    first = failed(sim, "one")
    done = triage(TriageRequest(job_id=first.job_id))  # drain + resubmit: 2 actions
    assert done.drained and done.new_job_id
    scheduler.cancel(done.new_job_id, "free the nodes")

    second = failed(sim, "two")
    with pytest.raises(PolicyRefused, match="circuit breaker OPEN"):
        triage(TriageRequest(job_id=second.job_id))
    states = {n.name: n.state for n in scheduler.nodes()}
    assert states[second.nodes[1]] is not NodeState.DRAINED  # refused before acting
    assert not [j for j in scheduler.jobs() if j.resubmission_of == second.job_id]

    # (No capsys here: Prefect's console log handler would keep its stream after the test.)
    assert main(["breaker", "--reset"]) == 0
    from flows.tasks import breaker_status

    assert not breaker_status().open
    again = triage(TriageRequest(job_id=second.job_id))
    assert again.drained == [second.nodes[1]] and again.new_job_id
