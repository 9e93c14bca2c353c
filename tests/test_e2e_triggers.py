"""Event → deployment trigger → worker → runbook → scheduler, with nothing in between faked:
the embedded stack (Prefect server, `prefect deploy --all`, a process worker, the simulated
DCGM exporter) in a temporary home, the intake, and jobs on the simulated cluster."""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import wait_finished, wait_step
from prefect.settings import PREFECT_API_URL, temporary_settings

from trainmedic import checkpoints
from trainmedic.events import emit
from trainmedic.intake import Intake
from trainmedic.models import JobEvent, JobInfo, JobSpec, JobState, NodeState
from trainmedic.scheduler.sim import SimScheduler
from trainmedic.settings import Settings, get_settings
from trainmedic.sim.cluster import SimCluster
from trainmedic.stack import Stack

pytestmark = [pytest.mark.server, pytest.mark.slow]
LATENCIES: list[float] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, Stack]]:
    root = tmp_path_factory.mktemp("e2e")
    overrides = {
        "TRAINMEDIC_HOME": str(root / "home"),
        "TRAINMEDIC_INVENTORY": str(root / "inventory"),
        "TRAINMEDIC_SERVER_PORT": str(free_port()),
        "TRAINMEDIC_SIM_EXPORTER_PORT": str(free_port()),
        "TRAINMEDIC_VERIFY_TIMEOUT_S": "60",
        "TRAINMEDIC_HANG_TIMEOUT_S": "6",
    }
    saved = {k: os.environ.get(k) for k in [*overrides, "PREFECT_API_URL"]}
    os.environ.update(overrides)
    os.environ.pop("PREFECT_API_URL", None)
    get_settings.cache_clear()
    settings = get_settings()
    SimCluster(settings.sim_home).create(8, inventory_dir=settings.inventory)
    embedded = Stack(settings)
    try:
        embedded.up()
        with temporary_settings({PREFECT_API_URL: embedded.api_url}):
            yield settings, embedded
    finally:
        scheduler = SimScheduler(settings.sim_home)
        for job in scheduler.jobs():
            if not job.state.finished:
                scheduler.cancel(job.job_id, "test teardown")
        embedded.down()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        get_settings.cache_clear()
    if LATENCIES:
        print(
            f"\nevent-to-resubmission latency: median {statistics.median(LATENCIES):.1f} s "
            f"over {len(LATENCIES)} runs: {[round(x, 1) for x in LATENCIES]}"
        )


def wait_resubmission(scheduler: SimScheduler, job_id: str, timeout: float = 120) -> JobInfo:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [j for j in scheduler.jobs() if j.resubmission_of == job_id]
        if found:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} was not resubmitted within {timeout} s")


def run_job(settings: Settings, name: str, **spec: object) -> tuple[SimScheduler, JobInfo]:
    scheduler = SimScheduler(settings.sim_home)
    for earlier in scheduler.jobs():  # free the nodes that earlier scenarios' jobs hold
        if not earlier.state.finished:
            scheduler.cancel(earlier.job_id, "next scenario")
    job = scheduler.submit(JobSpec(name=name, steps=100_000, checkpoint_every=20, **spec))
    assert job.state is JobState.RUNNING, job.reason
    return scheduler, job


def test_failure_event_triggers_triage_and_resubmission(stack) -> None:
    settings, embedded = stack
    cluster = SimCluster(settings.sim_home)
    scheduler, job = run_job(settings, "trig", nodes=2)
    intake = Intake(scheduler, settings.home, lambda e: emit(e, api_url=embedded.api_url))
    intake.poll()  # baseline pass
    wait_step(job, 50)
    cluster.inject(job.nodes[0], "ecc", gpu=1)
    failed = wait_finished(scheduler, job.job_id)
    sent_at = time.time()
    assert [e.kind for e in intake.poll()] == ["job.failed"]
    new = wait_resubmission(scheduler, job.job_id)
    LATENCIES.append(new.submitted_at.timestamp() - sent_at)
    newest = checkpoints.newest_valid(checkpoints.scan(Path(failed.checkpoint_dir)))
    assert new.spec.resume_from_step == newest.step
    assert failed.nodes[0] not in new.nodes
    drained = {n.name: n for n in scheduler.nodes()}[failed.nodes[0]]
    assert drained.state is NodeState.DRAINED and "ECCError" in drained.reason


def test_duplicate_events_remediate_once(stack) -> None:
    settings, embedded = stack
    cluster = SimCluster(settings.sim_home)
    scheduler, job = run_job(settings, "dup", nodes=2)
    wait_step(job, 30)
    cluster.inject(job.nodes[1], "xid79")
    failed = wait_finished(scheduler, job.job_id)
    event = JobEvent(kind="job.failed", job_id=failed.job_id, nodes=failed.nodes, exit_code=1)
    sent_at = time.time()
    emit(event, api_url=embedded.api_url)
    emit(event, api_url=embedded.api_url)  # a replay
    emit(JobEvent(kind="job.node_fail", job_id=failed.job_id), api_url=embedded.api_url)
    new = wait_resubmission(scheduler, job.job_id)
    LATENCIES.append(new.submitted_at.timestamp() - sent_at)
    time.sleep(15)  # give any second remediation the time to (wrongly) act
    assert [j.job_id for j in scheduler.jobs() if j.resubmission_of == job.job_id] == [new.job_id]


def test_loss_spike_event_rolls_back_and_skips_batches(stack) -> None:
    settings, embedded = stack
    scheduler, job = run_job(settings, "spiky", nodes=1)
    scheduler.inject_job_fault(job.job_id, "spike", batch=130)
    wait_step(job, 150)
    sent_at = time.time()
    emit(JobEvent(kind="job.loss_spike", job_id=job.job_id, step=145), api_url=embedded.api_url)
    new = wait_resubmission(scheduler, job.job_id)
    LATENCIES.append(new.submitted_at.timestamp() - sent_at)
    assert new.spec.resume_from_step == 120  # newest checkpoint before the spike at 130
    assert new.spec.skip_batches == (121, 130)
    assert scheduler.job(job.job_id).state is JobState.CANCELLED
    wait_step(new, 140)
    rows = (Path(new.log_dir).parent / "loss.csv").read_text().split()
    losses = [float(r.split(",")[2]) for r in rows]
    assert max(losses) < 4.0  # the poisoned batch was skipped: no spike this time


def test_hang_is_detected_and_triaged(stack) -> None:
    from flows.watchdog import WatchdogRequest, watchdog

    settings, _ = stack
    scheduler, job = run_job(settings, "hangs", nodes=2)
    wait_step(job, 30)
    scheduler.inject_job_fault(job.job_id, "hang")
    hung_at = time.time()
    findings = []
    while not findings and time.time() - hung_at < 30:
        time.sleep(1)
        findings = watchdog(WatchdogRequest())
    detected_after = time.time() - hung_at
    assert [f.job_id for f in findings] == [job.job_id]
    assert detected_after < 2 * 6 + 2
    new = wait_resubmission(scheduler, job.job_id)
    assert scheduler.job(job.job_id).state is JobState.CANCELLED
    assert new.spec.resume_from_step is not None
