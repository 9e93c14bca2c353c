"""Benchmark: how long a triage run waits to start, warm worker against a process per run.

    .venv/bin/python bench/runner_latency.py [--runs 8] [--burst 8] [--worker warm|process|both]

For each worker kind, on an embedded stack in a temporary home (server, `prefect deploy --all`,
the worker, as `trainmedic up` starts them): ``--runs`` ``job.failed`` events one after another
(each once the previous run has ended: a quiet system), then ``--burst`` events at once. Each
event names a job the scheduler never ran, so triage's real flow module runs and refuses it
(no action): the figures are orchestration and process start, not remediation. Per run, from
the server's own timestamps: event -> flow run created (the trigger), Pending -> Running
(the worker's process start up to the engine's first state), event -> Running, and the run's
length. Also the CPU seconds of the worker's process tree (worker, forkserver, their reaped
children). Figures are printed, never asserted."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from support.stack import embedded_stack  # noqa: E402
from support.waits import wait_until  # noqa: E402

from trainmedic.adapters.events import emit  # noqa: E402
from trainmedic.core.models import JobEvent  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def tree_cpu_s(pid: int) -> float:
    """User + system seconds of ``pid`` and its live descendants, reaped children included."""
    ticks = 100.0
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / ticks
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        todo += [int(k) for k in kids]
    return total


def triage_runs(job_ids: set[str]) -> list:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(limit=200)
    return [r for r in runs if r.parameters.get("request", {}).get("job_id") in job_ids]


def wait_final(job_ids: set[str]) -> list:
    def done() -> list | None:
        runs = triage_runs(job_ids)
        final = len(runs) == len(job_ids) and all(r.state and r.state.is_final() for r in runs)
        return runs if final else None

    return wait_until(done, 600, "every triage run ended", interval=0.5)


def timings(run, sent: dict[str, datetime]) -> dict[str, float]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        states = client.read_flow_run_states(run.id)
    at = {s.type.value: s.timestamp for s in states}
    event = sent[run.parameters["request"]["job_id"]]
    running = at.get("RUNNING")
    out = {
        "trigger": (run.created - event).total_seconds(),
        "state": run.state.type.value,
        "message": (run.state.message or "")[:160],
    }
    if running is not None:
        out["pending_running"] = (running - at.get("PENDING", running)).total_seconds()
        out["event_running"] = (running - event).total_seconds()
        out["length"] = (run.end_time - running).total_seconds() if run.end_time else 0.0
    return out


def send(first: int, n: int, api_url: str) -> dict[str, datetime]:
    """``n`` events for jobs ``first``.. (ids the simulated scheduler never gave)."""
    sent = {}
    for i in range(n):
        job_id = str(first + i)
        sent[job_id] = datetime.now(UTC)
        emit(JobEvent(kind="job.failed", job_id=job_id, exit_code=1), api_url=api_url)
    return sent


def summary(label: str, rows: list[dict[str, float]]) -> None:
    states = sorted({str(r["state"]) for r in rows})
    print(f"  {label}: {len(rows)} runs ({', '.join(states)}: {rows[0]['message']!r})")
    for key in ("trigger", "pending_running", "event_running", "length"):
        values = [float(r[key]) for r in rows if key in r]
        if values:
            print(
                f"    {key:16s} median {statistics.median(values):6.2f} s"
                f"  p95 {percentile(values, 0.95):6.2f} s  max {max(values):6.2f} s"
            )


def bench(kind: str, runs: int, burst: int) -> None:
    env = {"TRAINMEDIC_WARM_WORKER": "true" if kind == "warm" else "false"}
    with (
        tempfile.TemporaryDirectory(prefix="tm-runner-") as root,
        embedded_stack(Path(root), worker=True, nodes=2, env=env) as (_settings, stack),
    ):
        pid = stack.worker.pid()
        assert pid is not None, stack.worker.log_tail()
        time.sleep(3)  # the worker's own start (and the forkserver's imports) is not a run's
        cpu0, t0 = tree_cpu_s(pid), time.monotonic()
        quiet: list[dict[str, float]] = []
        for i in range(runs):
            sent = send(900_000 + i, 1, stack.api_url)
            quiet += [timings(r, sent) for r in wait_final(set(sent))]
        sent = send(910_000, burst, stack.api_url)
        loud = [timings(r, sent) for r in wait_final(set(sent))]
        cpu, wall = tree_cpu_s(pid) - cpu0, time.monotonic() - t0
    print(f"{kind} worker: {cpu:.1f} CPU s in the worker's tree over {wall:.0f} s")
    summary("one at a time", quiet)
    summary(f"burst of {burst}", loud)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--burst", type=int, default=8)
    parser.add_argument("--worker", choices=["warm", "process", "both"], default="both")
    args = parser.parse_args()
    for kind in ["process", "warm"] if args.worker == "both" else [args.worker]:
        bench(kind, args.runs, args.burst)


if __name__ == "__main__":
    main()
