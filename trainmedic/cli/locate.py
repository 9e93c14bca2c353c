"""``trainmedic locate [--json] [--simulate N --faulty NODE,... [--slow NODE,...]] NODE_EXPR``

Without ``--simulate`` it runs the ``locate-faulty-nodes`` flow against the Prefect API of
the environment (the run shows up in the UI), on the real or simulated cluster of the
inventory: in this process when it only tests, through its deployment on the worker (like
every runbook that acts) with ``--isolate``, so the drains are made where the policy and the
guard are the installation's. With ``--simulate N`` it runs the same algorithm on N simulated
nodes (``node0001``..) with an oracle fabric, no Ansible, no Prefect: for trying the
algorithm and for benchmarks. A bad node expression prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TextIO

from trainmedic.cli.common import AddCommand
from trainmedic.core import validate
from trainmedic.core.errors import InputError
from trainmedic.core.settings import get_settings

__all__ = ["register", "run", "run_preflight"]


def register(add: AddCommand) -> None:
    check = add(
        "preflight",
        run_preflight,
        "are these nodes fit to start a job (nvidia-smi, recent Xid, optional pair test)",
    )
    check.add_argument("nodes", metavar="NODE_EXPR", help="e.g. node[001-064], $SLURM_JOB_NODELIST")
    check.add_argument("--pair-test", action="store_true", help="also pair-test the fit nodes")
    check.add_argument(
        "--drain", action="store_true", help="drain the unfit ones (through the deployment)"
    )
    check.add_argument("--xid-window", type=float, default=86_400, metavar="S")
    check.add_argument("--json", action="store_true")

    parser = add(
        "locate",
        run,
        "find faulty and slow nodes with pairwise allgather tests",
        "Locate faulty and fail-slow nodes among NODE_EXPR (a Slurm host list "
        "such as node[001-064]) with two rounds of pair tests; optionally isolate them.",
    )
    parser.add_argument("nodes", nargs="?", metavar="NODE_EXPR", help="nodes to test")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--seed", type=int, default=None, help="pairing seed")
    parser.add_argument("--slow-ratio", type=float, default=0.5, help="slow below this share")
    parser.add_argument(
        "--concurrency", type=int, default=None, help="tests running at once (flow: 256)"
    )
    sim = parser.add_argument_group("simulation (no cluster needed)")
    sim.add_argument("--simulate", type=int, metavar="N", help="N simulated nodes")
    sim.add_argument("--faulty", default="", metavar="NODES", help="simulated broken nodes")
    sim.add_argument("--slow", default="", metavar="NODES", help="simulated slow nodes")
    sim.add_argument("--test-seconds", type=float, default=None, help="simulated test time")
    flow = parser.add_argument_group("the runbook")
    flow.add_argument("--isolate", action="store_true", help="drain and isolate what is found")
    flow.add_argument("--dry-run", action="store_true", help="test and decide, drain nothing")
    flow.add_argument("--test-timeout", type=int, default=None, metavar="S")
    flow.add_argument("--job-id", default=None, help="the job that led here")


def run(args: argparse.Namespace, *, stdout: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    if args.simulate is not None:
        summary = _simulate(args)
    else:
        if args.faulty or args.slow or args.test_seconds is not None:
            raise InputError("faulty", args.faulty or args.slow, "only with --simulate N")
        request = _request(args)
        if args.isolate:
            from trainmedic.cli.runbooks import run_runbook

            return run_runbook(
                "locate-faulty-nodes/locate-faulty-nodes", request, as_json=args.json
            )
        from flows.locate import locate_faulty_nodes

        summary = locate_faulty_nodes(request).summary()
    if args.json:
        out.write(json.dumps(summary, indent=2) + "\n")
    else:
        out.write(_human(summary))
    return 0


def run_preflight(args: argparse.Namespace) -> int:
    """0: every node fit; 4: unfit nodes (drained with --drain, else left for a human)."""
    from trainmedic.adapters.ansible import Inventory
    from trainmedic.cli.common import EXIT_HUMAN, print_json, with_prefect

    names = _names(args.nodes, "nodes")
    if not names:
        raise InputError("nodes", args.nodes, "no nodes to check")
    Inventory(get_settings().inventory).check(names)
    with_prefect()
    from flows.preflight import PreflightRequest, preflight

    request = PreflightRequest(
        nodes=names, pair_test=args.pair_test, drain=args.drain, xid_window_s=args.xid_window
    )
    if args.drain:
        from trainmedic.cli.runbooks import run_runbook

        return run_runbook("preflight/preflight", request, as_json=args.json)
    result = preflight(request)
    if args.json:
        print_json(result.model_dump(mode="json"))
    else:
        print(f"{len(result.fit)} fit, {len(result.unfit)} unfit ({result.wall_s} s)")
        for node, problems in sorted(result.unfit.items()):
            print(f"  {node}: {'; '.join(problems)}")
    return EXIT_HUMAN if result.unfit else 0


def _names(expr: str, field: str) -> list[str]:
    return validate.expand_nodelist(expr, field) if expr.strip() else []


def _simulate(args: argparse.Namespace) -> dict[str, object]:
    from trainmedic.locate.simulation import DEFAULT_TEST_SECONDS, locate_simulated, simulated_nodes

    everyone = simulated_nodes(args.simulate)
    nodes = everyone
    if args.nodes:
        nodes = _names(args.nodes, "nodes")
        outside = sorted(set(nodes) - set(everyone))
        if outside:
            raise InputError("nodes", outside[0], f"not one of the {args.simulate} simulated nodes")
    started = time.perf_counter()
    report = locate_simulated(
        nodes,
        _names(args.faulty, "faulty"),
        _names(args.slow, "slow"),
        seed=args.seed,
        slow_ratio=args.slow_ratio,
        test_seconds=DEFAULT_TEST_SECONDS if args.test_seconds is None else args.test_seconds,
        **({"concurrency": args.concurrency} if args.concurrency else {}),
    )
    summary = report.summary(time.perf_counter() - started)
    return {**summary, "healthy": len(report.healthy), "simulated": True}


def _request(args: argparse.Namespace) -> object:
    if not args.nodes:
        raise InputError("nodes", None, "give the nodes to test, e.g. node[001-016]")
    settings = get_settings()
    names = _names(args.nodes, "nodes")
    from trainmedic.adapters.ansible import Inventory

    # Before any Prefect import or run: a typo fails in a second, not after a server call.
    Inventory(settings.inventory).check(names)
    from trainmedic.cli.common import with_prefect

    with_prefect()
    from flows.locate import LocateRequest

    return LocateRequest(
        nodes=names,
        seed=args.seed,
        slow_ratio=args.slow_ratio,
        **({"concurrency": args.concurrency} if args.concurrency else {}),
        test_timeout_s=args.test_timeout,
        isolate=args.isolate,
        dry_run=args.dry_run,
        job_id=args.job_id,
    )


def _human(summary: dict[str, object]) -> str:
    def names(key: str) -> str:
        value = summary.get(key) or []
        return ", ".join(str(v) for v in value) if isinstance(value, list) and value else "—"

    lines = [
        f"faulty:       {names('faulty')}",
        f"slow:         {names('slow')}",
        f"undetermined: {names('undetermined')}",
        f"rounds {summary['rounds']}, tests {summary['tests_run']}, {summary['wall_s']} s",
    ]
    if summary.get("drained"):
        lines.append(f"drained:      {names('drained')}")
    return "\n".join(lines) + "\n"
