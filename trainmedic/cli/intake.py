"""``trainmedic watch | emit``: the intake (scheduler failures → events) and what a framework
sends."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from trainmedic.cli.common import EXIT_SERVER, AddCommand
from trainmedic.core.models import JobInfo
from trainmedic.core.settings import Settings, get_settings
from trainmedic.decisions.admission import event_scope

MAX_BACKOFF_S = 60.0


def cmd_watch(args: argparse.Namespace) -> int:
    """The intake loop. It never gives up: a server or scheduler that is away ends a pass
    (recorded, shown by `trainmedic status`) and the next pass retries, backing off to a
    minute; nothing is marked reported until the server took it."""
    from trainmedic.stack import apply_prefect_env

    settings = get_settings()
    apply_prefect_env(settings)
    from trainmedic.adapters.events import dropped_jobs, emit
    from trainmedic.adapters.intake import Intake
    from trainmedic.adapters.scheduler import get_scheduler

    intake = Intake(
        get_scheduler(settings),
        settings.home,
        emit,
        backfill=args.backfill,
        taken_up=taken_up_by_runbook(settings) if settings.intake_redeliver_after_s else None,
        redeliver_after_s=settings.intake_redeliver_after_s,
        scope=event_scope(settings),
        dropped=dropped_jobs if settings.intake_redeliver_after_s else None,
    )
    delay = args.interval
    while True:
        result = intake.run_pass()
        for event in [*result.sent, *result.redelivered]:
            print(f"{event.kind} job {event.job_id} ({event.reason or 'no reason'})", flush=True)
        if result.error:
            delay = min(max(delay * 2, args.interval), max(args.interval, MAX_BACKOFF_S))
            print(
                f"intake: {result.error}; {result.pending} failure(s) waiting, "
                f"next try in {delay:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        else:
            delay = args.interval
        if args.once:
            return EXIT_SERVER if result.error else 0
        time.sleep(delay)


def taken_up_by_runbook(settings: Settings) -> Callable[[Sequence[JobInfo]], set[str]]:
    """Of these jobs, the ids a triage run claimed: an incident on the Prefect server holds
    them (every triage opens one, a storm's for many jobs)."""
    from trainmedic.adapters.server_state import ServerState

    state = ServerState(settings.cluster)
    horizon = timedelta(seconds=event_scope(settings).max_age_s)

    def taken_up(jobs: Sequence[JobInfo]) -> set[str]:
        held = {j for i in state.incidents(since=datetime.now(UTC) - horizon) for j in i.jobs}
        return {job.job_id for job in jobs if job.job_id in held}

    return taken_up


def cmd_emit(args: argparse.Namespace) -> int:
    from trainmedic.stack import apply_prefect_env

    apply_prefect_env(get_settings())
    from trainmedic.adapters.events import emit
    from trainmedic.core.models import JobEvent
    from trainmedic.core.validate import expand_nodelist

    event = JobEvent(
        kind=args.kind if args.kind.startswith("job.") else f"job.{args.kind}",
        job_id=args.job,
        step=args.step,
        reason=args.reason,
        nodes=tuple(expand_nodelist(args.nodes)) if args.nodes else (),
    )
    print(emit(event))
    return 0


def register(add: AddCommand) -> None:
    watch = add("watch", cmd_watch, "intake: report the scheduler's job failures as events")
    watch.add_argument("--interval", type=float, default=10.0, help="seconds between polls")
    watch.add_argument("--once", action="store_true", help="one pass, then exit")
    watch.add_argument(
        "--backfill",
        action="store_true",
        help="also report failures that happened before the first pass",
    )

    emit_parser = add(
        "emit",
        cmd_emit,
        "send a job event (how a training framework reports "
        "a loss spike: `trainmedic emit loss_spike --job 1234 --step 5100`)",
    )
    emit_parser.add_argument("kind", help="failed|node_fail|timeout|loss_spike|nan_loss|hung")
    emit_parser.add_argument("--job", required=True)
    emit_parser.add_argument("--step", type=int)
    emit_parser.add_argument("--reason", default="")
    emit_parser.add_argument("--nodes", help="node list, e.g. node[001-004]")
