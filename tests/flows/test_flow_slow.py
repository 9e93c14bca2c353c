"""Fail-slow: a job that keeps training on an overheating GPU (steps 4x slower, no error) is
found by the watchdog from its own step times, and its triage saves, stops, pair-tests its
nodes, drains the hot one and resubmits without it; on the real Prefect server and the
simulated cluster with its DCGM exporter."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.artifacts import artifact_text
from support.waits import wait_step, wait_until

from trainmedic.core.models import JobSpec, JobState, NodeState
from trainmedic.core.settings import get_settings

pytestmark = pytest.mark.server


@pytest.fixture
def exporter(sim, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The simulated cluster's DCGM exporter, over real HTTP, as the runbooks' telemetry."""
    from trainmedic.sim.exporter import make_server

    cluster, _ = sim
    server = make_server(cluster, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    monkeypatch.setenv("TRAINMEDIC_TELEMETRY_URL", url)
    monkeypatch.setenv("TRAINMEDIC_SLOW_MIN_S", "2")  # the sim's steps are 50 ms, not seconds
    get_settings.cache_clear()
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()
        get_settings.cache_clear()


def test_an_overheating_node_is_found_by_its_slowness_drained_and_the_job_moved(
    prefect_server, sim, exporter
) -> None:
    from flows.triage import TriageRequest, triage
    from flows.watchdog import find_slow_jobs

    cluster, scheduler = sim
    job = scheduler.submit(JobSpec(name="warm", nodes=4, steps=100_000, checkpoint_every=50))
    wait_step(job, 60)
    assert find_slow_jobs.fn([]) == []  # healthy: its own pace
    hot = job.nodes[1]
    cluster.inject(hot, "overheat", gpu=2)
    found = wait_until(
        lambda: [f for f in find_slow_jobs.fn([]) if f.job_id == job.job_id],
        60,
        "the watchdog to see the job slow down",
        interval=0.5,
    )[0]
    assert found.slowdown.ratio >= 2 and f"{hot} GPU 2 at 96 C" in found.hot_gpus
    assert scheduler.job(job.job_id).state is JobState.RUNNING  # no error anywhere

    reached = json.loads(Path(job.heartbeat_path).read_text())["step"]
    result = triage(TriageRequest(job_id=job.job_id, event="job.slow"))
    assert result.category == "fail-slow" and result.drained == [hot]
    assert scheduler.job(job.job_id).state is JobState.CANCELLED
    new = scheduler.job(result.new_job_id)
    assert hot not in new.nodes and new.spec.resume_from_step == result.checkpoint_step
    assert {n.name: n.state for n in scheduler.nodes()}[hot] is NodeState.DRAINED
    # The checkpoint was saved on request, at the slow step it had reached (or later), not the
    # last periodic one before it; the report says so.
    assert result.checkpoint_step is not None and result.checkpoint_step >= reached
    text = artifact_text(result.report_id)
    assert f"{hot} GPU 2 at 96 C" in text and "slow" in text
    assert f"checkpoint saved before the stop: step {result.checkpoint_step}" in text

    # A replay of the event now starts nothing: the job was already moved.
    again = triage(TriageRequest(job_id=job.job_id, event="job.slow"))
    assert again.not_handled and again.new_job_id is None
