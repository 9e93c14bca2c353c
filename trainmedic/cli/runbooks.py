"""``trainmedic triage | restart | repair | restore``: runbooks started through their
deployments, so they run on the worker and show in the UI; the command follows the run to its
end."""

from __future__ import annotations

import argparse
import getpass
import sys
import time

from trainmedic.cli.common import (
    EXIT_HUMAN,
    EXIT_RUN_FAILED,
    AddCommand,
    needs_human,
    persisted_result,
    print_json,
    ui_link,
    with_prefect,
)
from trainmedic.core.errors import InputError


def _wait_for_run(flow_run_id: object, *, quiet: bool) -> object:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        last = None
        while True:
            run = client.read_flow_run(flow_run_id)  # type: ignore[arg-type]
            state = run.state.name if run.state else "?"
            if state != last and not quiet:
                print(f"  {run.name}: {state}", file=sys.stderr)
                last = state
            if run.state is not None and run.state.is_final():
                return run
            time.sleep(1)


def run_runbook(deployment: str, request: object, *, as_json: bool) -> int:
    """Start a runbook through its deployment (so it runs on the worker and shows in the UI),
    show its progress, print its outcome from the run's persisted result, and return 0 when
    it did what was asked, EXIT_HUMAN when it refused or left the decision to a human,
    EXIT_RUN_FAILED when the run did not complete."""
    from prefect.deployments import run_deployment

    parameters = {"request": request.model_dump(mode="json")}  # type: ignore[attr-defined]
    run = run_deployment(deployment, parameters=parameters, timeout=0)
    print(f"started {run.name}: {ui_link(run.id)}", file=sys.stderr)
    final = _wait_for_run(run.id, quiet=as_json)
    state = final.state  # type: ignore[attr-defined]
    result: object = None
    if state.is_completed():
        try:
            result = persisted_result(state)
        except Exception as exc:  # a result the worker could not persist or we cannot read
            result = None
            print(f"  (result unreadable: {type(exc).__name__}: {exc})", file=sys.stderr)
    outcome = result.model_dump(mode="json") if hasattr(result, "model_dump") else result
    human = needs_human(outcome) if isinstance(outcome, dict) else None
    summary = {
        "flow_run_id": str(run.id),
        "name": run.name,
        "state": state.name,
        "url": ui_link(run.id),
        "result": outcome,
        "human_needed": human,
        "message": state.message,
    }
    if as_json:
        print_json(summary)
    else:
        print(f"{run.name}: {state.name}" + (f" — {state.message}" if state.message else ""))
        if isinstance(outcome, dict):
            print("  " + ", ".join(f"{k}: {v}" for k, v in outcome.items() if _shown(k, v)))
        if human:
            print(f"  a human must act: {human}")
    if not state.is_completed():
        return EXIT_RUN_FAILED
    return EXIT_HUMAN if human else 0


def _shown(key: str, value: object) -> bool:
    return value not in (None, "", [], {}) and key not in ("report_id", "report_key")


def known_job(job_id: str) -> str:
    """The job, checked with the scheduler before any run is created: an unknown id is one
    line and exit 2 in a second, not a Failed run that pages."""
    from trainmedic.adapters.scheduler import get_scheduler
    from trainmedic.core.validate import job_id as check_job_id

    return get_scheduler().job(check_job_id(job_id)).job_id


def cmd_triage(args: argparse.Namespace) -> int:
    known_job(args.job_id)
    with_prefect()
    from flows.triage import TriageRequest, triage

    request = TriageRequest(job_id=args.job_id, dry_run=args.dry_run, event="manual")
    if args.local:
        result = triage(request)
        print_json(result.model_dump()) if args.json else print(result)
        return 0
    return run_runbook("triage/triage", request, as_json=args.json)


def cmd_restart(args: argparse.Namespace) -> int:
    known_job(args.job_id)
    with_prefect()
    from flows.restart import RestartRequest

    request = RestartRequest(
        job_id=args.job_id, from_checkpoint=args.from_checkpoint, dry_run=args.dry_run
    )
    return run_runbook("restart/restart", request, as_json=args.json)


def cmd_restore(args: argparse.Namespace) -> int:
    from trainmedic.adapters.ansible import Inventory
    from trainmedic.core.settings import get_settings

    Inventory(get_settings().inventory).check([args.node], "node")
    with_prefect()
    from flows.restore import RestoreRequest

    request = RestoreRequest(
        node=args.node,
        partner=args.partner,
        dry_run=args.dry_run,
        force=args.force,
        forced_by=args.by,
        force_reason=args.reason,
    )
    return run_runbook("restore-node/restore-node", request, as_json=args.json)


def cmd_repair(args: argparse.Namespace) -> int:
    from trainmedic.adapters.ansible import Inventory
    from trainmedic.core.settings import get_settings

    Inventory(get_settings().inventory).check([args.node], "node")
    if not 10 <= args.approval_timeout <= 86_400:  # RepairRequest's bounds, before any server
        raise InputError("approval_timeout_s", args.approval_timeout, "must be 10..86400 s")
    with_prefect()
    from flows.repair import RepairRequest

    request = RepairRequest(
        node=args.node, dry_run=args.dry_run, approval_timeout_s=args.approval_timeout
    )
    return run_runbook("repair-node/repair-node", request, as_json=args.json)


def cmd_save_and_stop(args: argparse.Namespace) -> int:
    known_job(args.job_id)
    with_prefect()
    from flows.save_and_stop import SaveAndStopRequest

    request = SaveAndStopRequest(job_id=args.job_id, reason=args.reason, dry_run=args.dry_run)
    return run_runbook("save-and-stop/save-and-stop", request, as_json=args.json)


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel a runbook run that is scheduled, running or paused (Prefect's own cancellation:
    the worker stops it; what it already did stays done and is in its report)."""
    with_prefect()
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Cancelling

    from trainmedic.cli.approvals import find_run

    with get_client(sync_client=True) as client:
        run = find_run(client, args.run)
        state = run.state
        if state is None or state.is_final():
            raise InputError(
                "run", args.run, f"is {state.name if state else '?'}: it is not in flight"
            )
        message = f"cancelled by {args.by or getpass.getuser()}: {args.reason or 'no reason given'}"
        # Nothing runs a scheduled run's code: it ends now. A running one, or one paused for
        # a human (it waits in its own process), is Cancelling: its worker stops the
        # process, then marks it Cancelled.
        waiting = state.is_scheduled() or (state.is_paused() and not run.infrastructure_pid)
        new = Cancelled(message=message) if waiting else Cancelling(message=message)
        client.set_flow_run_state(run.id, new, force=True)
    summary = {
        "flow_run_id": str(run.id),
        "name": run.name,
        "was": state.name,
        "now": new.name,
        "message": message,
    }
    if args.json:
        print_json(summary)
    else:
        print(f"{run.name}: {state.name} -> {new.name} ({message})")
    return 0


def register(add: AddCommand) -> None:
    stop = add(
        "save-and-stop",
        cmd_save_and_stop,
        "planned stop: the job saves a checkpoint now, then stops (nothing lost)",
    )
    stop.add_argument("job_id")
    stop.add_argument("--reason", default="planned stop")
    stop.add_argument("--dry-run", action="store_true")
    stop.add_argument("--json", action="store_true")

    cancel = add(
        "cancel", cmd_cancel, "cancel a runbook run in flight (scheduled, running, paused)"
    )
    cancel.add_argument("run", help="flow run id or name")
    cancel.add_argument("--reason", default="", help="why (recorded in the run's state)")
    cancel.add_argument("--by", default=None, help="who (default: this user)")
    cancel.add_argument("--json", action="store_true")

    triage = add("triage", cmd_triage, "run the triage runbook on a failed job")
    triage.add_argument("job_id")
    triage.add_argument("--dry-run", action="store_true", help="diagnose and plan only")
    triage.add_argument(
        "--local", action="store_true", help="run the flow in this process instead of on the worker"
    )
    triage.add_argument("--json", action="store_true")

    restart = add(
        "restart",
        cmd_restart,
        "resubmit a job from its newest valid checkpoint "
        "(or --from-checkpoint STEP), excluding drained nodes",
    )
    restart.add_argument("job_id")
    restart.add_argument("--from-checkpoint", type=int, metavar="STEP")
    restart.add_argument("--dry-run", action="store_true")
    restart.add_argument("--json", action="store_true")

    repair = add(
        "repair",
        cmd_repair,
        "repair a node trainmedic drained (GPU reset or reboot), burn it in, return it",
    )
    repair.add_argument("node")
    repair.add_argument("--dry-run", action="store_true")
    repair.add_argument(
        "--approval-timeout",
        type=int,
        default=1800,
        metavar="S",
        help="how long a reset or reboot waits for `trainmedic approve` (default 1800)",
    )
    repair.add_argument("--json", action="store_true")
    restore = add("restore", cmd_restore, "return a repaired node after its burn-in")
    restore.add_argument("node")
    restore.add_argument("--partner", help="known-healthy partner (default: an idle node)")
    restore.add_argument("--dry-run", action="store_true")
    restore.add_argument(
        "--force",
        action="store_true",
        help="return a node trainmedic did not drain (an admin's drain, FAIL, re-drained): "
        "needs --by and --reason, both recorded in the run and its report",
    )
    restore.add_argument("--by", default=None, metavar="NAME", help="who forces it")
    restore.add_argument("--reason", default=None, metavar="TEXT", help="why")
    restore.add_argument("--json", action="store_true")
