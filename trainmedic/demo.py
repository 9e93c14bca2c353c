"""The README's demo: a local Prefect server, a simulated cluster, a training job, an
injected GPU fault, the failure event, and the triage run that the event triggers."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from trainmedic.core.errors import ServerError
from trainmedic.core.models import JobSpec, JobState
from trainmedic.core.settings import get_settings
from trainmedic.stack import Stack, apply_prefect_env

DEMO_STEPS = 1000
FAULT_AFTER_STEP = 120


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_demo(*, nodes: int = 16, fault: str = "xid79", stop: bool = False) -> int:
    started = time.monotonic()
    settings = get_settings()
    apply_prefect_env(settings)

    from trainmedic.adapters.scheduler.sim import SimScheduler
    from trainmedic.sim.cluster import SimCluster

    cluster = SimCluster(settings.sim_home)
    stack = Stack(settings)
    stack.down()
    cluster.create(nodes, inventory_dir=settings.inventory)
    (settings.sim_home / "scheduler.json").unlink(missing_ok=True)
    # The intake's record belongs to the cluster it watched: a new cluster, a new record.
    (settings.home / "intake.json").unlink(missing_ok=True)
    say(f"simulated cluster: {nodes} nodes, inventory {settings.inventory}/hosts.yml")

    say(f"starting Prefect server, deployments and worker at {stack.ui_url} ...")
    stack.up()
    _wait_for_intake(settings.home)
    say("stack ready: server, deployments, worker, the intake watching the scheduler")

    scheduler = SimScheduler(settings.sim_home)
    job = scheduler.submit(
        JobSpec(name="demo-pretrain", nodes=4, steps=DEMO_STEPS, checkpoint_every=50)
    )
    say(f"submitted job {job.job_id} on {', '.join(job.nodes)}")
    _wait_for_step(job.heartbeat_path, FAULT_AFTER_STEP)
    victim = job.nodes[2]
    cluster.inject(victim, fault, gpu=2)
    say(f"injected {fault} on {victim} GPU 2 (the hardware fault; nothing else is faked)")

    while not (job := scheduler.job(job.job_id)).state.finished:
        time.sleep(0.3)
    say(f"job {job.job_id} ended {job.state} (exit {job.exit_code}): {job.reason}")
    if job.state is JobState.COMPLETED:
        raise ServerError("the job was expected to fail")

    say("the intake reports the failure as an event; its trigger starts the triage runbook")

    run = _wait_for_triggered_run(job.job_id)
    say(f"triage run {run.name}: {stack.ui_url}/runs/flow-run/{run.id}")
    final = _wait_final(run.id)
    say(f"triage run {final.name} finished {final.state.name}")
    _print_outcome(scheduler, job.job_id)
    say(f"demo wall time: {time.monotonic() - started:.0f} s")
    if stop:
        _stop_jobs(scheduler)
        stack.down()
    else:
        say(f"the stack stays up: open the run above in {stack.ui_url}; `trainmedic down` stops it")
    return 0 if final.state.is_completed() else 1


def _wait_for_intake(home: Path, timeout_s: float = 120) -> None:
    """The intake's first pass takes failures already there as history: wait for it before
    the demo's job can fail."""
    from trainmedic.adapters.intake import intake_status

    deadline = time.monotonic() + timeout_s
    while intake_status(home) is None:
        if time.monotonic() > deadline:
            raise ServerError(f"the intake made no pass in {timeout_s:.0f} s (see run/intake.log)")
        time.sleep(0.3)


def _wait_for_step(heartbeat_path: str, step: int, timeout_s: float = 120) -> None:
    import json
    from pathlib import Path

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if json.loads(Path(heartbeat_path).read_text())["step"] >= step:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise ServerError(f"the demo job did not reach step {step} in {timeout_s:.0f} s")


def _wait_for_triggered_run(job_id: str, timeout_s: float = 90):  # type: ignore[no-untyped-def]
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["triage"]))
            )
            for run in runs:
                if run.parameters.get("request", {}).get("job_id") == job_id:
                    return run
            time.sleep(1)
    raise ServerError(f"no triage run was triggered for job {job_id} within {timeout_s:.0f} s")


def _wait_final(flow_run_id, timeout_s: float = 300):  # type: ignore[no-untyped-def]
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        last = None
        while time.monotonic() < deadline:
            run = client.read_flow_run(flow_run_id)
            if run.state and run.state.name != last:
                last = run.state.name
                say(f"  triage: {last}")
            if run.state and run.state.is_final():
                return run
            time.sleep(1)
    raise ServerError(f"triage run {flow_run_id} did not finish within {timeout_s:.0f} s")


def _print_outcome(scheduler, job_id: str) -> None:  # type: ignore[no-untyped-def]
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"triage-{job_id}"]))
        )
    if artifacts:
        print("\n" + str(artifacts[0].data), flush=True)
    for node in scheduler.nodes():
        if node.state == "DRAINED":
            say(f"drained: {node.name} ({node.reason})")


def _stop_jobs(scheduler) -> None:  # type: ignore[no-untyped-def]
    for job in scheduler.jobs():
        if not job.state.finished:
            scheduler.cancel(job.job_id, "demo finished")


if __name__ == "__main__":
    sys.exit(run_demo())
