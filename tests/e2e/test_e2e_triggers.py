"""Event → deployment trigger → worker → runbook → scheduler, with nothing in between faked:
the embedded stack (Prefect server, `prefect deploy --all`, a process worker, the simulated
DCGM exporter) in a temporary home, the intake, and jobs on the simulated cluster."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import UUID

import pytest
from support.stack import DATABASE_URL_ENV, embedded_stack, fresh_database
from support.waits import wait_finished, wait_step, wait_until

from trainmedic.adapters import checkpoints
from trainmedic.adapters.events import emit
from trainmedic.adapters.intake import Intake
from trainmedic.adapters.scheduler.sim import SimScheduler
from trainmedic.core.models import JobEvent, JobInfo, JobSpec, JobState, NodeState
from trainmedic.core.settings import Settings
from trainmedic.sim.cluster import SimCluster
from trainmedic.stack import Stack

pytestmark = [pytest.mark.server, pytest.mark.slow]
LATENCIES: list[float] = []

# On PostgreSQL only the event path under concurrent flow runs (trigger, duplicates and
# replays): that is where the backends differ, and the whole module twice costs CI ~95 s more.
POSTGRESQL_TESTS = {
    "test_failure_event_triggers_triage_and_resubmission",
    "test_duplicate_events_remediate_once",
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "stack" not in metafunc.fixturenames:
        return
    backends = [pytest.param("sqlite", id="sqlite")]
    if metafunc.function.__name__ in POSTGRESQL_TESTS:
        backends.append(
            pytest.param(
                "postgresql",
                id="postgresql",
                marks=pytest.mark.skipif(
                    not os.environ.get(DATABASE_URL_ENV),
                    reason=f'{DATABASE_URL_ENV} is not set (eval "$(scripts/postgres.sh up)")',
                ),
            )
        )
    metafunc.parametrize("stack", backends, indirect=True, scope="module")


@pytest.fixture(scope="module")
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Settings, Stack]]:
    backend: str = request.param
    root = tmp_path_factory.mktemp(f"e2e-{backend}")
    env = {
        "TRAINMEDIC_VERIFY_TIMEOUT_S": "60",
        "TRAINMEDIC_HANG_TIMEOUT_S": "6",
        # The scenarios share one cluster and one server: the same few nodes are drained again
        # and again, and would be lemons by the third scenario (lemons: the flow tier's tests).
        "TRAINMEDIC_LEMON_DRAINS": "100",
    }
    LATENCIES.clear()
    with contextlib.ExitStack() as resources:
        database = None
        if backend == "postgresql":
            database = resources.enter_context(
                fresh_database(os.environ[DATABASE_URL_ENV], prefix="prefect_e2e")
            )
        yield resources.enter_context(
            embedded_stack(root, worker=True, database_url=database, env=env)
        )
    if LATENCIES:
        print(
            f"\nevent-to-resubmission latency ({backend}): "
            f"median {statistics.median(LATENCIES):.1f} s "
            f"over {len(LATENCIES)} runs: {[round(x, 1) for x in LATENCIES]}"
        )


def wait_resubmission(scheduler: SimScheduler, job_id: str, timeout: float = 120) -> JobInfo:
    def resubmitted() -> JobInfo | None:
        return next((j for j in scheduler.jobs() if j.resubmission_of == job_id), None)

    return wait_until(resubmitted, timeout, f"job {job_id} resubmitted", interval=0.5)


def wait_runbooks_idle(timeout: float = 180) -> None:
    """Let the runbooks an earlier scenario started finish before its jobs are cleared away."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    busy = FlowRunFilter(
        state=FlowRunFilterState(
            type=FlowRunFilterStateType(
                any_=[StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING]
            )
        )
    )

    def idle() -> bool:
        from datetime import UTC, datetime

        now = datetime.now(UTC)
        with get_client(sync_client=True) as client:
            flows = {f.id: f.name for f in client.read_flows()}
            runs = client.read_flow_runs(flow_run_filter=busy)
        # Scheduled deployments' runs due later (fleet report, watchdog) are not work.
        due = [
            r
            for r in runs
            if not (r.state and r.state.is_scheduled())
            or (r.expected_start_time is not None and r.expected_start_time <= now)
        ]
        return not [r for r in due if flows.get(r.flow_id) != "watchdog"]

    wait_until(idle, timeout, "every runbook finished", interval=1)


def run_job(settings: Settings, name: str, **spec: object) -> tuple[SimScheduler, JobInfo]:
    """Each scenario starts on a healthy cluster: earlier faults repaired, drains resumed."""
    wait_runbooks_idle()
    scheduler = SimScheduler(settings.sim_home)
    cluster = SimCluster(settings.sim_home)
    for earlier in scheduler.jobs():  # free the nodes that earlier scenarios' jobs hold
        if not earlier.state.finished:
            scheduler.cancel(earlier.job_id, "next scenario")
    for node in cluster.names():
        cluster.repair(node)
        scheduler.resume(node)
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


def test_a_failure_the_server_accepted_but_never_ran_is_reported_again(stack) -> None:
    """Accepted is not answered: under a burst, Prefect's server gives up on an automation's
    action after its client's retries (``prefect.automation.action.failed``) and no run
    starts. Here the trigger is off while the event arrives: the same silence. The intake
    reports the failure again once its grace is over, and that event is remediated."""
    from prefect.automations import Automation
    from prefect.client.orchestration import get_client

    from trainmedic.cli.intake import taken_up_by_runbook

    settings, embedded = stack
    with get_client(sync_client=True) as client:
        found = [a for a in client.read_automations() if a.name == "job-failed-triage"]
    assert len(found) == 1, [a.name for a in found]
    trigger = Automation.read(id=found[0].id)
    scheduler, job = run_job(settings, "dropped", nodes=1)
    intake = Intake(
        scheduler,
        settings.home,
        lambda e: emit(e, api_url=embedded.api_url),
        taken_up=taken_up_by_runbook(settings),
        # past the 3 s without a trigger, and 3 s more: the trigger is on again well before
        redeliver_after_s=6,
    )
    intake.poll()  # baseline pass
    wait_step(job, 5)
    trigger.disable()
    try:
        scheduler.inject_job_fault(job.job_id, "dataloader")
        wait_finished(scheduler, job.job_id)
        assert [e.kind for e in intake.poll()] == ["job.failed"]
        time.sleep(3)
        assert not [j for j in scheduler.jobs() if j.resubmission_of == job.job_id]
        assert intake.run_pass().redelivered == []  # within its grace
    finally:
        trigger.enable()

    def reported_again() -> list[JobEvent]:
        return intake.run_pass().redelivered

    again = wait_until(reported_again, 30, "the failure reported again", interval=1)
    assert [e.job_id for e in again] == [job.job_id]
    wait_resubmission(scheduler, job.job_id)
    wait_runbooks_idle()
    assert intake.run_pass().redelivered == []  # taken up now, and only ever once


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
    # Every run the three events started has ended: a second remediation would have acted.
    wait_runbooks_idle()
    assert [j.job_id for j in scheduler.jobs() if j.resubmission_of == job.job_id] == [new.job_id]
    # The trigger's window (prefect.yaml `within`) dropped the second source's report of the
    # same failure: one run, not two (the replay never reached the trigger: same event id).
    assert len(triage_runs_of(failed.job_id)) == 1


def triage_runs_of(job_id: str) -> list[object]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["triage"])))
    return [r for r in runs if r.parameters.get("request", {}).get("job_id") == job_id]


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
    # Detection within 2x the timeout follows from this: the first watchdog pass after the
    # timeout finds the hang, none before it does (no wall-clock bound asserted here).
    heartbeat = Path(job.heartbeat_path)
    assert watchdog(WatchdogRequest()) == []  # hung for less than the timeout: not yet
    wait_until(lambda: time.time() - heartbeat.stat().st_mtime >= 6.5, 30, "hang timeout")
    findings = watchdog(WatchdogRequest())
    assert [f.job_id for f in findings] == [job.job_id]
    new = wait_resubmission(scheduler, job.job_id)
    assert scheduler.job(job.job_id).state is JobState.CANCELLED
    assert new.spec.resume_from_step is not None


def test_a_stale_event_through_the_trigger_starts_no_remediation(stack) -> None:
    """The trigger hands triage the event's time; an event two hours old (the limit is one)
    ends its run as stale: no drain, no resubmission, the run Completed with why."""
    from datetime import UTC, datetime, timedelta

    from prefect.client.orchestration import get_client

    settings, embedded = stack
    cluster = SimCluster(settings.sim_home)
    scheduler, job = run_job(settings, "stale", nodes=2)
    wait_step(job, 30)
    cluster.inject(job.nodes[1], "xid79")
    failed = wait_finished(scheduler, job.job_id)
    old = datetime.now(UTC) - timedelta(hours=2)
    event = JobEvent(kind="job.failed", job_id=failed.job_id, exit_code=1, occurred=old)
    emit(event, api_url=embedded.api_url)

    def finished_triage() -> object:
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs()
        return next(
            (
                r
                for r in runs
                if r.parameters.get("request", {}).get("job_id") == failed.job_id
                and r.state is not None
                and r.state.is_final()
            ),
            None,
        )

    run = wait_until(finished_triage, 120, "the triage run of the stale event")
    assert run.state.is_completed()
    assert run.parameters["request"]["occurred"].startswith(old.date().isoformat())
    assert not [n for n in scheduler.nodes() if n.state is NodeState.DRAINED]
    assert not [j for j in scheduler.jobs() if j.resubmission_of == failed.job_id]


def test_locate_isolate_from_the_cli_runs_through_its_deployment(stack, capsys) -> None:
    """`trainmedic locate --isolate` drains on the worker, through the deployment (where the
    policy and the guard are the installation's), not in the CLI's process."""
    from prefect.client.orchestration import get_client

    from trainmedic.cli.main import main

    settings, _ = stack
    scheduler, job = run_job(settings, "bystander", nodes=1)
    scheduler.cancel(job.job_id, "free the nodes")
    SimCluster(settings.sim_home).inject("node003", "xid79")
    assert main(["locate", "--isolate", "--json", "node[001-004]"]) == 0
    printed = json.loads(capsys.readouterr().out)
    drained = {n.name: n.reason for n in scheduler.nodes() if n.state is NodeState.DRAINED}
    assert list(drained) == ["node003"] and "locate-faulty-nodes" in drained["node003"]
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(printed["flow_run_id"]))
    # The CLI's run is its deployment's, started on the worker (other tests' locates may be
    # subflows of triage on this shared server: they are not what this test asks about).
    assert run.deployment_id is not None and run.parameters["request"]["isolate"] is True


def test_runbook_commands_exit_by_what_the_run_did(stack, capsys) -> None:
    """0 when the runbook did what was asked (read from the run's persisted result), 4 when
    it completed but refused or left it to a human, 2 before any run for an unknown job."""
    from trainmedic.cli.main import main

    settings, _ = stack
    scheduler, job = run_job(settings, "cli", nodes=2)
    wait_step(job, 30)
    SimCluster(settings.sim_home).inject(job.nodes[1], "xid79")
    failed = wait_finished(scheduler, job.job_id)
    assert main(["triage", failed.job_id, "--json"]) == 0  # drained, resubmitted, verified
    new = next(j for j in scheduler.jobs() if j.resubmission_of == failed.job_id)
    assert main(["triage", failed.job_id]) == 4  # a replay now: not handled, nothing done
    # The history, newest first, with each run's outcome read from its persisted result.
    capsys.readouterr()
    assert main(["runs", "--job", failed.job_id, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["runbook"] for r in rows] == ["triage", "triage"]
    replay, first = rows
    assert f"drained {job.nodes[1]}" in first["outcome"]
    assert f"resubmitted as {new.job_id}" in first["outcome"]
    assert "human: " in replay["outcome"] and first["started"] < replay["started"]
    assert main(["triage", "99999"]) == 2

    idle = next(n.name for n in scheduler.nodes() if n.state is NodeState.IDLE)
    scheduler.admin_drain(idle, "fan replacement")
    assert main(["restore", idle]) == 4  # refused: not trainmedic's drain
    assert {n.name: n.state for n in scheduler.nodes()}[idle] is NodeState.DRAINED


def test_save_and_stop_and_cancel_from_the_cli(stack) -> None:
    """A planned stop saves a checkpoint on request before stopping (nothing lost); a
    runbook run not wanted any more is cancelled by name, with who and why."""
    from datetime import UTC, datetime, timedelta

    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    from trainmedic.cli.main import main

    settings, _ = stack
    scheduler, job = run_job(settings, "planned", nodes=1)
    wait_step(job, 25)
    assert main(["save-and-stop", job.job_id, "--reason", "maintenance", "--json"]) == 0
    assert scheduler.job(job.job_id).state is JobState.CANCELLED
    newest, _ = checkpoints.newest_valid_in(
        Path(job.checkpoint_dir), run_id=job.spec.run_id, deep=False
    )
    assert newest is not None and newest.step > 25

    later = datetime.now(UTC) + timedelta(hours=1)
    run = run_deployment(
        "watchdog/watchdog", parameters={"request": {}}, scheduled_time=later, timeout=0
    )
    assert main(["cancel", run.name, "--reason", "not needed", "--by", "dana"]) == 0
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run.id).state
    assert state.name in ("Cancelling", "Cancelled") and "dana: not needed" in state.message
    assert main(["cancel", "no-such-run"]) == 2


def test_an_owner_notice_from_a_real_triage_reaches_the_receiver(stack) -> None:
    """On-call's receiver behind `trainmedic notify`: a script error's triage, started by
    its trigger, tells the owner through the automation, with what to do."""
    from prefect.automations import Automation
    from support.receiver import Receiver, receiving

    from trainmedic.adapters.notifications import AUTOMATION_NAME, PAGE_AUTOMATION_NAME, install

    settings, embedded = stack
    with receiving() as url:
        install(block_name="oncall", webhook_url=url)
        try:
            scheduler, job = run_job(settings, "owned", nodes=1)
            wait_step(job, 5)
            scheduler.inject_job_fault(job.job_id, "script")
            failed = wait_finished(scheduler, job.job_id)
            event = JobEvent(kind="job.failed", job_id=failed.job_id, exit_code=1)
            emit(event, api_url=embedded.api_url)

            def told() -> list[dict]:
                return [p for p in Receiver.posts if "owner.notify" in p["subject"]]

            (notice,) = wait_until(told, 120, "the owner's notice at the receiver", interval=1)
        finally:
            for name in (AUTOMATION_NAME, PAGE_AUTOMATION_NAME):
                Automation.read(name=name).delete()
    assert notice["subject"] == f"trainmedic owner.notify: job {failed.job_id} ScriptError"
    assert "KeyError" in notice["text"] and "fix the script" in notice["text"]


def _paused_run(flow_name: str, alive: Callable[[], bool], timeout: float = 120) -> str:
    """The name of the one paused run of ``flow_name`` (a CLI-started run's name is the
    server's to choose); ``alive``: whether the command that started it still waits (if it
    ended, the run ended without pausing)."""
    from prefect.client.orchestration import get_client

    def paused() -> str | None:
        assert alive(), f"the {flow_name} run ended without asking for approval"
        with get_client(sync_client=True) as client:
            flows = {f.id: f.name for f in client.read_flows()}
            runs = [r for r in client.read_flow_runs() if flows.get(r.flow_id) == flow_name]
        found = [r.name for r in runs if r.state is not None and r.state.is_paused()]
        return found[0] if found else None

    return wait_until(paused, timeout, f"a paused {flow_name} run", interval=1)


def test_node_lifecycle_fault_drain_repair_burn_in_return_then_inspection(stack, capsys) -> None:
    """Fault → triage drains the node → `trainmedic repair` (its deployment, on the worker)
    asks on-call, who approves from the CLI → GPU reset → burn-in → back in service. The same
    fault again → hardware inspection: never returned, `repair` and `restore` exit 4."""
    import contextvars
    import threading

    from trainmedic.cli.main import main
    from trainmedic.sim.hardware import NodeFault

    settings, _ = stack
    cluster = SimCluster(settings.sim_home)
    scheduler, job = run_job(settings, "lifecycle", nodes=2)
    wait_step(job, 30)
    node = job.nodes[1]
    cluster.inject(node, "ecc", gpu=2)
    failed = wait_finished(scheduler, job.job_id)
    assert main(["triage", failed.job_id]) == 0
    assert {n.name: n.state for n in scheduler.nodes()}[node] is NodeState.DRAINED

    codes: list[int] = []
    # In a copy of this thread's context: the stack's API URL lives in Prefect's settings
    # context here, which a bare new thread would not see (it would ask another server).
    repair = threading.Thread(
        target=contextvars.copy_context().run,
        args=(lambda: codes.append(main(["repair", node, "--json"])),),
    )
    repair.start()
    asking = _paused_run("repair-node", repair.is_alive)
    assert main(["approve", asking, "--by", "carol", "--reason", "reset GPU 2"]) == 0
    repair.join(timeout=300)
    assert codes == [0]
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{") :])["result"]
    assert result["repair"] == "reset_gpu" and result["fault"] == "Xid 48"
    assert result["decided_by"] == "approved by carol: reset GPU 2"
    assert result["restored"] and "dcgmi diag -r 2 and the pair test" in result["restore"]["reason"]
    assert cluster.status(node).fault is NodeFault.healthy
    assert {n.name: n.state for n in scheduler.nodes()}[node] is NodeState.IDLE

    # The same fault again: drained by a locate this time, and the repair escalates.
    cluster.inject(node, "ecc", gpu=2)
    for running in scheduler.jobs():  # the resubmission: free its nodes for the pair tests
        if not running.state.finished:
            scheduler.cancel(running.job_id, "free the nodes")
    idle = [n.name for n in scheduler.nodes() if n.state is NodeState.IDLE and n.name != node]
    assert main(["locate", "--isolate", ",".join([node, *idle[:3]])]) == 0
    assert {n.name: n.state for n in scheduler.nodes()}[node] is NodeState.DRAINED
    capsys.readouterr()
    assert main(["repair", node, "--json"]) == 4  # done, but a human must act
    result = json.loads(capsys.readouterr().out)["result"]
    assert result["inspection"] and result["escalated"] and not result["repaired"]
    assert main(["restore", node]) == 4
    assert {n.name: n.state for n in scheduler.nodes()}[node] is NodeState.DRAINED
