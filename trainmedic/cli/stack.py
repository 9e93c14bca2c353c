"""``trainmedic up | down | status | demo``: the embedded stack, and what on-call sees at a
glance: the services (the intake with its lag), runs waiting for a human, the breaker, and the
nodes out of service with whose drain each is."""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import Any

from trainmedic.cli.common import AddCommand, print_json
from trainmedic.core.errors import TrainmedicError
from trainmedic.core.settings import Settings, get_settings

# What `status` says of the worker (TRAINMEDIC_WARM_WORKER).
WORKER_KINDS = {
    "warm": "runs fork from its warm interpreter",
    "process": "a new Python process per run",
}


def cmd_up(args: argparse.Namespace) -> int:
    from trainmedic.stack import Stack

    settings = get_settings()
    stack = Stack(settings)
    started = time.monotonic()
    print(f"starting Prefect server at {stack.api_url} (home {settings.prefect_home}) ...")
    stack.up()
    print(f"ready in {time.monotonic() - started:.0f} s: UI {stack.ui_url}")
    print(
        f"intake: polling the {settings.scheduler} scheduler every {settings.intake_interval_s:g} s"
    )
    if settings.webhook_url is not None:
        from trainmedic.stack import apply_prefect_env

        apply_prefect_env(settings)
        from trainmedic.adapters.notifications import install

        install(
            block_name=settings.notify_block,
            webhook_url=settings.webhook_url.get_secret_value(),
        )
        print(f"on-call: pages and failed runs go to block {settings.notify_block}")
    else:
        print("on-call: no TRAINMEDIC_WEBHOOK_URL: pages reach nobody (see `trainmedic notify`)")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from trainmedic.stack import Stack

    stopped = Stack(get_settings()).down()
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Works with the server down too: what needs the server says it could not be read."""
    from trainmedic.stack import Stack, apply_prefect_env

    settings = get_settings()
    stack = Stack(settings)
    status: dict[str, Any] = stack.status()
    status["intake"] = intake_view(settings, status.pop("intake"))
    apply_prefect_env(settings)  # before Prefect reads its settings
    from prefect.client.orchestration import get_client

    # The API every other command talks to (the environment's, else this installation's).
    with get_client(sync_client=True, httpx_settings={"timeout": 5}) as client:
        status["healthy"] = client.api_healthcheck() is None
        status["api_url"] = str(client.api_url)
    if status["healthy"]:
        status |= server_view(settings)
    status["nodes_out"] = nodes_out(settings, with_records=bool(status["healthy"]))
    if args.json:
        print_json(status)
        return 0
    print(f"  api: {status['api_url']} ({'healthy' if status['healthy'] else 'NOT answering'})")
    kinds = {"worker": WORKER_KINDS[str(status["worker_kind"])]}
    for name in ("server", "worker", "exporter"):
        pid = status[name]
        kind = f", {kinds[name]}" if name in kinds else ""
        print(f"  {name}: {f'running (pid {pid}{kind})' if pid else 'stopped'}")
    intake = status["intake"]
    running = f"running (pid {intake['pid']})" if intake["pid"] else "STOPPED: no automatic triage"
    print(f"  intake: {running}; {intake['state']}")
    if status["healthy"]:
        print(f"  breaker: {status['breaker']}")
        print(f"  on-call: {status['notifications']}")
        waiting = status["waiting_for_a_human"]
        print(f"  waiting for a human: {len(waiting) or 'none'}")
        for run in waiting:
            print(
                f"    {run['name']} ({run['runbook']}, job {run['job_id'] or '-'}) since "
                f"{run['since']}: {run['answer']}"
            )
    nodes = status["nodes_out"]
    if isinstance(nodes, str):
        print(f"  nodes out: {nodes}")
    else:
        print(f"  nodes out: {len(nodes) or 'none'}")
        for node in nodes:
            print(f"    {node['name']} {node['state']} [{node['owner']}] {node['reason']}")
    return 0


def intake_view(settings: Settings, pid: int | None) -> dict[str, Any]:
    from trainmedic.adapters.intake import intake_status

    now = datetime.now(UTC)
    recorded = intake_status(settings.home)
    return {
        "pid": pid,
        "state": recorded.describe(now) if recorded else "no pass yet",
        "lag_s": round(recorded.lag_s(now), 1) if recorded else None,
        "waiting": len(recorded.pending) if recorded else 0,
        "last_error": recorded.last_error if recorded else "",
    }


def server_view(settings: Settings) -> dict[str, Any]:
    """The breaker, the notifications and the runs paused for a human, from the server."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    from trainmedic.adapters.notifications import installed
    from trainmedic.adapters.server_state import ServerState
    from trainmedic.decisions.guard import breaker_state, circuit_breaker

    now = datetime.now(UTC)
    breaker = breaker_state(ServerState(settings.cluster).actions(), now, circuit_breaker(settings))
    paused = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED]))
    )
    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        runs = client.read_flow_runs(flow_run_filter=paused, limit=200)
    waiting = []
    for run in runs:
        request = (run.parameters or {}).get("request") or {}
        waiting.append(
            {
                "name": run.name,
                "runbook": flows.get(run.flow_id, "?"),
                "job_id": request.get("job_id") if isinstance(request, dict) else None,
                "since": f"{run.state.timestamp:%Y-%m-%d %H:%M:%S}Z" if run.state else "?",
                "answer": f"trainmedic approve {run.name} [--reject] --reason '...'",
            }
        )
    return {
        "breaker": breaker.describe(),
        "breaker_open": breaker.open,
        "notifications": "automations installed"
        if installed()
        else "NOT installed: pages reach nobody (trainmedic notify --webhook-from-env)",
        "waiting_for_a_human": waiting,
    }


def nodes_out(settings: Settings, *, with_records: bool) -> list[dict[str, str]] | str:
    """Drained and down nodes with their reasons, and whose drain each is (trainmedic's own
    only with the server's drain records at hand)."""
    from trainmedic.adapters.scheduler import get_scheduler
    from trainmedic.core.models import NodeState
    from trainmedic.decisions.ownership import drain_owner

    try:
        nodes = [
            n
            for n in get_scheduler(settings).nodes()
            if n.state in (NodeState.DRAINED, NodeState.DOWN)
        ]
    except TrainmedicError as exc:
        return f"the scheduler could not be read: {exc}"
    records = {}
    if with_records:
        from trainmedic.adapters.server_state import ServerState

        records = {r.node: r for r in ServerState(settings.cluster).drain_records()}
    return [
        {
            "name": n.name,
            "state": str(n.state),
            "reason": n.reason,
            "owner": str(drain_owner(n, records.get(n.name)).owner)
            if with_records
            else "unknown (server down)",
        }
        for n in nodes
    ]


def cmd_demo(args: argparse.Namespace) -> int:
    from trainmedic.demo import run_demo

    return run_demo(nodes=args.nodes, fault=args.fault, stop=args.stop)


def register(add: AddCommand) -> None:
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
