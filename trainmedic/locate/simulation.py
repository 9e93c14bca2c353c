"""The pairing algorithm's simulation: an oracle fabric and a threaded executor.

:class:`SimulatedFabric` answers a group test the way the hardware model assumes: any test
touching a faulty node errors; one touching a slow node completes at ``slow_factor`` of the
nominal bus bandwidth; otherwise it completes at nominal, with a small deterministic
jitter. ``transient`` makes the k-th test of a node error once, as a flaky link would.

:class:`ThreadedExecutor` sleeps ``test_seconds`` per test and runs a round's tests in a
thread pool, so timings include real orchestration overhead. Kept out of ``pairing`` so
that module stays pure.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType

from trainmedic.core.errors import InputError
from trainmedic.core.models import PairResult
from trainmedic.locate import Group, LocateReport, check_nodes, locate

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_TEST_SECONDS",
    "SimulatedFabric",
    "ThreadedExecutor",
    "locate_simulated",
    "simulated_nodes",
]

DEFAULT_TEST_SECONDS = 0.05
DEFAULT_CONCURRENCY = 512  # one thread per pair of a 1024-node round
NOMINAL_GBPS = 190.0


def simulated_nodes(count: int, prefix: str = "node") -> list[str]:
    """``node001`` .. ``nodeNNN`` (at least three digits, as ``sim create`` names them), for
    ``--simulate N``."""
    if count < 1:
        raise InputError("simulate", count, "needs at least one node")
    width = max(3, len(str(count)))
    return check_nodes(f"{prefix}{i:0{width}d}" for i in range(1, count + 1))


class SimulatedFabric:
    """The ground truth. Thread-safe: the executor calls :meth:`test` from many threads."""

    def __init__(
        self,
        faulty: Iterable[str] = (),
        slow: Iterable[str] = (),
        *,
        transient: Mapping[str, int] | None = None,
        nominal_gbps: float = NOMINAL_GBPS,
        slow_factor: float = 0.3,
        jitter: float = 0.03,
    ) -> None:
        self.faulty = frozenset(faulty)
        self.slow = frozenset(slow)
        self.nominal_gbps = nominal_gbps
        self.slow_factor = slow_factor
        self.jitter = jitter
        self._transient = dict(transient or {})
        self._tests_of: dict[str, int] = {}
        self._lock = threading.Lock()
        self.tests = 0

    def test(self, group: Group) -> PairResult:
        with self._lock:
            self.tests += 1
            counts = [self._tests_of.get(n, 0) for n in group]
            for node in group:
                self._tests_of[node] = self._tests_of.get(node, 0) + 1
            flaky = [n for n, k in zip(group, counts, strict=True) if self._transient.get(n) == k]
            for node in flaky:
                del self._transient[node]
        nodes = tuple(group)
        if any(n in self.faulty for n in group):
            return PairResult(nodes=nodes, ok=False, error="simulated NCCL error: remote failure")
        if flaky:
            return PairResult(nodes=nodes, ok=False, error="simulated transient: connection reset")
        factor = self.slow_factor if any(n in self.slow for n in group) else 1.0
        # Deterministic noise, so a rerun reproduces bandwidths exactly.
        u = zlib.crc32(",".join(sorted(group)).encode()) / 0xFFFFFFFF * 2.0 - 1.0
        busbw = self.nominal_gbps * factor * (1.0 + self.jitter * u)
        return PairResult(nodes=nodes, ok=True, busbw_gbps=round(busbw, 3))

    def run_round(self, groups: Sequence[Group]) -> list[PairResult]:
        """All tests of a round, instantly: the executor for property tests."""
        return [self.test(g) for g in groups]


class ThreadedExecutor:
    """``run_round`` for :func:`~trainmedic.locate.pairing.locate`: every test of a round in a pool
    of ``concurrency`` threads, each taking ``test_seconds``. One pool for the whole search,
    as a flow's task runner would keep its workers."""

    def __init__(
        self,
        fabric: SimulatedFabric,
        *,
        test_seconds: float = DEFAULT_TEST_SECONDS,
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        if test_seconds < 0:
            raise InputError("test_seconds", test_seconds, "must not be negative")
        if concurrency < 1:
            raise InputError("concurrency", concurrency, "must be at least 1")
        self.fabric = fabric
        self.test_seconds = test_seconds
        self.batches = 0  # run_round calls: rounds plus retry batches
        self.busy_s = 0.0  # wall time spent inside run_round calls
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="pairtest")

    def __call__(self, groups: Sequence[Group]) -> list[PairResult]:
        self.batches += 1
        start = time.perf_counter()
        try:
            return list(self._pool.map(self._one, groups))
        finally:
            self.busy_s += time.perf_counter() - start

    def _one(self, group: Group) -> PairResult:
        time.sleep(self.test_seconds)
        return self.fabric.test(group)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> ThreadedExecutor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def locate_simulated(
    nodes: Sequence[str],
    faulty: Collection[str],
    slow: Collection[str] = frozenset(),
    *,
    seed: int | None = None,
    test_seconds: float = DEFAULT_TEST_SECONDS,
    slow_ratio: float = 0.5,
    concurrency: int = DEFAULT_CONCURRENCY,
    transient: Mapping[str, int] | None = None,
) -> LocateReport:
    """Locate ``faulty`` and ``slow`` among ``nodes`` on simulated hardware (sleeps
    ``test_seconds`` per round). The caller times it for ``report.summary(wall_s)``."""
    names = check_nodes(nodes)
    known = set(names)
    for field, given in (("faulty", faulty), ("slow", slow), ("transient", transient or {})):
        for name in sorted(given):
            if name not in known:
                raise InputError(field, name, "not one of the nodes")
    fabric = SimulatedFabric(faulty, slow, transient=transient)
    with ThreadedExecutor(fabric, test_seconds=test_seconds, concurrency=concurrency) as run:
        return locate(names, run, seed=seed, slow_ratio=slow_ratio)
