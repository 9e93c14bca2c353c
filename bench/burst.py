"""Benchmark: a burst of failure events through the whole event path.

    .venv/bin/python bench/burst.py [--jobs 50] [--nodes 64] [--node-faults 10]
                                    [--worker-limit 6] [--backend sqlite|postgresql|both]

On an embedded stack in a temporary home (Prefect server, `prefect deploy --all`, a process
worker, the simulated exporter; as the e2e tests bring it up) and a simulated cluster, it runs
``--jobs`` one-node jobs, crashes every one of them (a dataloader crash: triage retries it with
``num_workers=0``), then sends 4 failure events per job in one shuffled burst from 8 threads
through ``trainmedic.adapters.events.emit``:

* the scheduler's ``job.failed``,
* the same event again (a replay: same content, same event id: the server drops it),
* ``job.node_fail`` for the same job (a second source: a distinct event),
* ``job.failed`` re-detected a second later (a distinct event).

The triage trigger's ``within`` (prefect.yaml) drops a job's failure events that occurred in
the window after the one it fired on; an event later than that starts a second run, which ends
as a duplicate.

It waits until every triage run has ended and then a quiet period, and reports: jobs
remediated exactly once (one resubmission), never or twice; triage runs per state against the
distinct events sent (a missing run is a lost event, unless the trigger's window or a newer
event of its job accounts for it); throughput (remediations per minute from
the first event to the last resubmission); latency from a job's first event to its
resubmission (median, p95), and where the time went (the server's automation creating a job's
first run from its event; every run's wait in the worker's queue). On SQLite always, on PostgreSQL
as well when TRAINMEDIC_TEST_DATABASE_URL is set (`eval "$(scripts/postgres.sh up)"`), each
in a fresh database. Figures are printed, never asserted; exit status 1 when a job was not
remediated exactly once, an event was lost or a run did not complete (the temporary home is
then kept).

``--node-faults N`` breaks the first N jobs with an Xid 79 on their node instead, so that
triage drains it. In a burst that races: another job's resubmission can be placed on the
broken node before its own triage has drained it, and fails there (the simulated scheduler, like
Slurm without a health check, only avoids drained nodes). That is a finding, not the event
path's throughput, so it is off by default.

The circuit breaker (20 destructive actions per hour by default) would, by design, stop a burst
of 50 remediations after 20: ``--breaker-limit`` lifts it for the run, and the drain policy is
widened so that the Xid 79 drains go ahead without a human.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from support.stack import DATABASE_URL_ENV, embedded_stack, fresh_database  # noqa: E402

from trainmedic.adapters.events import emit, to_prefect_event  # noqa: E402
from trainmedic.adapters.scheduler.sim import SimScheduler  # noqa: E402
from trainmedic.core.models import JobEvent, JobInfo, JobSpec, JobState  # noqa: E402
from trainmedic.sim.cluster import SimCluster  # noqa: E402
from trainmedic.stack import Stack  # noqa: E402

TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


@dataclass
class Result:
    backend: str
    jobs: int
    events_sent: int
    distinct_events: int
    runs: Counter[str] = field(default_factory=Counter)
    resubmissions: Counter[str] = field(default_factory=Counter)  # job id -> count
    latencies: list[float] = field(default_factory=list)
    span_s: float = 0.0
    emit_s: float = 0.0
    settle_s: float = 0.0
    timed_out: bool = False
    db_errors: int = 0
    lost: int = 0  # events that started no run, with no later event of their job that did
    superseded: int = 0  # events older than one of their job that started a run (see below)
    windowed: int = 0  # events in the trigger's window after one of their job that ran
    behind_dropped: int = 0  # events of a job whose only fired action the server dropped
    dropped: int = 0  # run-deployment actions the server gave up on (action.failed events)
    # Where the time went: a job's first event -> the server created its first run (the
    # automation's action); every run's wait from created to started on the worker.
    to_created: list[float] = field(default_factory=list)
    to_started: list[float] = field(default_factory=list)
    run_s: list[float] = field(default_factory=list)  # every run: started -> ended

    @property
    def once(self) -> int:
        return sum(1 for n in self.resubmissions.values() if n == 1)

    @property
    def never(self) -> int:
        return sum(1 for n in self.resubmissions.values() if n == 0)

    @property
    def twice(self) -> int:
        return sum(1 for n in self.resubmissions.values() if n > 1)

    @property
    def ok(self) -> bool:
        """Every job remediated once, no event lost, and no run that failed or crashed (a
        duplicate that crashed did no harm here, but would have lost an only event)."""
        clean = set(self.runs) <= {"COMPLETED"}
        return self.once == self.jobs and self.lost == 0 and not self.timed_out and clean


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


# ----------------------------------------------------------------------------- one run


def environment(args: argparse.Namespace) -> dict[str, str]:
    return {
        "TRAINMEDIC_VERIFY_TIMEOUT_S": "300",
        # A slow simulated step keeps 100 trainers from eating the 2 cores the runs need.
        "TRAINMEDIC_SIM_STEP_SECONDS": str(args.step_seconds),
        "TRAINMEDIC_SIM_TEST_SECONDS": "0.2",
        "TRAINMEDIC_BREAKER_LIMIT": str(args.breaker_limit),
        "TRAINMEDIC_DRAIN_MAX_SHARE": "0.5",
        "TRAINMEDIC_DRAIN_MAX_PER_HOUR": "10000",
        # Many runs wait on a job's lock at once; the server must not be the bottleneck.
        "PREFECT_SERVER_DATABASE_TIMEOUT": "30",
    }


def set_worker_limit(env: dict[str, str], limit: int) -> None:
    """Every flow run is a subprocess of the worker: an unbounded burst would start ~150
    Python processes at once on 2 cores. The work pool's limit queues the rest."""
    prefect = str(Path(sys.executable).parent / "prefect")
    subprocess.run(
        [prefect, "--no-prompt", "work-pool", "set-concurrency-limit", "trainmedic", str(limit)],
        env={**os.environ, **env},
        check=True,
        capture_output=True,
        timeout=120,
    )


@dataclass(frozen=True)
class SeenRun:
    state: str
    event: tuple[str, str, float] | None  # (job id, event kind, occurred) from its request
    created: float | None = None  # when the server's automation created it
    started: float | None = None  # when the worker started it
    ended: float | None = None


def triage_runs() -> dict[str, SeenRun]:
    """Flow run id -> state type and the event of every triage run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    found: dict[str, SeenRun] = {}
    with get_client(sync_client=True) as client:
        offset = 0
        while True:
            page = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["triage"])),
                limit=200,
                offset=offset,
            )
            for run in page:
                request = run.parameters.get("request") or {}
                event = None
                if isinstance(request, dict) and request.get("occurred"):
                    occurred = datetime.fromisoformat(str(request["occurred"])).timestamp()
                    event = (str(request["job_id"]), str(request["event"]), round(occurred, 3))
                state = run.state.type.value if run.state else "NONE"
                found[str(run.id)] = SeenRun(
                    state=state,
                    event=event,
                    created=run.created.timestamp() if run.created else None,
                    started=run.start_time.timestamp() if run.start_time else None,
                    ended=run.end_time.timestamp() if run.end_time else None,
                )
            if len(page) < 200:
                return found
            offset += len(page)


def event_key(event: JobEvent) -> tuple[str, str, float]:
    return (event.job_id, event.kind, round(event.occurred.timestamp(), 3))


def trigger_window_s() -> float:
    """The triage trigger's ``within`` in prefect.yaml (0 when it has none)."""
    import yaml

    config = yaml.safe_load((REPO / "prefect.yaml").read_text())
    for deployment in config["deployments"]:
        for trigger in deployment.get("triggers") or []:
            if trigger.get("name") == "job-failed-triage":
                return float(trigger.get("within", 0))
    raise SystemExit("burst: prefect.yaml has no job-failed-triage trigger")


def unrun(
    events: list[JobEvent],
    runs: dict[str, SeenRun],
    window_s: float,
    dropped_jobs: frozenset[str] = frozenset(),
) -> tuple[int, int, int, int]:
    """Distinct events that started no run: (lost, superseded, windowed). Prefect's reactive
    trigger (one bucket per job) ignores an event older than one it already fired on for
    that job, by design: such an event arrived out of order, after a newer one of the same
    job that did start a run (superseded); with ``within``, it also ignores the job's events
    that occurred less than ``window_s`` after one it fired on (windowed). Either way a run
    of the job's failure started. A job in ``dropped_jobs`` had the trigger fire and the
    server drop that action (then its other events were in the window): its events without
    a run are counted apart, the intake reports such a failure again. Any other event
    without a run is lost."""
    ran = {r.event for r in runs.values() if r.event}
    lost = superseded = windowed = behind_dropped = 0
    for key in {event_key(e) for e in events} - ran:
        job_id, _, occurred = key
        if any(j == job_id and at > occurred for j, _, at in ran):
            superseded += 1
        elif any(j == job_id and 0 <= occurred - at < window_s for j, _, at in ran):
            windowed += 1
        elif job_id in dropped_jobs:
            behind_dropped += 1
        else:
            lost += 1
    return lost, superseded, windowed, behind_dropped


def run_backend(backend: str, args: argparse.Namespace, database_url: str | None) -> Result:
    root = Path(tempfile.mkdtemp(prefix=f"burst-{backend}-"))
    started = time.monotonic()
    with embedded_stack(
        root,
        worker=True,
        nodes=args.nodes,
        gpus_per_node=1,
        database_url=database_url,
        env=environment(args),
    ) as (settings, stack):
        set_worker_limit(stack.env, args.worker_limit)
        print(f"[{backend}] stack up in {time.monotonic() - started:.0f} s ({root})", flush=True)
        cluster = SimCluster(settings.sim_home)
        scheduler = SimScheduler(settings.sim_home)
        result = _burst(backend, args, stack, cluster, scheduler)
    result.db_errors = _db_errors(stack.server.log_file)
    # A run leaves ~300 MB of job logs and checkpoints: kept only to look into a bad result.
    if result.ok and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"[{backend}] kept {root} (server and worker logs under home/run)", flush=True)
    return result


def break_jobs(
    args: argparse.Namespace, cluster: SimCluster, scheduler: SimScheduler
) -> list[JobInfo]:
    """``--jobs`` one-node jobs, run past a checkpoint, then each broken; returns them failed."""
    jobs = [
        scheduler.submit(
            JobSpec(
                name=f"burst{i:03d}",
                nodes=1,
                gpus_per_node=1,
                steps=args.steps,
                checkpoint_every=5,
                num_workers=2,
            )
        )
        for i in range(args.jobs)
    ]
    assert all(j.state is JobState.RUNNING for j in jobs), "not enough nodes for every job"
    _wait(lambda: all(_step(j) >= 7 for j in jobs), 120, "jobs never reached step 7")
    for i, job in enumerate(jobs):
        if i < args.node_faults:
            cluster.inject(job.nodes[0], "xid79")
        else:
            scheduler.inject_job_fault(job.job_id, "dataloader")
    _wait(
        lambda: all(scheduler.job(j.job_id).state.finished for j in jobs),
        120,
        "jobs never failed",
    )
    return [scheduler.job(j.job_id) for j in jobs]


def burst_events(failed: list[JobInfo], seed: int) -> list[JobEvent]:
    events: list[JobEvent] = []
    for job in failed:
        first = JobEvent(
            kind="job.failed",
            job_id=job.job_id,
            nodes=job.nodes,
            exit_code=job.exit_code,
            occurred=job.ended_at,
        )
        events += [
            first,
            first,  # replay: identical, so the same event id
            JobEvent(kind="job.node_fail", job_id=job.job_id, nodes=job.nodes),
            first.model_copy(update={"occurred": first.occurred + timedelta(seconds=1)}),
        ]
    random.Random(seed).shuffle(events)
    return events


def send_burst(events: list[JobEvent], api_url: str) -> dict[str, float]:
    """Sends every event; returns when each job's first event went out."""
    first_sent: dict[str, float] = {}  # setdefault from 8 threads: the GIL keeps it whole

    def send(event: JobEvent) -> None:
        first_sent.setdefault(event.job_id, time.time())
        emit(event, api_url=api_url)

    # A real burst: several senders at once (scheduler intake, framework, strigger).
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(send, events))
    return first_sent


def wait_settled(
    backend: str, scheduler: SimScheduler, ids: set[str], events: list[JobEvent], timeout: float
) -> bool:
    """Until every job is resubmitted, every run it triggered has ended and every event has a
    run (or a newer one of its job has); False on timeout."""
    started = time.monotonic()
    last_report = 0.0
    seen, changed = -1, started
    while True:
        runs = triage_runs()
        now = time.monotonic()
        if len(runs) != seen:
            seen, changed = len(runs), now
        done = {j.resubmission_of for j in scheduler.jobs() if j.resubmission_of in ids}
        if (
            len(done) == len(ids)
            and all(r.state in TERMINAL for r in runs.values())
            # An event still without a run: lost, once no new run has come for a minute.
            and (unrun(events, runs, trigger_window_s())[0] == 0 or now - changed > 60)
        ):
            return True
        if now - last_report > 30:
            last_report = now
            print(
                f"[{backend}] +{now - started:.0f} s: {len(done)}/{len(ids)} resubmitted, "
                f"runs {dict(Counter(r.state for r in runs.values()))}",
                flush=True,
            )
        if now - started > timeout:
            return False
        time.sleep(2)


def _burst(
    backend: str,
    args: argparse.Namespace,
    stack: Stack,
    cluster: SimCluster,
    scheduler: SimScheduler,
) -> Result:
    failed = break_jobs(args, cluster, scheduler)
    events = burst_events(failed, args.seed)
    ids = {j.job_id for j in failed}
    result = Result(
        backend=backend,
        jobs=len(failed),
        events_sent=len(events),
        distinct_events=len({to_prefect_event(e)["id"] for e in events}),
    )
    burst_at = time.time()
    first_sent = send_burst(events, stack.api_url)
    result.emit_s = time.time() - burst_at
    print(f"[{backend}] {len(events)} events sent in {result.emit_s:.1f} s", flush=True)

    settled = wait_settled(backend, scheduler, ids, events, args.timeout)
    result.timed_out = not settled
    result.settle_s = time.time() - burst_at
    # A second (wrong) remediation would come from a run still queued: give it the time.
    time.sleep(args.quiet_s)
    runs = triage_runs()
    result.runs = Counter(r.state for r in runs.values())
    result.dropped, dropped_jobs = dropped_actions(stack.api_url, burst_at)
    result.lost, result.superseded, result.windowed, result.behind_dropped = unrun(
        events, runs, trigger_window_s(), dropped_jobs
    )
    result.resubmissions = Counter(dict.fromkeys(ids, 0))
    firsts: dict[str, float] = {}
    for job in sorted(scheduler.jobs(), key=lambda j: j.submitted_at):
        if job.resubmission_of in ids:
            result.resubmissions[job.resubmission_of] += 1
            firsts.setdefault(job.resubmission_of, job.submitted_at.timestamp())
    result.latencies = [at - first_sent[job_id] for job_id, at in firsts.items()]
    result.to_created, result.to_started = first_run_delays(runs, first_sent)
    result.run_s = [r.ended - r.started for r in runs.values() if r.started and r.ended]
    result.span_s = (max(firsts.values()) - burst_at) if firsts else float("nan")
    return result


def first_run_delays(
    runs: dict[str, SeenRun], first_sent: dict[str, float]
) -> tuple[list[float], list[float]]:
    """Seconds from each job's first event to the creation of its first run (the server's
    automation), and every run's wait from creation to its start on the worker (the queue;
    a job is often remediated before its own first run starts, by its incident's leader)."""
    first: dict[str, SeenRun] = {}
    for run in runs.values():
        if run.event is None or run.created is None or run.event[0] not in first_sent:
            continue
        job_id = run.event[0]
        if job_id not in first or run.created < (first[job_id].created or 0.0):
            first[job_id] = run
    created = [r.created - first_sent[j] for j, r in first.items() if r.created is not None]
    started = [r.started - r.created for r in runs.values() if r.started and r.created]
    return created, started


def dropped_actions(api_url: str, since: float) -> tuple[int, frozenset[str]]:
    """Automation actions the server gave up on since ``since``, and the jobs whose events
    they were for: under a burst on SQLite its in-process client retries a refused write for
    about a minute, then records ``prefect.automation.action.failed`` and starts no run for
    that event. The intake reports such a failure again (trainmedic/adapters/intake.py); this
    burst sends its events itself, so here a dropped action is recovered only if the job had
    another event outside the trigger's window, or its incident's run took it up."""
    import httpx

    from trainmedic.adapters.events import dropped_jobs

    start = datetime.fromtimestamp(since).astimezone()
    body = {
        "filter": {
            "occurred": {"since": start.isoformat()},
            "event": {"name": ["prefect.automation.action.failed"]},
        },
        "limit": 50,  # the endpoint's page; "total" counts them all
    }
    response = httpx.post(f"{api_url}/events/filter", json=body, timeout=30)
    response.raise_for_status()
    found = response.json()
    count = int(found.get("total", len(found.get("events", []))))
    return count, frozenset(dropped_jobs(start, api_url=api_url, timeout_s=30) if count else ())


def _db_errors(server_log: Path) -> int:
    """Database errors the server logged, one per traceback (SQLite's "database is locked"
    under write load is one)."""
    try:
        return server_log.read_text(errors="replace").count("sqlalchemy.exc.OperationalError")
    except OSError:
        return -1


def _step(job: JobInfo) -> int:
    try:
        return int(json.loads(Path(job.heartbeat_path).read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def _wait(condition: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise SystemExit(f"burst: {message} within {timeout:.0f} s")


# ----------------------------------------------------------------------------- report


def table(results: list[Result]) -> str:
    rows = [
        (
            "jobs / events sent / distinct",
            lambda r: f"{r.jobs} / {r.events_sent} / {r.distinct_events}",
        ),
        ("remediated exactly once", lambda r: f"{r.once}/{r.jobs}"),
        ("never / twice or more", lambda r: f"{r.never} / {r.twice}"),
        ("triage runs", lambda r: " ".join(f"{k}={v}" for k, v in sorted(r.runs.items()))),
        ("lost events", lambda r: str(r.lost)),
        ("events without a run, a later one of the job ran", lambda r: str(r.superseded)),
        ("events without a run, in the trigger's window", lambda r: str(r.windowed)),
        (
            "events without a run, their job's action dropped (the intake reports them again)",
            lambda r: str(r.behind_dropped),
        ),
        ("run-deployment actions the server dropped", lambda r: str(r.dropped)),
        ("emit burst (s)", lambda r: f"{r.emit_s:.1f}"),
        ("first event -> last resubmission (s)", lambda r: f"{r.span_s:.0f}"),
        ("until every run ended (s)", lambda r: f"{r.settle_s:.0f}"),
        (
            "throughput (remediations/min)",
            lambda r: f"{r.once / r.span_s * 60:.1f}" if r.span_s > 0 else "-",
        ),
        (
            "latency median (s)",
            lambda r: f"{statistics.median(r.latencies):.0f}" if r.latencies else "-",
        ),
        ("latency p95 (s)", lambda r: f"{percentile(r.latencies, 0.95):.0f}"),
        (
            "  first event -> first run created, median / p95 (s)",
            lambda r: _spread(r.to_created),
        ),
        ("  every run: created -> started, median / p95 (s)", lambda r: _spread(r.to_started)),
        ("  every run: started -> ended, median / p95 (s)", lambda r: _spread(r.run_s)),
        ("server database errors logged", lambda r: str(r.db_errors)),
        ("timed out", lambda r: "yes" if r.timed_out else "no"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{'':<{width}}  " + "  ".join(f"{r.backend:>14}" for r in results)]
    for name, cell in rows:
        lines.append(f"{name:<{width}}  " + "  ".join(f"{cell(r):>14}" for r in results))
    return "\n".join(lines)


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.0f} / {percentile(values, 0.95):.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--node-faults", type=int, default=0, help="jobs broken by an Xid 79")
    # Long: a duplicate run verifies against the newest checkpoint, which the resubmitted job
    # wrote itself; a job that has already completed at that step never passes (it waits out
    # the verify timeout, holding the job's lock and a worker slot).
    parser.add_argument("--steps", type=int, default=100_000, help="each job's length")
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--worker-limit", type=int, default=6, help="flow runs at once")
    parser.add_argument("--breaker-limit", type=int, default=100_000)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to settle")
    parser.add_argument("--quiet-s", type=float, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the temporary home")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    args = parser.parse_args(argv)
    # Started in the background, SIGINT is ignored and SIGTERM kills at once: either way the
    # stack's detached server, worker and trainers would outlive the run. Both unwind instead.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.jobs + args.node_faults > args.nodes:
        parser.error("--nodes must hold every job and the replacements of drained nodes")

    url = os.environ.get(DATABASE_URL_ENV)
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    if "postgresql" in backends and not url:
        if args.backend == "postgresql":
            parser.error(f'{DATABASE_URL_ENV} is not set (eval "$(scripts/postgres.sh up)")')
        print(f"burst: {DATABASE_URL_ENV} not set: SQLite only", flush=True)
        backends = ["sqlite"]

    results = []
    for backend in backends:
        if backend == "postgresql":
            assert url is not None
            with fresh_database(url, prefix="prefect_burst") as database_url:
                results.append(run_backend(backend, args, database_url))
        else:
            results.append(run_backend(backend, args, None))
        print(table(results[-1:]), flush=True)
    print(
        f"\nburst: {args.jobs} jobs ({args.node_faults} Xid 79, the rest dataloader crashes) on "
        f"{args.nodes} simulated nodes, 4 events per job, worker limit {args.worker_limit}\n"
    )
    print(table(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
