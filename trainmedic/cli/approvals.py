"""``trainmedic approve RUN``: answer a runbook paused for approval."""

from __future__ import annotations

import argparse
import getpass

from trainmedic.cli.common import AddCommand, print_json, with_prefect
from trainmedic.core.errors import InputError

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
        elif flow_name == "rollback":
            if nodes:
                raise InputError("nodes", args.nodes, "a rollback approval takes no nodes")
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


def find_run(client, ref: str):  # type: ignore[no-untyped-def]
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


def register(add: AddCommand) -> None:
    approve = add("approve", cmd_approve, "answer a runbook paused for approval")
    approve.add_argument("run", help="flow run id or name")
    approve.add_argument("--reject", action="store_true")
    approve.add_argument("--nodes", help="approve only these nodes, e.g. node[003,017]")
    approve.add_argument(
        "--reason", "--note", dest="reason", default="", help="why (recorded in the run's report)"
    )
    approve.add_argument("--by", default=None, help="who answers (default: this user)")
    approve.add_argument("--json", action="store_true")
