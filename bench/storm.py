"""Benchmark: a leaf switch dies under running jobs, and their events arrive as a storm.

    .venv/bin/python bench/storm.py [--json] [--backend sqlite|postgresql|both]

On an embedded stack in a temporary home (Prefect server, the deployments, the worker, as the
e2e tests bring it up): 64 simulated one-GPU nodes behind 8 leaf switches (8 each), 50 jobs
running: 6 two-node jobs that each span leaf03 and leaf04, and 44 one-node jobs (two of them
behind leaf03: a one-node job needs no fabric and survives). Then leaf03 dies: its nodes lose
their fabric link, and the 6 two-node jobs fail with NCCL timeouts on every rank, naming no
origin. Each failed job's events go out in one shuffled burst from 8 threads (the scheduler's
``job.failed``, its replay, ``job.node_fail`` from a second source and a re-detection: 4
each, as bench/burst.py sends them), and the benchmark waits until every failed job is
resubmitted and every triage run has ended.

It prints (``--json``: one object per backend) ``jobs`` (failed in the storm), ``incidents``
(incident records of more than one job), ``resubmitted_once``, ``resubmitted_twice``, ``lost``
(failed jobs never resubmitted, plus events that started no run), ``placed_on_bad_node``
(resubmissions placed behind the dead switch), ``first_event_to_last_resubmit_s``,
``median_s`` and ``p95_s`` (a job's first event to its resubmission), and the triage runs by
state. Figures are printed, never asserted; exit status 1 when a job was not resubmitted
exactly once, was placed behind the dead switch, or an event was lost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from burst import (  # noqa: E402
    _step,
    _wait,
    burst_events,
    dropped_actions,
    environment,
    percentile,
    send_burst,
    set_worker_limit,
    triage_runs,
    trigger_window_s,
    unrun,
    wait_settled,
)
from support.stack import DATABASE_URL_ENV, embedded_stack, fresh_database  # noqa: E402

from trainmedic.adapters.events import to_prefect_event  # noqa: E402
from trainmedic.adapters.scheduler.sim import SimScheduler  # noqa: E402
from trainmedic.adapters.server_state import ServerState  # noqa: E402
from trainmedic.core.models import JobInfo, JobSpec, JobState  # noqa: E402
from trainmedic.sim.cluster import SimCluster  # noqa: E402

DEAD_SWITCH = "leaf03"
SPANNING = 6  # two-node jobs across leaf03 and leaf04
IDLE = 8


def submit_jobs(args: argparse.Namespace, scheduler: SimScheduler) -> list[JobInfo]:
    """The storm's layout, placed exactly (a job excludes every node but its own)."""
    names = sorted(n.name for n in scheduler.nodes())
    leaf3, leaf4 = names[16:24], names[24:32]
    pairs = [{leaf3[i], leaf4[i]} for i in range(SPANNING)]
    used = set().union(*pairs)
    singles = [n for n in names if n not in used][: args.jobs - SPANNING]
    if len(names) - len(used) - len(singles) < IDLE:
        raise SystemExit("storm: the layout needs 64 nodes (8 of them idle)")

    def place(name: str, nodes: set[str]) -> JobInfo:
        spec = JobSpec(
            name=name,
            nodes=len(nodes),
            gpus_per_node=1,
            steps=args.steps,
            checkpoint_every=5,
            exclude=tuple(n for n in names if n not in nodes),
        )
        return scheduler.submit(spec)

    jobs = [place(f"span{i}", pair) for i, pair in enumerate(pairs)]
    jobs += [place(f"solo{i:02d}", {node}) for i, node in enumerate(singles)]
    assert all(j.state is JobState.RUNNING for j in jobs), "a job did not start"
    return jobs


def run_backend(backend: str, args: argparse.Namespace, database_url: str | None) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"storm-{backend}-"))
    started = time.monotonic()
    with embedded_stack(
        root,
        worker=True,
        nodes=64,
        gpus_per_node=1,
        database_url=database_url,
        env={
            **environment(args),
            # --no-incidents: every failure handled on its own, as before incidents (a baseline).
            **({"TRAINMEDIC_INCIDENT_WINDOW_S": "0"} if args.no_incidents else {}),
        },
    ) as (settings, stack):
        set_worker_limit(stack.env, args.worker_limit)
        print(f"[{backend}] stack up in {time.monotonic() - started:.0f} s ({root})", flush=True)
        os.environ["TRAINMEDIC_CLUSTER"] = settings.cluster
        cluster = SimCluster(settings.sim_home)
        scheduler = SimScheduler(settings.sim_home)
        jobs = submit_jobs(args, scheduler)
        _wait(lambda: all(_step(j) >= 7 for j in jobs), 180, "jobs never reached step 7")
        dead = set(cluster.fail_switch(DEAD_SWITCH))
        spanning = jobs[:SPANNING]
        _wait(
            lambda: all(scheduler.job(j.job_id).state.finished for j in spanning),
            120,
            "the jobs behind the dead switch never failed",
        )
        failed = [scheduler.job(j.job_id) for j in spanning]
        survivors = [j for j in jobs[SPANNING:] if scheduler.job(j.job_id).state.finished]
        events = burst_events(failed, args.seed)
        distinct = len({to_prefect_event(e)["id"] for e in events})
        burst_at = time.time()
        first_sent = send_burst(events, stack.api_url)
        ids = {j.job_id for j in failed}
        settled = wait_settled(backend, scheduler, ids, events, args.timeout)
        time.sleep(args.quiet_s)  # a second (wrong) resubmission would come from a late run
        seen = triage_runs()
        runs = Counter(r.state for r in seen.values())
        dropped, dropped_jobs = dropped_actions(stack.api_url, burst_at)
        lost_events, superseded, windowed, behind_dropped = unrun(
            events, seen, trigger_window_s(), dropped_jobs
        )
        copies = Counter(dict.fromkeys(ids, 0))
        firsts: dict[str, float] = {}
        placed_bad = 0
        for job in sorted(scheduler.jobs(), key=lambda j: j.submitted_at):
            if job.resubmission_of in ids:
                copies[job.resubmission_of] += 1
                firsts.setdefault(job.resubmission_of, job.submitted_at.timestamp())
                placed_bad += bool(set(job.nodes) & dead)
        incidents = [i for i in ServerState(settings.cluster).incidents() if len(i.jobs) > 1]
    latencies = [at - first_sent[job_id] for job_id, at in firsts.items()]
    never = sum(1 for n in copies.values() if n == 0)
    result = {
        "backend": backend,
        "jobs": len(failed),
        "jobs_running": len(jobs),
        "other_jobs_failed": len(survivors),
        "incidents": len(incidents),
        "suspected_switches": sorted({s for i in incidents for s in i.suspected_switches}),
        "resubmitted_once": sum(1 for n in copies.values() if n == 1),
        "resubmitted_twice": sum(1 for n in copies.values() if n > 1),
        # Failed jobs never resubmitted, and events that started no run (an older duplicate
        # the trigger dropped after a newer one of its job, or one in the trigger's window
        # after one of its job that ran, is not lost: counted apart).
        "lost": never + lost_events,
        "older_duplicates_dropped": superseded,
        "duplicates_in_trigger_window": windowed,
        # The server dropped the action of these jobs' fired event (the intake reports such a
        # failure again; its incident's run may have taken it up already).
        "actions_dropped": dropped,
        "events_behind_a_dropped_action": behind_dropped,
        "placed_on_bad_node": placed_bad,
        "first_event_to_last_resubmit_s": round(max(firsts.values()) - burst_at, 1)
        if firsts
        else None,
        "median_s": round(statistics.median(latencies), 1) if latencies else None,
        "p95_s": round(percentile(latencies, 0.95), 1) if latencies else None,
        "events_sent": len(events),
        "distinct_events": distinct,
        "triage_runs": dict(runs),
        "timed_out": not settled,
    }
    ok = (
        result["resubmitted_once"] == result["jobs"]
        and not result["placed_on_bad_node"]
        and not result["lost"]
        and settled
    )
    result["ok"] = ok
    if ok and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"[{backend}] kept {root}", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50, help="jobs running when it dies")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--worker-limit", type=int, default=6, help="flow runs at once")
    parser.add_argument("--breaker-limit", type=int, default=100_000)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--quiet-s", type=float, default=15)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--no-incidents", action="store_true", help="baseline: each failure on its own"
    )
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="sqlite")
    args = parser.parse_args(argv)
    if not SPANNING < args.jobs <= 64 - IDLE - SPANNING:
        parser.error(f"--jobs must be in {SPANNING + 1}..{64 - IDLE - SPANNING}")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    url = os.environ.get(DATABASE_URL_ENV)
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    if "postgresql" in backends and not url:
        parser.error(f'{DATABASE_URL_ENV} is not set (eval "$(scripts/postgres.sh up)")')
    results = []
    for backend in backends:
        if backend == "postgresql":
            assert url is not None
            with fresh_database(url, prefix="prefect_storm") as database_url:
                results.append(run_backend(backend, args, database_url))
        else:
            results.append(run_backend(backend, args, None))
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], indent=2))
    else:
        for r in results:
            print("\n".join(f"{k:<32} {v}" for k, v in r.items()) + "\n")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
