"""Faults of the remediation system itself: a restarted Prefect server, a hung playbook, a
hung scheduler command. Each is bounded and nothing is done twice."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.ports import free_port
from support.stack import server_only
from support.waits import (
    run_in_thread,
    server_events,
    unique_run_name,
    wait_paused,
    wait_until,
)

from trainmedic.adapters.ansible import run_playbook
from trainmedic.adapters.scheduler.slurm import SlurmScheduler
from trainmedic.core.errors import PlaybookError, SchedulerError
from trainmedic.core.models import NodeState
from trainmedic.core.settings import get_settings
from trainmedic.stack import Stack


@pytest.fixture
def own_server(sim, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    """A server of this test's own (in the sim's home), so the test may restart it."""
    monkeypatch.setenv("TRAINMEDIC_SERVER_PORT", str(free_port()))
    get_settings.cache_clear()
    with server_only(get_settings()) as stack:
        yield stack


@pytest.mark.server
@pytest.mark.slow
def test_server_restart_while_paused_for_approval(own_server: Stack, sim, policy) -> None:
    policy(auto_approve_max=0, max_share=0.5)
    from flows.locate import LocateRequest, locate_faulty_nodes

    cluster, scheduler = sim
    cluster.inject("node002", "ecc")
    request = LocateRequest(
        nodes="node[001-004]",
        isolate=True,
        approval_timeout_s=300,
    )
    run_name = unique_run_name("locate-restart")
    # The fixture's settings context (this server's URL) is copied into the flow's thread.
    thread, box = run_in_thread(locate_faulty_nodes, request, run_name)
    run_id = wait_paused(run_name, timeout=120, box=box)

    own_server.server.stop()
    assert not own_server.healthy()
    own_server.start_server()

    from prefect.flow_runs import resume_flow_run

    resume_flow_run(run_id, run_input={"decision": "approve"})
    thread.join(timeout=120)
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert result.isolation.drained == ["node002"]  # type: ignore[attr-defined]
    drained = [n.name for n in scheduler.nodes() if n.state is NodeState.DRAINED]
    assert drained == ["node002"]
    from flows.tasks import server_state

    drains = [a for a in server_state().actions() if a.kind == "drain"]
    assert [a.target for a in drains] == ["node002"]  # drained exactly once, recorded on the server
    assert server_state().drain_record("node002") is not None


def test_hung_playbook_is_bounded_and_leaves_no_process(sim) -> None:
    cluster, _ = sim
    cluster.inject("node002", "down")  # the allgather with a dead peer hangs
    started = time.monotonic()
    with pytest.raises(PlaybookError, match="timed out"):
        run_playbook(
            "nccl_pair_test.yml",
            ["node001"],
            {
                "trainmedic_pair_hosts": ["node001", "node002"],
                "trainmedic_nccl_test_timeout_s": 600,
            },
            timeout_s=8,
        )
    assert time.monotonic() - started < 40

    def no_leftovers() -> bool:
        found = subprocess.run(
            ["pgrep", "-f", "all_gather_perf.*node002"], capture_output=True, text=True
        )
        return not found.stdout.split()

    wait_until(no_leftovers, 10, "no all_gather_perf process left for node002")


def test_hung_scheduler_command_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A slurmctld that never answers, as seen from its client tools.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("squeue", "sacct", "scontrol", "sinfo"):
        path = bin_dir / tool
        path.write_text("#!/bin/sh\nexec sleep 600\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    scheduler = SlurmScheduler(tmp_path / "root", timeout_s=2)
    started = time.monotonic()
    with pytest.raises(SchedulerError, match="no answer within 2s"):
        scheduler.nodes()
    assert time.monotonic() - started < 10


@pytest.mark.server
@pytest.mark.slow
def test_intake_outlives_a_server_outage_and_reports_each_failure_once(
    own_server: Stack, sim
) -> None:
    """The intake (the service `trainmedic up` starts) keeps polling through a server
    restart: the failure that happened meanwhile waits (status shows the lag and why) and
    reaches the server once, when it is back."""
    from trainmedic.adapters.intake import intake_status
    from trainmedic.core.models import JobSpec

    _, scheduler = sim
    settings = get_settings()
    own_server.intake.argv[-1] = "0.3"  # poll fast: the test waits on it
    own_server.intake.start(own_server.env)
    try:
        wait_until(lambda: intake_status(settings.home), 60, "the intake's first pass")
        own_server.server.stop()
        job = scheduler.submit(JobSpec(name="outage", nodes=1, steps=100_000))
        scheduler.inject_job_fault(job.job_id, "script")
        wait_until(
            lambda: (s := intake_status(settings.home)) and s.pending and s.errors_in_a_row >= 2,
            60,
            "the intake to record the failure it cannot send",
        )
        status = intake_status(settings.home)
        assert [p[0] for p in status.pending] == [job.job_id] and status.last_error
        assert own_server.intake.pid() is not None  # still there, retrying

        own_server.start_server()
        wait_until(lambda: not intake_status(settings.home).pending, 60, "the failure sent")
        assert intake_status(settings.home).last_error == ""

        def events() -> list[dict]:
            return server_events(f"trainmedic.job.{job.job_id}", own_server.api_url)

        wait_until(events, 30, "the event stored on the server")
        time.sleep(2 * 0.3 + 1)  # a few more passes: none may send it again
        assert [e["event"] for e in events()] == ["trainmedic.job.failed"]
    finally:
        own_server.intake.stop()


@pytest.mark.server
def test_two_clusters_on_one_server_lock_their_own_job_ids(
    prefect_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Job ids repeat across clusters (Slurm counts from 1 on each): cluster b's job 1001
    is not held up by cluster a's remediation of its own job 1001."""
    from flows.tasks import job_lock

    monkeypatch.setenv("TRAINMEDIC_CLUSTER", "cluster-a")
    get_settings.cache_clear()
    with job_lock("1001"):
        monkeypatch.setenv("TRAINMEDIC_CLUSTER", "cluster-b")
        get_settings.cache_clear()
        started = time.monotonic()
        with job_lock("1001", timeout_s=10):
            assert time.monotonic() - started < 10
    get_settings.cache_clear()
