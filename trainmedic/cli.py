"""``trainmedic``: the on-call engineer's command line.

Every command that changes something goes through the Prefect API (runs show up in the UI);
bad input gets one line naming the field and value, and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence

from pydantic import ValidationError

from trainmedic.errors import InputError, TrainmedicError
from trainmedic.settings import get_settings

EXIT_INPUT = 2


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2, default=str))


def _validation_message(exc: ValidationError) -> str:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first.get("loc", ())) or "input"
    return f"{field}={first.get('input')!r}: {first.get('msg')}"


# ----------------------------------------------------------------------------- stack


def cmd_up(args: argparse.Namespace) -> int:
    from trainmedic.stack import Stack

    settings = get_settings()
    stack = Stack(settings)
    started = time.monotonic()
    print(f"starting Prefect server at {stack.api_url} (home {settings.prefect_home}) ...")
    stack.up()
    print(f"ready in {time.monotonic() - started:.0f} s: UI {stack.ui_url}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from trainmedic.stack import Stack

    stopped = Stack(get_settings()).down()
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from trainmedic.stack import Stack

    status = Stack(get_settings()).status()
    if args.json:
        _print_json(status)
    else:
        for key, value in status.items():
            print(f"{key:>10}: {value}")
    return 0


# ----------------------------------------------------------------------------- sim


def cmd_sim(args: argparse.Namespace) -> int:
    from trainmedic.models import JobSpec
    from trainmedic.scheduler.sim import SimScheduler
    from trainmedic.sim.cluster import SimCluster

    settings = get_settings()
    cluster = SimCluster(settings.sim_home)
    if args.sim_command == "create":
        hosts = cluster.create(
            args.nodes, gpus_per_node=args.gpus_per_node, inventory_dir=settings.inventory
        )
        (settings.sim_home / "scheduler.json").unlink(missing_ok=True)
        print(f"created {args.nodes} simulated nodes; inventory {hosts}")
        return 0
    if args.sim_command == "inject":
        status = cluster.inject(args.node, args.fault, gpu=args.gpu)
        print(f"{status.name}: {status.fault} (GPU {status.gpu})")
        return 0
    if args.sim_command == "repair":
        print(f"{cluster.repair(args.node).name}: healthy")
        return 0
    scheduler = SimScheduler(settings.sim_home)
    if args.sim_command == "submit":
        job = scheduler.submit(
            JobSpec(
                name=args.name,
                nodes=args.nodes,
                steps=args.steps,
                checkpoint_every=args.checkpoint_every,
            )
        )
        print(job.job_id if not args.json else job.model_dump_json(indent=2))
        return 0
    if args.sim_command == "job-fault":
        scheduler.inject_job_fault(args.job_id, args.kind, batch=args.batch)
        print(f"job {args.job_id}: {args.kind}")
        return 0
    statuses = cluster.statuses()
    nodes = {n.name: n for n in scheduler.nodes()}
    if args.json:
        _print_json([{**s.model_dump(), "scheduler": nodes[s.name].model_dump()} for s in statuses])
    else:
        for s in statuses:
            n = nodes[s.name]
            print(f"{s.name}  {s.fault:<9} {n.state:<10} {n.reason}")
    return 0


# ----------------------------------------------------------------------------- runbooks


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


def _run_runbook(deployment: str, request: object, *, as_json: bool) -> int:
    """Start a runbook through its deployment (so it runs on the worker and shows in the UI),
    show its progress, and return 0 when it completed."""
    from prefect.deployments import run_deployment

    parameters = {"request": request.model_dump(mode="json")}  # type: ignore[attr-defined]
    run = run_deployment(deployment, parameters=parameters, timeout=0)
    print(f"started {run.name}: {_ui_link(run.id)}", file=sys.stderr)
    final = _wait_for_run(run.id, quiet=as_json)
    state = final.state  # type: ignore[attr-defined]
    result: object = None
    if state.is_completed():
        try:
            result = state.result()
        except Exception:  # the result lives with the worker when not persisted
            result = None
    summary = {
        "flow_run_id": str(run.id),
        "name": run.name,
        "state": state.name,
        "url": _ui_link(run.id),
        "result": result.model_dump(mode="json") if hasattr(result, "model_dump") else result,
        "message": state.message,
    }
    if as_json:
        _print_json(summary)
    else:
        print(f"{run.name}: {state.name}" + (f" — {state.message}" if state.message else ""))
    return 0 if state.is_completed() else 1


def _with_prefect() -> None:
    from trainmedic.stack import apply_prefect_env

    apply_prefect_env(get_settings())


def cmd_triage(args: argparse.Namespace) -> int:
    _with_prefect()
    from flows.triage import TriageRequest, triage

    request = TriageRequest(job_id=args.job_id, dry_run=args.dry_run, event="manual")
    if args.local:
        result = triage(request)
        _print_json(result.model_dump()) if args.json else print(result)
        return 0
    return _run_runbook("triage/triage", request, as_json=args.json)


def cmd_restart(args: argparse.Namespace) -> int:
    _with_prefect()
    from flows.restart import RestartRequest

    request = RestartRequest(
        job_id=args.job_id, from_checkpoint=args.from_checkpoint, dry_run=args.dry_run
    )
    return _run_runbook("restart/restart", request, as_json=args.json)


def cmd_restore(args: argparse.Namespace) -> int:
    _with_prefect()
    from flows.restore import RestoreRequest

    request = RestoreRequest(node=args.node, partner=args.partner, dry_run=args.dry_run)
    return _run_runbook("restore-node/restore-node", request, as_json=args.json)


def cmd_approve(args: argparse.Namespace) -> int:
    _with_prefect()
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.responses import SetStateStatus

    from trainmedic.validate import expand_nodelist

    nodes = expand_nodelist(args.nodes) if args.nodes else []
    with get_client(sync_client=True) as client:
        run = _find_run(client, args.run)
        flow_name = client.read_flow(run.flow_id).name
        if not run.state or not run.state.is_paused():
            raise InputError(
                "run",
                args.run,
                f"is {run.state.name if run.state else '?'}, not paused for approval",
            )
        if flow_name == "locate-faulty-nodes":
            decision = "reject" if args.reject else ("approve_subset" if nodes else "approve")
            run_input: dict[str, object] = {"decision": decision, "nodes": nodes, "note": args.note}
        elif flow_name == "rollback":
            if nodes:
                raise InputError("nodes", args.nodes, "a rollback approval takes no nodes")
            run_input = {"approve": not args.reject, "note": args.note}
        else:
            raise InputError("run", args.run, f"flow {flow_name!r} takes no approval")
        response = client.resume_flow_run(run.id, run_input=run_input)
    if response.status == SetStateStatus.REJECT:
        reason = response.details.reason if hasattr(response.details, "reason") else ""
        expired = response.state is not None and response.state.type == StateType.FAILED
        raise InputError(
            "run",
            args.run,
            "approval window has passed" if expired else f"server refused the answer: {reason}",
        )
    answer = "rejected" if args.reject else "approved" + (f" {', '.join(nodes)}" if nodes else "")
    if args.json:
        _print_json(
            {"flow_run_id": str(run.id), "name": run.name, "answer": answer, "run_input": run_input}
        )
    else:
        print(f"{run.name} ({flow_name}): {answer}")
    return 0


def _find_run(client, ref: str):  # type: ignore[no-untyped-def]
    import uuid

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    try:
        return client.read_flow_run(uuid.UUID(ref))
    except ValueError:
        pass
    runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[ref])))
    if not runs:
        raise InputError("run", ref, "no flow run with that id or name")
    return runs[0]


def cmd_runs(args: argparse.Namespace) -> int:
    _with_prefect()
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    from trainmedic.validate import job_id as check_job_id

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
                    "url": _ui_link(run.id),
                }
            )
            if len(rows) >= args.limit:
                break
    if args.json:
        _print_json(rows)
        return 0
    if not rows:
        print("no runs" + (f" for job {wanted}" if wanted else ""))
    for row in rows:
        print(
            f"{(row['started'] or '')[:19]:<20} {row['runbook']:<20} job {row['job_id'] or '-':<8}"
            f" {row['state']:<10} {row['name']}  {row['message'][:60]}"
        )
    return 0


def _ui_link(flow_run_id: object) -> str:
    import os

    return f"{os.environ['PREFECT_UI_URL'].rstrip('/')}/runs/flow-run/{flow_run_id}"


def cmd_watch(args: argparse.Namespace) -> int:
    from trainmedic.stack import apply_prefect_env

    settings = get_settings()
    apply_prefect_env(settings)
    from trainmedic.events import emit
    from trainmedic.intake import Intake
    from trainmedic.scheduler import get_scheduler

    intake = Intake(get_scheduler(settings), settings.home, emit, backfill=args.backfill)
    while True:
        for event in intake.poll():
            print(f"{event.kind} job {event.job_id} ({event.reason or 'no reason'})", flush=True)
        if args.once:
            return 0
        time.sleep(args.interval)


def cmd_emit(args: argparse.Namespace) -> int:
    from trainmedic.stack import apply_prefect_env

    apply_prefect_env(get_settings())
    from trainmedic.events import emit
    from trainmedic.models import JobEvent
    from trainmedic.validate import expand_nodelist

    event = JobEvent(
        kind=args.kind if args.kind.startswith("job.") else f"job.{args.kind}",
        job_id=args.job,
        step=args.step,
        reason=args.reason,
        nodes=tuple(expand_nodelist(args.nodes)) if args.nodes else (),
    )
    print(emit(event))
    return 0


def cmd_breaker(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from trainmedic import safety
    from trainmedic.files import append_line

    settings = get_settings()
    path = settings.action_ledger
    if args.reset:
        who = safety.ActionEntry(
            kind=safety.ActionKind.breaker_reset,
            target="on-call",
            at=datetime.now(UTC),
            flow_run="cli",
        )
        append_line(path, safety.entry_line(who))
    entries = safety.parse_entries(path.read_text()) if path.exists() else []
    state = safety.breaker_state(entries, datetime.now(UTC), settings.circuit_breaker())
    if args.json:
        _print_json(state.model_dump())
    else:
        print(state.describe())
    return 0


def cmd_notify(args: argparse.Namespace) -> int:
    import os

    _with_prefect()
    from trainmedic.notifications import install

    # The URL usually carries a token: take it from the environment rather than argv (argv
    # is visible to every user of the host in `ps`).
    url = os.environ.get("TRAINMEDIC_WEBHOOK_URL") if args.webhook_from_env else None
    if args.webhook_from_env and not url:
        raise InputError("TRAINMEDIC_WEBHOOK_URL", "", "is not set")
    automation = install(block_name=args.block, webhook_url=url)
    print(f"automation {automation.name} -> block {args.block}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from trainmedic.demo import run_demo

    return run_demo(nodes=args.nodes, fault=args.fault, stop=args.stop)


# ----------------------------------------------------------------------------- parser


def _add_oncall_parsers(add: Callable[..., argparse.ArgumentParser]) -> None:
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

    restore = add("restore", cmd_restore, "return a repaired node after it passes a pair test")
    restore.add_argument("node")
    restore.add_argument("--partner", help="known-healthy partner (default: an idle node)")
    restore.add_argument("--dry-run", action="store_true")
    restore.add_argument("--json", action="store_true")

    approve = add("approve", cmd_approve, "answer a runbook paused for approval")
    approve.add_argument("run", help="flow run id or name")
    approve.add_argument("--reject", action="store_true")
    approve.add_argument("--nodes", help="approve only these nodes, e.g. node[003,017]")
    approve.add_argument("--note", default="", help="why (goes into the report)")
    approve.add_argument("--json", action="store_true")

    breaker = add("breaker", cmd_breaker, "the circuit breaker in front of destructive actions")
    breaker.add_argument(
        "--reset",
        action="store_true",
        help="close it again (recorded) after checking what the automation did",
    )
    breaker.add_argument("--json", action="store_true")

    notify = add(
        "notify",
        cmd_notify,
        "notify on-call when a runbook fails or waits for "
        "approval (Prefect automation -> notification block)",
    )
    notify.add_argument(
        "--block",
        default="trainmedic-oncall",
        help="notification block to send to (e.g. an existing SlackWebhook)",
    )
    notify.add_argument(
        "--webhook-from-env",
        action="store_true",
        help="first save a webhook block with the URL in TRAINMEDIC_WEBHOOK_URL",
    )

    runs = add("runs", cmd_runs, "runbook history with state and outcome")
    runs.add_argument("--job", help="only runs about this job id")
    runs.add_argument("--limit", type=int, default=20)
    runs.add_argument("--json", action="store_true")


def _add_sim_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    sim = add("sim", cmd_sim, "the simulated cluster (hardware faults, jobs)")
    sim_sub = sim.add_subparsers(dest="sim_command", required=True)
    create = sim_sub.add_parser("create", help="create N healthy nodes and their inventory")
    create.add_argument("--nodes", type=int, default=16)
    create.add_argument("--gpus-per-node", type=int, default=4)
    inject = sim_sub.add_parser("inject", help="put a node into a fault state")
    inject.add_argument("node")
    inject.add_argument("fault", help="healthy|xid79|ecc|nvlink|slow|down|overheat")
    inject.add_argument("--gpu", type=int, default=0)
    repair = sim_sub.add_parser("repair", help="repair a node (back to healthy)")
    repair.add_argument("node")
    status = sim_sub.add_parser("status", help="nodes with fault and scheduler state")
    status.add_argument("--json", action="store_true")
    submit = sim_sub.add_parser("submit", help="submit a simulated training job")
    submit.add_argument("--name", default="pretrain")
    submit.add_argument("--nodes", type=int, default=4)
    submit.add_argument("--steps", type=int, default=400)
    submit.add_argument("--checkpoint-every", type=int, default=50)
    submit.add_argument("--json", action="store_true")
    fault = sim_sub.add_parser("job-fault", help="make a job hang/crash, or poison a batch")
    fault.add_argument("job_id")
    fault.add_argument("kind")
    fault.add_argument("--batch", type=int)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainmedic", description="Remediation runbooks for pre-training clusters."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(
        name: str,
        handler: Callable[[argparse.Namespace], int],
        help_text: str,
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    add("up", cmd_up, "start the local Prefect server, deployments, worker (and sim exporter)")
    add("down", cmd_down, "stop everything `up` started")
    add("status", cmd_status, "show what is running").add_argument("--json", action="store_true")

    demo = add("demo", cmd_demo, "end-to-end demo: sim cluster, Xid 79 on one node, triage")
    demo.add_argument("--nodes", type=int, default=16)
    demo.add_argument("--fault", default="xid79")
    demo.add_argument(
        "--stop",
        action="store_true",
        help="stop the server afterwards (default: leave it up to explore the UI)",
    )

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

    _add_oncall_parsers(add)

    triage = add("triage", cmd_triage, "run the triage runbook on a failed job")
    triage.add_argument("job_id")
    triage.add_argument("--dry-run", action="store_true", help="diagnose and plan only")
    triage.add_argument(
        "--local", action="store_true", help="run the flow in this process instead of on the worker"
    )
    triage.add_argument("--json", action="store_true")

    _add_sim_parser(add)

    for module in ("trainmedic.diagnosis.cli", "trainmedic.locate_cli"):
        try:
            extension = __import__(module, fromlist=["add_parser"])
        except ModuleNotFoundError:
            continue
        extension.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        handler = getattr(args, "handler", None)
        if handler is None:
            return int(args.func(args))  # extension subcommands register run as func
        return int(handler(args))
    except InputError as exc:
        print(f"trainmedic: invalid input: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except ValidationError as exc:
        print(f"trainmedic: invalid input: {_validation_message(exc)}", file=sys.stderr)
        return EXIT_INPUT
    except TrainmedicError as exc:
        print(f"trainmedic: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
