"""``trainmedic runs``: the runbook history an on-call engineer reads.

Only runs that happened, newest created first: a run created and never started (no worker
took it) is history, a run scheduled for later (the watchdog's next minute) is not, one due in
the past and not started is (Scheduled or Late). Filtered on the server by runbook and state
(any Prefect state name, in any case), and here by age, job and node (what the run's request
names, or the nodes its outcome drained). The outcome says when the run paged on-call. Any
limit from 1 to 1000; anything else is refused in one line.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from trainmedic.cli.common import (
    AddCommand,
    outcome_summary,
    persisted_result,
    print_json,
    ui_link,
    with_prefect,
)
from trainmedic.core.errors import InputError

MAX_LIMIT = 1000
PAGE = 200
_AGE_RE = re.compile(r"^(\d{1,5})([mhd])$")
# Prefect's state names beyond its state types' own (Scheduled, Running, Completed...), as
# its engine and server name them.
NAMED_STATES = (
    "Late",
    "AwaitingRetry",
    "AwaitingConcurrencySlot",
    "Resuming",
    "Retrying",
    "Submitting",
    "InfrastructurePending",
    "NotReady",
    "Cached",
    "TimedOut",
    "RolledBack",
    "Suspended",
)
# The server sorts by expected start, not by creation. A run is created no later than it is
# expected to start, give or take the clocks of the hosts that created it: once a page's
# expected starts are this far behind the runs kept, no later page holds a newer one.
CLOCK_SLACK = timedelta(hours=1)
PAGE_EVENTS_PER_CALL = 50  # the events API's page size
MAX_PAGE_EVENT_CALLS = 20


def since_time(value: str) -> datetime:
    """``30m``, ``24h``, ``7d`` or an ISO time."""
    match = _AGE_RE.match(value.strip())
    if match:
        amount, unit = int(match[1]), match[2]
        delta = {"m": timedelta(minutes=amount), "h": timedelta(hours=amount)}.get(
            unit, timedelta(days=amount)
        )
        return datetime.now(UTC) - delta
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InputError("since", value, "not an age (30m, 24h, 7d) or an ISO time") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def state_names() -> dict[str, str]:
    """Every Prefect state name, by its lower case."""
    from prefect.client.schemas.objects import StateType

    names = [t.value.title() for t in StateType] + list(NAMED_STATES)
    return {n.lower(): n for n in names}


def state_name(value: str) -> str:
    """The Prefect state name ``value`` means, whatever its case (the server's filter is exact)."""
    names = state_names()
    try:
        return names[value.strip().lower()]
    except KeyError:
        raise InputError(
            "state", value, f"not a Prefect state: one of {', '.join(sorted(names.values()))}"
        ) from None


def _names(request: dict[str, object], outcome: dict[str, Any] | None) -> set[str]:
    """The nodes a run is about: those its request names (restore: node; locate: nodes), and
    those its outcome drained (triage names a job, not the node it drained)."""
    found = {str(request["node"])} if request.get("node") else set()
    nodes = request.get("nodes")
    if isinstance(nodes, list):
        found |= {str(n) for n in nodes}
    drained = (outcome or {}).get("drained")
    if isinstance(drained, list):
        found |= {str(n) for n in drained}
    return found


def _happened_filter(state: str | None, now: datetime) -> Any:
    """Only runs that happened: not those in a Scheduled state (Scheduled, Late, AwaitingRetry,
    ...) expected to start after ``now``; ``state``: only runs in that state."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterExpectedStartTime,
        FlowRunFilterState,
        FlowRunFilterStateName,
        FlowRunFilterStateType,
        Operator,
    )
    from prefect.client.schemas.objects import StateType

    due = FlowRunFilterExpectedStartTime(before_=now)
    if state is None:
        # Either not scheduled at all, or scheduled for a time that has come.
        return FlowRunFilter(
            operator=Operator.or_,
            state=FlowRunFilterState(type=FlowRunFilterStateType(not_any_=[StateType.SCHEDULED])),
            expected_start_time=due,
        )
    # A run expected in the future is only hidden while it waits for that time: a Cancelled
    # one is history; a Scheduled, Late or AwaitingRetry one is only once it was due.
    named = FlowRunFilterState(name=FlowRunFilterStateName(any_=[state]))
    if state in ("Scheduled", "Late", "AwaitingRetry", "AwaitingConcurrencySlot", "Resuming"):
        return FlowRunFilter(state=named, expected_start_time=due)
    return FlowRunFilter(state=named)


def cmd_runs(args: argparse.Namespace) -> int:
    from trainmedic.core.validate import hostname
    from trainmedic.core.validate import job_id as check_job_id

    if not 1 <= args.limit <= MAX_LIMIT:
        raise InputError("limit", args.limit, f"must be 1 to {MAX_LIMIT}")
    wanted = Wanted(
        job=check_job_id(args.job, "job") if args.job else None,
        node=hostname(args.node, "node") if args.node else None,
        since=since_time(args.since) if args.since else None,
        state=state_name(args.state) if args.state else None,
        runbook=args.runbook,
        limit=args.limit,
    )
    with_prefect()
    from prefect.client.orchestration import get_client

    from trainmedic.adapters.server_state import ServerState
    from trainmedic.core.settings import get_settings

    # A human's correction of a job's diagnosis shows on that job's runs.
    corrected = {c.job_id: c for c in ServerState(get_settings().cluster).corrections()}
    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        kept = _newest(client, wanted)
        paged = _pages(client, [run for run, _ in kept])
    rows: list[dict[str, object]] = []
    for run, result in kept:
        job = _request(run).get("job_id")
        outcome = result if wanted.node else _result(run.state)
        rows.append(
            {
                "flow_run_id": str(run.id),
                "name": run.name,
                "runbook": flows.get(run.flow_id, "?"),
                "job_id": job,
                "state": run.state.name if run.state else "?",
                "message": (run.state.message or "") if run.state else "",
                "created": run.created.isoformat() if run.created else None,
                "started": run.start_time.isoformat() if run.start_time else None,
                "outcome": outcome_summary(outcome, paged=paged.get(str(run.id))),
                "corrected": (
                    f"{corrected[job].category} by {corrected[job].by}"
                    if job in corrected
                    else None
                ),
                "url": ui_link(run.id),
            }
        )
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        filters = [f"{k} {v}" for k, v in vars(args).items() if k in FILTERS and v]
        print("no runs" + (f" matching {', '.join(filters)}" if filters else ""))
    for row in rows:
        print(
            f"{str(row['created'] or '')[:19]:<20} {row['runbook']!s:<20} "
            f"job {row['job_id'] or '-'!s:<8} {row['state']!s:<10} {row['name']}  "
            f"{str(row['outcome'] or row['message'])[:100]}"
            + (f" [corrected: {row['corrected']}]" if row["corrected"] else "")
        )
    return 0


@dataclass(frozen=True)
class Wanted:
    """What `runs` was asked for, checked."""

    job: str | None
    node: str | None
    since: datetime | None
    state: str | None
    runbook: str | None
    limit: int


def _newest(client: Any, wanted: Wanted) -> list[tuple[Any, dict[str, Any] | None]]:
    """The ``wanted.limit`` newest created runs that happened and match, each with its result
    when ``wanted.node`` needed it read."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    run_filter = _happened_filter(wanted.state, datetime.now(UTC))
    flow_filter = FlowFilter(name=FlowFilterName(any_=[wanted.runbook])) if wanted.runbook else None
    kept: list[tuple[Any, dict[str, Any] | None]] = []
    offset = 0
    while True:
        page = client.read_flow_runs(
            flow_filter=flow_filter,
            flow_run_filter=run_filter,
            sort=FlowRunSort.EXPECTED_START_TIME_DESC,
            limit=PAGE,
            offset=offset,
        )
        offset += len(page)
        for run in page:
            if wanted.since and (run.created is None or run.created < wanted.since):
                continue
            request = _request(run)
            if wanted.job and request.get("job_id") != wanted.job:
                continue
            result = _result(run.state) if wanted.node else None
            if wanted.node and wanted.node not in _names(request, result):
                continue
            kept.append((run, result))
        kept.sort(key=lambda kept_run: _created(kept_run[0]), reverse=True)
        del kept[wanted.limit :]
        if len(page) < PAGE:
            return kept
        last = page[-1].expected_start_time
        floor = last + CLOCK_SLACK if last else None  # no later page's run is newer
        if floor and (
            (wanted.since and floor < wanted.since)
            or (len(kept) == wanted.limit and _created(kept[-1][0]) > floor)
        ):
            return kept


FILTERS = ("job", "node", "runbook", "state", "since")


def _created(run: Any) -> datetime:
    return run.created or datetime.min.replace(tzinfo=UTC)


def _request(run: Any) -> dict[str, object]:
    request = (run.parameters or {}).get("request") or {}
    return request if isinstance(request, dict) else {}


def _result(state: object) -> dict[str, Any] | None:
    """What a completed run found and did (category, drained, resubmitted as, human), read
    from its persisted result; None for a run without one, or whose result this host cannot
    read (a worker elsewhere without shared storage)."""
    if state is None or not state.is_completed():  # type: ignore[attr-defined]
        return None
    try:
        result = persisted_result(state)
    except Exception:  # history still lists the run, without its outcome
        return None
    outcome = result.model_dump(mode="json") if hasattr(result, "model_dump") else result
    return outcome if isinstance(outcome, dict) else None


def _pages(client: Any, runs: list[Any]) -> dict[str, str]:
    """The runs among ``runs`` that paged on-call, with what the page said: each page is a
    ``trainmedic.page`` event the run emitted (the event names the run as a related resource),
    which a result does not record. Best effort: without the events (past the server's event
    retention, an API that does not answer) the outcome falls back to the run's result."""
    if not runs:
        return {}
    ids = [f"prefect.flow-run.{run.id}" for run in runs]
    body: dict[str, Any] = {
        "filter": {
            "occurred": {
                "since": min(_created(run) for run in runs).isoformat(),
                "until": (datetime.now(UTC) + CLOCK_SLACK).isoformat(),
            },
            "event": {"name": ["trainmedic.page"]},
            "related": {"id": ids},
            "order": "ASC",
        },
        "limit": PAGE_EVENTS_PER_CALL,
    }
    found: dict[str, str] = {}
    try:
        answer = client.request("POST", "/events/filter", json=body).json()
        for _ in range(MAX_PAGE_EVENT_CALLS):
            for event in answer.get("events") or []:
                summary = str((event.get("payload") or {}).get("summary") or "on-call")
                for related in event.get("related") or []:
                    rid = str(related.get("prefect.resource.id", ""))
                    if rid.startswith("prefect.flow-run."):
                        found.setdefault(rid.removeprefix("prefect.flow-run."), summary)
            if not answer.get("next_page"):
                break
            token = httpx.URL(str(answer["next_page"])).params.get("page-token")
            answer = client.request(
                "GET", "/events/filter/next", params={"page-token": token}
            ).json()
    except httpx.HTTPError:
        pass
    return found


def cmd_report(args: argparse.Namespace) -> int:
    """The fleet report over ``--since`` (default a week), computed here and kept as the
    `fleet-report` artifact (pictures included), as the hourly deployment does; ``--plots``
    also writes the pictures there and prints their paths."""
    since = since_time(args.since)
    hours = (datetime.now(UTC) - since).total_seconds() / 3600
    if not 0 < hours <= 24 * 365:
        raise InputError("since", args.since, "must be between now and a year ago")
    plots_dir = None
    if args.plots is not None:
        folder = Path(args.plots).expanduser().resolve()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError("plots", args.plots, f"not a directory we can write: {exc}") from exc
        plots_dir = str(folder)
    with_prefect()
    from flows.report import FleetReportRequest, fleet_report_flow
    from trainmedic.reports.fleet import fleet_markdown

    result = fleet_report_flow(FleetReportRequest(since_h=hours, plots_dir=plots_dir))
    if args.json:
        print_json({**result.report.model_dump(mode="json"), "plot_files": result.plot_files})
        return 0
    print(fleet_markdown(result.report), end="")
    if plots_dir is not None:
        print(f"\n{len(result.plot_files)} plots written:")
        for path in result.plot_files:
            print(f"  {path}")
    return 0


def register(add: AddCommand) -> None:
    report = add("report", cmd_report, "fleet report: ETTR, GPU-hours lost by cause, lemons")
    report.add_argument("--since", default="7d", help="30m, 24h, 7d or an ISO time (7d)")
    report.add_argument("--json", action="store_true")
    report.add_argument("--plots", metavar="DIR", help="also write the report's PNGs into DIR")

    runs = add("runs", cmd_runs, "runbook history with state and outcome, newest first")
    runs.add_argument("--job", help="only runs about this job id")
    runs.add_argument("--node", help="only runs whose request names or outcome drained this node")
    runs.add_argument("--runbook", help="only this runbook (triage, locate-faulty-nodes, ...)")
    runs.add_argument(
        "--state", help="only runs in this Prefect state (completed, failed, paused, late...)"
    )
    runs.add_argument("--since", help="only runs created since: 30m, 24h, 7d or an ISO time")
    runs.add_argument("--limit", type=int, default=20, help=f"1 to {MAX_LIMIT}")
    runs.add_argument("--json", action="store_true")
