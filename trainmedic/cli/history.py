"""``trainmedic runs``: the runbook history."""

from __future__ import annotations

import argparse

from trainmedic.cli.common import AddCommand, print_json, ui_link, with_prefect


def cmd_runs(args: argparse.Namespace) -> int:
    with_prefect()
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    from trainmedic.core.validate import job_id as check_job_id

    wanted = check_job_id(args.job, "job") if args.job else None
    rows = []
    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        for run in client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=args.limit * 5):
            request = (run.parameters or {}).get("request") or {}
            job = request.get("job_id") if isinstance(request, dict) else None
            if wanted and job != wanted:
                continue
            rows.append(
                {
                    "name": run.name,
                    "runbook": flows.get(run.flow_id, "?"),
                    "job_id": job,
                    "state": run.state.name if run.state else "?",
                    "message": (run.state.message or "") if run.state else "",
                    "started": run.start_time.isoformat() if run.start_time else None,
                    "url": ui_link(run.id),
                }
            )
            if len(rows) >= args.limit:
                break
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no runs" + (f" for job {wanted}" if wanted else ""))
    for row in rows:
        print(
            f"{(row['started'] or '')[:19]:<20} {row['runbook']:<20} job {row['job_id'] or '-':<8}"
            f" {row['state']:<10} {row['name']}  {row['message'][:60]}"
        )
    return 0


def register(add: AddCommand) -> None:
    runs = add("runs", cmd_runs, "runbook history with state and outcome")
    runs.add_argument("--job", help="only runs about this job id")
    runs.add_argument("--limit", type=int, default=20)
    runs.add_argument("--json", action="store_true")
