"""What humans answer: ``trainmedic approve RUN`` (a runbook paused for approval) and
``trainmedic correct RUN_OR_JOB --category X`` (the true cause of a failure, learnt: later
failures with the same lines get it); ``trainmedic corrections [--export]`` lists them."""

from __future__ import annotations

import argparse
import getpass
from typing import TYPE_CHECKING

from trainmedic.cli.common import AddCommand, print_json, with_prefect
from trainmedic.core.errors import InputError

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.objects import FlowRun

# Runbooks whose pause is the shared isolation step's "drain these nodes?" (flows.isolate).
ISOLATING = ("locate-faulty-nodes", "triage")


def cmd_approve(args: argparse.Namespace) -> int:
    with_prefect()
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.responses import SetStateStatus

    from trainmedic.core.validate import expand_nodelist

    nodes = expand_nodelist(args.nodes) if args.nodes else []
    with get_client(sync_client=True) as client:
        run = find_run(client, args.run)
        flow_name = client.read_flow(run.flow_id).name
        if not run.state or not run.state.is_paused():
            raise InputError(
                "run",
                args.run,
                f"is {run.state.name if run.state else '?'}, not paused for approval",
            )
        by = args.by or getpass.getuser()
        if flow_name in ISOLATING:
            decision = "reject" if args.reject else ("approve_subset" if nodes else "approve")
            run_input: dict[str, object] = {
                "decision": decision,
                "nodes": nodes,
                "note": args.reason,
                "by": by,
            }
        elif flow_name in ("rollback", "repair-node"):
            if nodes:
                raise InputError("nodes", args.nodes, f"a {flow_name} approval takes no nodes")
            run_input = {"approve": not args.reject, "note": args.reason, "by": by}
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
        print_json(
            {"flow_run_id": str(run.id), "name": run.name, "answer": answer, "run_input": run_input}
        )
    else:
        print(f"{run.name} ({flow_name}): {answer}")
    return 0


# How many same-named runs the refusal lists: enough to pick from, still one line.
AMBIGUOUS_SHOWN = 10


def find_run(client: SyncPrefectClient, ref: str) -> FlowRun:
    """The flow run ``ref`` names: its id, or a name exactly one run has. A name several runs
    share is refused, listing their ids and states: approving or cancelling the wrong run is
    a destructive mistake, so the human picks the id rather than us picking one."""
    import uuid

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.exceptions import ObjectNotFound

    try:
        run_id = uuid.UUID(ref)
    except ValueError:
        pass
    else:
        try:
            return client.read_flow_run(run_id)
        except ObjectNotFound:
            raise InputError("run", ref, "no flow run with that id") from None
    runs = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[ref])),
        sort=FlowRunSort.EXPECTED_START_TIME_DESC,
        limit=AMBIGUOUS_SHOWN + 1,
    )
    if not runs:
        raise InputError("run", ref, "no flow run with that id or name")
    if len(runs) > 1:
        shown = ", ".join(
            f"{r.id} ({r.state.name if r.state else '?'})" for r in runs[:AMBIGUOUS_SHOWN]
        )
        count = f"over {AMBIGUOUS_SHOWN}" if len(runs) > AMBIGUOUS_SHOWN else str(len(runs))
        raise InputError("run", ref, f"{count} flow runs have that name: {shown}; give the run id")
    return runs[0]


def cmd_correct(args: argparse.Namespace) -> int:
    import secrets
    from datetime import UTC, datetime
    from pathlib import Path

    from trainmedic.adapters.scheduler import get_scheduler
    from trainmedic.adapters.server_state import ServerState
    from trainmedic.core.settings import get_settings
    from trainmedic.core.taxonomy import Category
    from trainmedic.core.validate import JOB_ID_RE, hostname, safe_text
    from trainmedic.decisions.corrections import fingerprint
    from trainmedic.diagnosis import LogSource, site_catalogue
    from trainmedic.state.records import Correction

    try:
        category = Category(args.category)
    except ValueError:
        raise InputError(
            "category", args.category, f"not one of {', '.join(c.value for c in Category)}"
        ) from None
    host = hostname(args.host, "host") if args.host else None
    reason = safe_text(args.reason, "reason") if args.reason else ""
    with_prefect()
    job_id = args.target
    if not JOB_ID_RE.match(job_id):
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            run = find_run(client, args.target)
        request = (run.parameters or {}).get("request") or {}
        job_id = request.get("job_id") if isinstance(request, dict) else None
        if not job_id:
            raise InputError("run", args.target, "is not about a job (no job_id in its request)")
    job = get_scheduler().job(job_id)
    logs = sorted(p for p in Path(job.log_dir).glob("*") if p.is_file())
    lines = fingerprint([LogSource.from_path(p) for p in logs], site_catalogue())
    if not lines:
        raise InputError("job", job_id, "its logs end with no error line to learn from")
    host_template = None
    if host is not None:
        here = [line for line in lines if line.host == host]
        if not here:
            raise InputError(
                "host", host, f"none of the lines telling job {job_id}'s failure is in its logs"
            )
        host_template = here[-1].template
    correction = Correction(
        id=secrets.token_hex(4),
        job_id=job.job_id,
        category=str(category),
        templates=tuple(line.template for line in lines),
        host_template=host_template,
        host=host,
        examples=tuple(line.text for line in lines),
        by=args.by or getpass.getuser(),
        reason=reason,
        at=datetime.now(UTC),
    )
    ServerState(get_settings().cluster).record_correction(correction)
    if args.json:
        print_json(correction.model_dump(mode="json"))
        return 0
    print(
        f"correction {correction.id}: job {job.job_id} is {category}"
        + (f" on {host}" if host else "")
    )
    print("later failures whose logs end with these lines get it:")
    for line in lines:
        print(f"  {line.text}")
    return 0


def cmd_corrections(args: argparse.Namespace) -> int:
    from trainmedic.adapters.server_state import ServerState
    from trainmedic.core.settings import get_settings
    from trainmedic.decisions.corrections import as_overlay

    with_prefect()
    found = ServerState(get_settings().cluster).corrections()
    if args.export:
        print(as_overlay(found), end="")
        return 0
    if args.json:
        print_json([c.model_dump(mode="json") for c in found])
        return 0
    if not found:
        print("no corrections")
    for c in found:
        print(
            f"{c.at:%Y-%m-%d %H:%M}Z {c.id} job {c.job_id} -> {c.category}"
            f"{f' on {c.host}' if c.host else ''} by {c.by}: {c.reason or '-'}"
        )
    return 0


def register(add: AddCommand) -> None:
    correct = add(
        "correct",
        cmd_correct,
        "record the true cause of a job's failure; later failures with the same lines get it",
    )
    correct.add_argument("target", metavar="RUN_OR_JOB", help="a job id, or a triage run's name")
    correct.add_argument("--category", required=True, help="the taxonomy label, e.g. StorageError")
    correct.add_argument("--host", help="the node where the fault started")
    correct.add_argument("--reason", default="", help="why (kept with the correction)")
    correct.add_argument("--by", default=None, help="who corrects (default: this user)")
    correct.add_argument("--json", action="store_true")
    listing = add("corrections", cmd_corrections, "the human corrections the diagnosis applies")
    listing.add_argument("--json", action="store_true")
    listing.add_argument(
        "--export", action="store_true", help="print them as overlay signatures (TOML)"
    )

    approve = add("approve", cmd_approve, "answer a runbook paused for approval")
    approve.add_argument("run", help="flow run id or name")
    approve.add_argument("--reject", action="store_true")
    approve.add_argument("--nodes", help="approve only these nodes, e.g. node[003,017]")
    approve.add_argument(
        "--reason", "--note", dest="reason", default="", help="why (recorded in the run's report)"
    )
    approve.add_argument("--by", default=None, help="who answers (default: this user)")
    approve.add_argument("--json", action="store_true")
