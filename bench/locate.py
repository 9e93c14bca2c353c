"""Benchmark: locate faulty and slow nodes with two-round pairwise allgather tests.

    .venv/bin/python bench/locate.py [--test-seconds 0.05] [--concurrency 512] [--repeat 3]

For simulated clusters of 16..1024 nodes with 1, 2 and 1% bad nodes (half faulty, half
slow), plus two stress rows near N/4 and N/3, it runs :func:`trainmedic.locate.locate`
on a threaded executor in which every test sleeps ``--test-seconds`` and a round's tests
run concurrently, and measures the wall time (median of ``--repeat`` runs). It compares:

* sequential: every node tested alone against a known-good reference, one after the
  other: N tests, N x test time;
* bisection: test the whole suspect set as one group, split every failed group in halves
  and test the halves concurrently, down to single nodes (tested with a reference).
  Optimistic: a group test of any size is assumed to take one test time and to catch a slow
  member, and no retries.

Both baselines are computed from test counts, not slept. Exit status 1 when a row misses
the goal: exactly the bad nodes, in 2 rounds whenever 4 * bad + 2 <= N (at most 3 below
N/3).

    .venv/bin/python bench/locate.py --real-flow [--sizes 64,256,1024] [--test-seconds 5]

runs the real runbook instead: the `locate-faulty-nodes` flow on a Prefect server, its
nodes held, every pair test a real ansible-runner run of playbooks/nccl_pair_test.yml on a
simulated cluster of N nodes (1 % bad, at least 2: half with a dead link, half slow), each
simulated test taking ``--test-seconds``. Per size: wall time from the flow's start to its
result, over one test time, against the goal of 2 x test time + 20 s. The simulated nodes'
tools run on this machine's CPUs, which real nodes would not use.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from trainmedic.locate import LocateReport, locate
from trainmedic.locate.simulation import (
    DEFAULT_CONCURRENCY,
    DEFAULT_TEST_SECONDS,
    SimulatedFabric,
    ThreadedExecutor,
    simulated_nodes,
)

SIZES = (16, 64, 256, 1024)


@dataclass(frozen=True)
class Scenario:
    nodes: int
    faulty: int
    slow: int
    label: str

    @property
    def bad(self) -> int:
        return self.faulty + self.slow


@dataclass(frozen=True)
class Row:
    scenario: Scenario
    exact: bool
    goal: bool
    rounds: int
    batches: int
    tests: int
    wall_s: float
    algo_s: float
    seq_tests: int
    bisect_tests: int
    bisect_levels: int


def scenarios(sizes: Sequence[int], stress: bool = True) -> list[Scenario]:
    out: list[Scenario] = []
    for n in sizes:
        seen: set[int] = set()
        for label, bad in (("1", 1), ("2", 2), ("1%", max(1, round(n / 100)))):
            if bad in seen:
                continue
            seen.add(bad)
            out.append(Scenario(n, (bad + 1) // 2, bad // 2, label))
    for n in (256,) if stress else ():
        for label, bad in (("~N/4", (n - 2) // 4), ("~N/3", (n - 1) // 3)):
            out.append(Scenario(n, (bad + 1) // 2, bad // 2, label))
    return out


def bisect_cost(nodes: Sequence[str], bad: set[str]) -> tuple[int, int]:
    """(tests, levels) of recursive halving; the groups of one level run concurrently."""
    tests = levels = 0
    level = [list(nodes)]
    while level:
        levels += 1
        tests += len(level)
        following = []
        for group in level:
            if len(group) > 1 and bad.intersection(group):
                half = len(group) // 2
                following += [group[:half], group[half:]]
        level = following
    return tests, levels


def run_one(
    scenario: Scenario, test_seconds: float, concurrency: int, seed: int, repeat: int
) -> Row:
    nodes = simulated_nodes(scenario.nodes)
    rng = random.Random(seed)
    chosen = rng.sample(nodes, scenario.bad)
    faulty, slow = set(chosen[: scenario.faulty]), set(chosen[scenario.faulty :])
    walls: list[float] = []
    algo: list[float] = []
    report: LocateReport | None = None
    batches = 0
    for _ in range(repeat):
        fabric = SimulatedFabric(faulty, slow)
        with ThreadedExecutor(fabric, test_seconds=test_seconds, concurrency=concurrency) as ex:
            start = time.perf_counter()
            report = locate(nodes, ex)
            walls.append(time.perf_counter() - start)
            algo.append(walls[-1] - ex.busy_s)
            batches = ex.batches
    assert report is not None
    exact = set(report.faulty) == faulty and set(report.slow) == slow and not report.undetermined
    want_two = 4 * scenario.bad + 2 <= scenario.nodes
    goal = exact and (report.rounds == 2 if want_two else report.rounds <= 3)
    bisect_tests, bisect_levels = bisect_cost(nodes, faulty | slow)
    return Row(
        scenario=scenario,
        exact=exact,
        goal=goal,
        rounds=report.rounds,
        batches=batches,
        tests=report.tests_run,
        wall_s=statistics.median(walls),
        algo_s=statistics.median(algo),
        seq_tests=scenario.nodes,
        bisect_tests=bisect_tests,
        bisect_levels=bisect_levels,
    )


def table(rows: Sequence[Row], t: float) -> str:
    head = (
        "| nodes | bad | faulty+slow | exact | rounds | batches | tests | wall s | wall/test "
        "| overhead vs rounds | overhead vs batches | algorithm ms | seq tests | seq wall s "
        "| bisect tests | bisect levels | bisect wall s |"
    )
    lines = [head, "|" + "---:|" * (head.count("|") - 1)]
    for r in rows:
        s = r.scenario
        lines.append(
            f"| {s.nodes} | {s.label} | {s.faulty}+{s.slow} | {'yes' if r.exact else 'NO'} "
            f"| {r.rounds} | {r.batches} | {r.tests} | {r.wall_s:.3f} | {r.wall_s / t:.2f} "
            f"| {(r.wall_s - r.rounds * t) / r.wall_s:.0%} "
            f"| {(r.wall_s - r.batches * t) / r.wall_s:.0%} | {r.algo_s * 1000:.1f} "
            f"| {r.seq_tests} | {r.seq_tests * t:.2f} "
            f"| {r.bisect_tests} | {r.bisect_levels} | {r.bisect_levels * t:.2f} |"
        )
    return "\n".join(lines)


def real_flow(sizes: Sequence[int], test_seconds: float, concurrency: int | None, seed: int) -> int:
    """The locate runbook itself, per size; figures printed; 1 when a size found wrong nodes."""
    import tempfile
    from pathlib import Path

    sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests")]
    from support.stack import embedded_stack

    from flows.locate import LocateRequest, locate_faulty_nodes
    from trainmedic.core import validate
    from trainmedic.sim.cluster import SimCluster

    print(
        "| nodes | bad | exact | rounds | tests | wall s | wall / test | goal (2 x test + 20 s) |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---|")
    wrong = 0
    for size in sizes:
        env = {
            "TRAINMEDIC_SIM_TEST_SECONDS": str(test_seconds),
            "PREFECT_LOGGING_LEVEL": "WARNING",
        }
        root = Path(tempfile.mkdtemp(prefix=f"trainmedic-locate-{size}-"))
        with embedded_stack(root, worker=False, nodes=size, gpus_per_node=1, env=env) as (
            settings,
            _,
        ):
            cluster = SimCluster(settings.sim_home)
            names = cluster.names()
            bad = random.Random(seed).sample(names, max(2, size // 100))
            faulty, slow = sorted(bad[: len(bad) // 2]), sorted(bad[len(bad) // 2 :])
            for node in faulty:
                cluster.inject(node, "link")
            for node in slow:
                cluster.inject(node, "slow")
            # The runbook's own batching (tests at once, tests per ansible-runner run) unless
            # --concurrency says otherwise.
            sizing = {"concurrency": concurrency} if concurrency else {}
            request = LocateRequest(
                nodes=validate.compress_nodelist(names),
                seed=seed,
                test_timeout_s=max(5, int(4 * test_seconds) + 5),
                **sizing,
            )
            started = time.perf_counter()
            result = locate_faulty_nodes(request)
            wall = time.perf_counter() - started
        exact = result.faulty == faulty and result.slow == slow and not result.undetermined
        wrong += not exact
        goal = 2 * test_seconds + 20
        print(
            f"| {size} | {len(bad)} | {'yes' if exact else 'NO'} | {result.rounds} | "
            f"{result.tests_run} | {wall:.1f} | {wall / test_seconds:.1f} | "
            f"{'met' if wall <= goal else 'missed'} ({goal:.0f} s) |",
            flush=True,
        )
    return 1 if wrong else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--test-seconds", type=float, help=f"default {DEFAULT_TEST_SECONDS}; 5 with --real-flow"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        help=f"default {DEFAULT_CONCURRENCY}; with --real-flow the runbook's own (256)",
    )
    parser.add_argument("--sizes", help="default 16,64,256,1024; 64,256,1024 with --real-flow")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--no-stress", action="store_true", help="skip the 256-node rows near N/4 and N/3"
    )
    parser.add_argument(
        "--real-flow", action="store_true", help="the real runbook, playbook and Prefect server"
    )
    args = parser.parse_args(argv)
    if args.real_flow:
        return real_flow(
            [int(x) for x in (args.sizes or "64,256,1024").split(",")],
            args.test_seconds or 5.0,
            args.concurrency,
            args.seed,
        )
    repeat = max(1, args.repeat)
    t = args.test_seconds or DEFAULT_TEST_SECONDS
    concurrency = args.concurrency or DEFAULT_CONCURRENCY
    sizes = [int(x) for x in (args.sizes or ",".join(map(str, SIZES))).split(",")]
    started = time.perf_counter()
    rows = [
        run_one(s, t, concurrency, args.seed, repeat) for s in scenarios(sizes, not args.no_stress)
    ]
    print(table(rows, t))
    print()
    print(
        f"test time {t} s, concurrency {concurrency}, wall = median of {repeat} runs. "
        "batches = run_round calls (rounds + retry batches). overhead = (wall - k x test) / "
        "wall, k = rounds or batches. algorithm ms = wall outside run_round (planning, "
        "judging, bookkeeping); the rest of the overhead is the thread pool. Sequential "
        "and bisection walls are computed (tests x test time, levels x test time), not "
        "slept."
    )
    missed = [r for r in rows if not r.goal]
    print(
        f"goal (exact sets; 2 rounds when 4*bad+2 <= N, <= 3 below N/3): "
        f"{'met' if not missed else f'MISSED in {len(missed)} rows'}; "
        f"bench took {time.perf_counter() - started:.1f} s"
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
