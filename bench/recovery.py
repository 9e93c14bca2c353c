"""Recovery benchmark: event-to-resubmission latency and steps lost, per scenario.

On an embedded stack (Prefect server, deployments with event triggers, a process worker, the
simulated cluster) each scenario runs --repeat times:

- hardware: Xid 79 on one node; the job fails; the intake reports it; triage resubmits.
- loss_spike: a poisoned data batch; the framework reports the spike; rollback resubmits.
- hang: the job stops making progress; the watchdog detects it; triage resubmits.

"lost" is the steps redone after the restart: last step reached minus the step resumed from.
"ideal" is the least any restart could lose with this checkpoint cadence: for a failure the
steps since the newest checkpoint, for a spike the steps from the newest checkpoint before the
spike (the diverged steps after it are lost whatever one does). Ratios, not absolute times,
are the point: this machine is shared.

    .venv/bin/python bench/recovery.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

CHECKPOINT_EVERY = 20


def heartbeat_step(job) -> int:  # type: ignore[no-untyped-def]
    try:
        return int(json.loads(Path(job.heartbeat_path).read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def wait(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


class Bench:
    def __init__(self, stack, scheduler, cluster, intake, hang_timeout: float) -> None:  # type: ignore[no-untyped-def]
        self.stack, self.scheduler, self.cluster = stack, scheduler, cluster
        self.intake, self.hang_timeout = intake, hang_timeout

    def fresh_job(self, name: str):  # type: ignore[no-untyped-def]
        from trainmedic.core.models import JobSpec

        for job in self.scheduler.jobs():
            if not job.state.finished:
                self.scheduler.cancel(job.job_id, "next scenario")
        for node in self.cluster.names():
            if self.cluster.status(node).fault != "healthy":
                self.cluster.repair(node)
            self.scheduler.resume(node)
        return self.scheduler.submit(
            JobSpec(name=name, nodes=2, steps=100_000, checkpoint_every=CHECKPOINT_EVERY)
        )

    def wait_step(self, job, step: int) -> None:  # type: ignore[no-untyped-def]
        wait(lambda: heartbeat_step(job) >= step, 60, f"job {job.job_id} at step {step}")

    def resubmission(self, job_id: str):  # type: ignore[no-untyped-def]
        def found():  # type: ignore[no-untyped-def]
            return next((j for j in self.scheduler.jobs() if j.resubmission_of == job_id), None)

        return wait(found, 180, f"resubmission of {job_id}")

    def hardware(self, i: int) -> tuple[float, int, int]:
        """Xid 79 on one node; the intake reports the failure; triage resubmits."""
        from trainmedic.adapters import checkpoints

        job = self.fresh_job(f"hw{i}")
        self.wait_step(job, 70 + 7 * i)
        self.cluster.inject(job.nodes[1], "xid79")
        wait(lambda: self.scheduler.job(job.job_id).state.finished, 60, "failure")
        failed = self.scheduler.job(job.job_id)
        last = heartbeat_step(failed)
        sent = time.time()
        self.intake.poll()
        new = self.resubmission(job.job_id)
        newest = checkpoints.newest_valid(checkpoints.scan(Path(failed.checkpoint_dir)))
        return (
            new.submitted_at.timestamp() - sent,
            last - (new.spec.resume_from_step or 0),
            last - newest.step,
        )

    def loss_spike(self, i: int) -> tuple[float, int, int]:
        """A poisoned data batch; the framework reports the spike; rollback resubmits."""
        from trainmedic.adapters.events import emit
        from trainmedic.core.models import JobEvent

        job = self.fresh_job(f"spike{i}")
        bad = 90 + 7 * i
        self.scheduler.inject_job_fault(job.job_id, "spike", batch=bad)
        self.wait_step(job, bad + 5)
        last = heartbeat_step(job)
        sent = time.time()
        emit(
            JobEvent(kind="job.loss_spike", job_id=job.job_id, step=last),
            api_url=self.stack.api_url,
        )
        new = self.resubmission(job.job_id)
        ideal = bad - CHECKPOINT_EVERY * ((bad - 1) // CHECKPOINT_EVERY)
        return (new.submitted_at.timestamp() - sent, last - (new.spec.resume_from_step or 0), ideal)

    def hang(self, i: int) -> tuple[float, int, int]:
        """The job stops without a word; the watchdog finds it; triage resubmits."""
        from flows.watchdog import WatchdogRequest, watchdog

        job = self.fresh_job(f"hang{i}")
        self.wait_step(job, 50 + 7 * i)
        self.scheduler.inject_job_fault(job.job_id, "hang")
        time.sleep(0.3)
        last = heartbeat_step(job)
        hung_at = time.time()
        wait(lambda: watchdog(WatchdogRequest()), 4 * self.hang_timeout, "hang detection")
        new = self.resubmission(job.job_id)
        return (
            new.submitted_at.timestamp() - hung_at,
            last - (new.spec.resume_from_step or 0),
            last - CHECKPOINT_EVERY * (last // CHECKPOINT_EVERY),
        )


def environment(hang_timeout: float) -> dict[str, str]:
    return {
        "TRAINMEDIC_HANG_TIMEOUT_S": str(hang_timeout),
        "TRAINMEDIC_SIM_STEP_SECONDS": "0.05",
        "TRAINMEDIC_SIM_TEST_SECONDS": "0.2",
        "TRAINMEDIC_DRAIN_MAX_PER_HOUR": "100",
        "TRAINMEDIC_DRAIN_MIN_DRAINABLE": "16",
        "TRAINMEDIC_BREAKER_LIMIT": "1000",
    }


def report(rows: dict[str, list[tuple[float, int, int]]], repeat: int, hang_timeout: float) -> None:
    print(
        f"\nrecovery benchmark: {repeat} runs per scenario, checkpoint every "
        f"{CHECKPOINT_EVERY} steps, hang timeout {hang_timeout:g} s"
    )
    print(
        "| scenario | latency median s | latency max s | steps lost (median) | ideal (median) "
        "| lost / ideal |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, values in rows.items():
        latency = [v[0] for v in values]
        lost = statistics.median(v[1] for v in values)
        ideal = statistics.median(v[2] for v in values)
        print(
            f"| {name} | {statistics.median(latency):.1f} | {max(latency):.1f} | {lost:g} | "
            f"{ideal:g} | {lost / ideal if ideal else float('nan'):.2f} |"
        )
    print(
        "\nlatency: event sent (hang: progress stopped) to the job's resubmission; for the "
        "hang it includes detection, bounded by 2x the hang timeout."
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hang-timeout", type=float, default=6.0)
    args = parser.parse_args()
    from support.stack import embedded_stack

    from trainmedic.adapters.events import emit
    from trainmedic.adapters.intake import Intake
    from trainmedic.adapters.scheduler.sim import SimScheduler
    from trainmedic.sim.cluster import SimCluster

    root = Path(tempfile.mkdtemp(prefix="trainmedic-bench-"))
    started = time.monotonic()
    with embedded_stack(root, worker=True, nodes=32, env=environment(args.hang_timeout)) as (
        settings,
        stack,
    ):
        print(f"stack up in {time.monotonic() - started:.0f} s", file=sys.stderr)
        scheduler = SimScheduler(settings.sim_home)
        cluster = SimCluster(settings.sim_home)
        intake = Intake(scheduler, settings.home, lambda e: emit(e, api_url=stack.api_url))
        intake.poll()
        bench = Bench(stack, scheduler, cluster, intake, args.hang_timeout)
        rows: dict[str, list[tuple[float, int, int]]] = {
            "hardware": [],
            "loss_spike": [],
            "hang": [],
        }
        for i in range(args.repeat):
            rows["hardware"].append(bench.hardware(i))
            rows["loss_spike"].append(bench.loss_spike(i))
            rows["hang"].append(bench.hang(i))
    report(rows, args.repeat, args.hang_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
