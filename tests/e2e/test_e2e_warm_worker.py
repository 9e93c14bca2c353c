"""The stack's warm worker (adapters/warm_worker.py) with the real deployments: runs started
by a trigger and by hand are forks of the warm interpreter, a run paused for a human blocks
nothing, a run that dies is Crashed and the worker goes on serving, an approval resumes."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest
from support.stack import embedded_stack
from support.waits import wait_until

from trainmedic.adapters.events import emit
from trainmedic.adapters.scheduler.sim import SimScheduler
from trainmedic.adapters.warm_worker import WARM_START
from trainmedic.core.models import JobEvent, NodeState
from trainmedic.core.settings import Settings
from trainmedic.sim.cluster import SimCluster
from trainmedic.stack import Stack

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, Stack]]:
    # Every drain asks a human: each locate below pauses for its approval.
    env = {"TRAINMEDIC_WARM_WORKER": "true", "TRAINMEDIC_DRAIN_AUTO_APPROVE_MAX": "0"}
    with embedded_stack(tmp_path_factory.mktemp("warm"), worker=True, env=env) as running:
        yield running


def flow_run(run_id: UUID):  # type: ignore[no-untyped-def]
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


def wait_state(run_id: UUID, check: str, timeout: float = 120):  # type: ignore[no-untyped-def]
    def reached():  # type: ignore[no-untyped-def]
        run = flow_run(run_id)
        return run if run.state is not None and getattr(run.state, check)() else None

    return wait_until(reached, timeout, f"flow run {run_id} {check}", interval=0.5)


def run_log(run_id: UUID) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    return [log.message for log in logs]


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def locate(nodes: str) -> UUID:
    from prefect.deployments import run_deployment

    request = {"nodes": nodes, "isolate": True, "approval_timeout_s": 600}
    run = run_deployment(
        "locate-faulty-nodes/locate-faulty-nodes", parameters={"request": request}, timeout=0
    )
    return run.id


def test_paused_crashed_and_cancelled_runs_block_nothing_and_an_approval_resumes(
    stack, capsys
) -> None:
    from trainmedic.cli.main import main

    settings, embedded = stack
    cluster, scheduler = SimCluster(settings.sim_home), SimScheduler(settings.sim_home)
    cluster.inject("node003", "xid79")
    cluster.inject("node007", "xid79")
    kept, doomed = locate("node[001-004]"), locate("node[005-008]")
    kept_run, doomed_run = wait_state(kept, "is_paused"), wait_state(doomed, "is_paused")

    # Each run is its own process, a child of the forkserver the worker started.
    worker = embedded.worker.pid()
    assert worker is not None
    for run in (kept_run, doomed_run):
        pid = int(run.infrastructure_pid)
        assert parent(parent(pid)) == worker
        # A fork, not a new interpreter: the forkserver's command line, not prefect.engine's.
        cmdline = Path(f"/proc/{pid}/cmdline").read_text()
        assert cmdline == Path(f"/proc/{parent(pid)}/cmdline").read_text()
        assert "forkserver" in cmdline
        assert WARM_START % (pid, parent(pid)) in run_log(run.id)

    # A run that dies (the kernel's OOM killer, say) is Crashed; the worker goes on.
    os.kill(int(doomed_run.infrastructure_pid), signal.SIGKILL)
    assert wait_state(doomed, "is_crashed").state.is_crashed()
    assert embedded.worker.pid() == worker

    # With one run paused and one crashed, an event's triage still runs, warm, to its end
    # (a job the scheduler never ran: triage refuses it, nothing is done).
    emit(JobEvent(kind="job.failed", job_id="987654", exit_code=1), api_url=embedded.api_url)

    def triage():  # type: ignore[no-untyped-def]
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs()
        return next(
            (
                r
                for r in runs
                if r.parameters.get("request", {}).get("job_id") == "987654"
                and r.state is not None
                and r.state.is_final()
            ),
            None,
        )

    triaged = wait_until(triage, 120, "the triage run of the event")
    assert "JobNotFound" in (triaged.state.message or "")
    assert any(m.startswith("started in pid ") for m in run_log(triaged.id))
    assert flow_run(kept).state.is_paused()

    # Cancelled from the CLI: the worker stops that run's process, the run is Cancelled.
    unwanted = wait_state(locate("node[005-008]"), "is_paused")
    assert main(["cancel", unwanted.name, "--reason", "not needed", "--by", "dana"]) == 0
    assert wait_state(unwanted.id, "is_cancelled").state.is_cancelled()
    gone = Path(f"/proc/{unwanted.infrastructure_pid}")
    wait_until(lambda: not gone.exists() or "Z" in gone.joinpath("stat").read_text(), 30, "gone")

    # The human answers; the paused run resumes in its process and drains what it found.
    assert main(["approve", str(kept), "--reason", "ticket 7", "--by", "dana"]) == 0
    assert wait_state(kept, "is_completed").state.is_completed()
    drained = {n.name for n in scheduler.nodes() if n.state is NodeState.DRAINED}
    assert drained == {"node003"}
