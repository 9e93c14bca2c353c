"""The rollback runbook acts only on a spike its loss curve shows, and triage sends a loss
spike it diagnoses down the rollback path (real Prefect server, simulated cluster)."""

from __future__ import annotations

import pytest
from support.waits import wait_step, wait_until

from trainmedic.core.models import JobSpec, JobState

pytestmark = pytest.mark.server


def test_a_spike_reported_on_a_flat_curve_stops_nothing(prefect_server, sim) -> None:
    """The report says step 40, the curve is flat: nothing is stopped, a human is asked (the
    form's default is no), and with no answer nothing happens."""
    from flows.rollback import RollbackRequest, rollback

    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="healthy", nodes=1, steps=100_000, checkpoint_every=20))
    wait_step(job, 50)
    result = rollback(RollbackRequest(job_id=job.job_id, reported_step=40, approval_timeout_s=10))
    assert not result.acted
    assert result.new_job_id is None and result.skip_batches is None
    assert scheduler.job(job.job_id).state is JobState.RUNNING
    assert [j for j in scheduler.jobs() if j.resubmission_of == job.job_id] == []


def test_triage_of_a_diverged_job_rolls_back_and_skips_the_batches(prefect_server, sim) -> None:
    from flows.triage import TriageRequest, triage

    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="spiky", nodes=1, steps=100_000, checkpoint_every=20))
    scheduler.inject_job_fault(job.job_id, "spike", batch=70)
    wait_step(job, 95)
    result = triage(TriageRequest(job_id=job.job_id, event="job.loss_spike"))
    assert result.category == "LossSpike"
    assert result.new_job_id is not None and result.checkpoint_step == 60
    new = scheduler.job(result.new_job_id)
    assert new.spec.resume_from_step == 60  # the newest checkpoint before the spike at 70
    assert new.spec.skip_batches is not None and new.spec.skip_batches[1] >= 70
    wait_until(lambda: scheduler.job(job.job_id).state.finished, 30, "diverged job stopped")


def test_a_spike_past_the_retry_budget_pages_and_rolls_nothing_back(
    prefect_server, sim, monkeypatch
) -> None:
    """A rollback the budget forbids is a page that reaches the automation (an event), not a
    line in a report nobody reads; the job is not stopped."""
    from support.waits import server_events

    from flows.rollback import RollbackRequest, rollback
    from trainmedic.core.settings import get_settings

    monkeypatch.setenv("TRAINMEDIC_RETRY_BUDGET", "0")
    get_settings.cache_clear()
    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="spent", nodes=1, steps=100_000, checkpoint_every=20))
    scheduler.inject_job_fault(job.job_id, "spike", batch=50)
    wait_step(job, 60)
    result = rollback(RollbackRequest(job_id=job.job_id, reported_step=55))
    assert not result.acted and result.new_job_id is None
    assert scheduler.job(job.job_id).state is JobState.RUNNING
    pages = wait_until(
        lambda: [
            e
            for e in server_events(f"trainmedic.job.{job.job_id}")
            if e["event"] == "trainmedic.page"
            and "not rolled back again" in e["payload"]["summary"]
        ],
        30,
        "the page",
    )
    assert f"trainmedic restart {job.job_id} --from-checkpoint 40" in pages[0]["payload"]["answer"]
