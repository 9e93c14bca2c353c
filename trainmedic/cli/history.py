"""``trainmedic runs``: the runbook history an on-call engineer reads.

Newest first by start time, only runs that happened (a scheduled watchdog run of the next
minute is not history), filtered on the server by runbook, state and age, and here by job
or node (what the run's request names). Any limit from 1 to 1000; anything else is refused
in one line.
"""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

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


def _names(request: dict[str, object]) -> set[str]:
    """The nodes a run's request names (restore: node; locate: nodes)."""
    found = {str(request["node"])} if request.get("node") else set()
    nodes = request.get("nodes")
    if isinstance(nodes, list):
        found |= {str(n) for n in nodes}
    return found


def cmd_runs(args: argparse.Namespace) -> int:
    from trainmedic.core.validate import hostname
    from trainmedic.core.validate import job_id as check_job_id

    if not 1 <= args.limit <= MAX_LIMIT:
        raise InputError("limit", args.limit, f"must be 1 to {MAX_LIMIT}")
    wanted_job = check_job_id(args.job, "job") if args.job else None
    wanted_node = hostname(args.node, "node") if args.node else None
    since = since_time(args.since) if args.since else None
    with_prefect()
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterStartTime,
        FlowRunFilterState,
        FlowRunFilterStateName,
    )
    from prefect.client.schemas.sorting import FlowRunSort

    run_filter = FlowRunFilter(
        start_time=FlowRunFilterStartTime(is_null_=False, after_=since),
        state=FlowRunFilterState(name=FlowRunFilterStateName(any_=[args.state]))
        if args.state
        else None,
    )
    flow_filter = FlowFilter(name=FlowFilterName(any_=[args.runbook])) if args.runbook else None
    from trainmedic.adapters.server_state import ServerState
    from trainmedic.core.settings import get_settings

    # A human's correction of a job's diagnosis shows on that job's runs.
    corrected = {c.job_id: c for c in ServerState(get_settings().cluster).corrections()}
    rows: list[dict[str, object]] = []
    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        offset = 0
        while len(rows) < args.limit:
            page = client.read_flow_runs(
                flow_filter=flow_filter,
                flow_run_filter=run_filter,
                sort=FlowRunSort.START_TIME_DESC,
                limit=PAGE,
                offset=offset,
            )
            offset += len(page)
            for run in page:
                request = (run.parameters or {}).get("request") or {}
                request = request if isinstance(request, dict) else {}
                job = request.get("job_id")
                if wanted_job and job != wanted_job:
                    continue
                if wanted_node and wanted_node not in _names(request):
                    continue
                rows.append(
                    {
                        "flow_run_id": str(run.id),
                        "name": run.name,
                        "runbook": flows.get(run.flow_id, "?"),
                        "job_id": job,
                        "state": run.state.name if run.state else "?",
                        "message": (run.state.message or "") if run.state else "",
                        "started": run.start_time.isoformat() if run.start_time else None,
                        "outcome": _outcome(run.state),
                        "corrected": (
                            f"{corrected[job].category} by {corrected[job].by}"
                            if job in corrected
                            else None
                        ),
                        "url": ui_link(run.id),
                    }
                )
                if len(rows) >= args.limit:
                    break
            if len(page) < PAGE:
                break
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        filters = [f"{k} {v}" for k, v in vars(args).items() if k in FILTERS and v]
        print("no runs" + (f" matching {', '.join(filters)}" if filters else ""))
    for row in rows:
        print(
            f"{str(row['started'] or '')[:19]:<20} {row['runbook']!s:<20} "
            f"job {row['job_id'] or '-'!s:<8} {row['state']!s:<10} {row['name']}  "
            f"{str(row['outcome'] or row['message'])[:100]}"
            + (f" [corrected: {row['corrected']}]" if row["corrected"] else "")
        )
    return 0


FILTERS = ("job", "node", "runbook", "state", "since")


def _outcome(state: object) -> str:
    """What a completed run found and did (category, drained, resubmitted as, human), read
    from its persisted result; empty for a run without one, or whose result this host cannot
    read (a worker elsewhere without shared storage)."""
    if state is None or not state.is_completed():  # type: ignore[attr-defined]
        return ""
    try:
        result = persisted_result(state)
    except Exception:  # history still lists the run, without its outcome
        return ""
    outcome = result.model_dump(mode="json") if hasattr(result, "model_dump") else result
    return outcome_summary(outcome)


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
    runs.add_argument("--node", help="only runs whose request names this node")
    runs.add_argument("--runbook", help="only this runbook (triage, locate-faulty-nodes, ...)")
    runs.add_argument("--state", help="only runs in this state (Completed, Failed, Paused...)")
    runs.add_argument("--since", help="only runs started since: 30m, 24h, 7d or an ISO time")
    runs.add_argument("--limit", type=int, default=20, help=f"1 to {MAX_LIMIT}")
    runs.add_argument("--json", action="store_true")
