"""``trainmedic up | down | status | demo``: the embedded stack."""

from __future__ import annotations

import argparse
import time

from trainmedic.cli.common import AddCommand, print_json
from trainmedic.core.settings import get_settings


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
        print_json(status)
    else:
        for key, value in status.items():
            print(f"{key:>10}: {value}")
    return 0


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
