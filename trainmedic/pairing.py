"""Locate faulty and fail-slow nodes with pairwise allgather tests.

One *test* is an allgather (``all_gather_perf`` or equivalent) over a *group* of two nodes,
or three for round one's odd group. It errors, or completes with a bus bandwidth.

Round one ("screen") shuffles the candidates with a seed and groups them two by two, all
groups at once. With an odd count the last three form one group of three rather than one
node being left over for round two: bus bandwidth is normalised by (n-1)/n, so a 3-node
allgather's is comparable to a pair's; every node is tested in round one; and a healthy
cluster is cleared in one round, where a leftover node would always cost a second one.

A test *passes* when it completes at no less than ``slow_ratio`` times the reference bus
bandwidth; every member of a passing group is known healthy. A test that completes below
that is *slow*, one that errors is an *error*; either way it fails and every member of the
group is a suspect.

Round two ("verify") pairs every suspect with a distinct node known healthy. A suspect that
passes is healthy; one that fails again is convicted: ``slow`` if any of its failures
completed slowly (a broken node errors, it does not finish slowly), ``faulty`` otherwise.

Conviction: a node is convicted on two failed tests in which every other member is known
healthy ("clean" failures), or one with ``retry_failed=False``, so one transient error
never isolates a node. Usually the round-one and round-two tests are those two: faulty
``f`` screened with ``a``; in round two ``a`` passes, which makes the round-one failure
clean for ``f``, and ``f`` fails with a healthy partner: convicted, with no extra test and
no extra wall time. Only when a later failure is a node's sole clean one (its round-one
partner was bad too, or this failure is the transient one) is that test retried at once,
with the same partner, before the round ends. A retry is not a round:
``rounds`` counts planned test rounds, ``tests_run`` counts every test executed.

More rounds happen only when round one leaves more suspects than healthy nodes. Round two
then verifies as many suspects as there are partners; those cleared become partners for the
next round (partners are reused across rounds, never twice in one round). Suspects left
without a partner are paired among themselves, never repeating a pair that already failed
together: they would idle otherwise, and such a test can only clear nodes, since a failure
between two suspects convicts nobody until the other member is cleared. When no node at
all is known healthy, rounds of suspects among themselves are the last resort
(``max_blind_rounds``); if they clear nobody, every remaining node is ``undetermined``:
without a healthy reference no test tells which member is bad, and guessing would drain
good nodes. A single node cannot be tested at all and is ``undetermined`` too.

Two rounds are therefore guaranteed when round one leaves no more suspects than healthy
nodes: at most two suspects per bad node, plus one for an odd group, so when
``4 * (faulty + slow) + 2 <= N``. Between N/4 and N/3 a third round is sometimes needed,
never a fourth so far (exhaustively to N = 13, by property tests to N = 300): round two
clears at least its partners' count minus the bad nodes it meets, and suspects left idle
clear each other.

Reference bandwidth: slowness is relative to the round-one upper quartile
(``reference_quantile=0.75``) of completed tests, kept fixed afterwards because every
later group holds a suspect, so a later round's own median says nothing about healthy
speed. Not the median: with up to a third of the nodes bad, up to two thirds of round one's
pairs can hold one, and the median is then a slow pair's speed. ``reference_gbps`` replaces
it with a known nominal.

Determinism: the seed defaults to a hash of the sorted node list and every later choice
follows the shuffled order, so the same nodes (in any input order) and the same results
give the same plan, and a run can be replayed from its report.

This module is pure: no clock, no threads, no I/O. Running a round's tests concurrently is
the caller's job: pass it to :func:`locate` as ``run_round``, or drive :class:`Locator`
step by step.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import Literal

from pydantic import Field

from trainmedic import validate
from trainmedic.errors import InputError, TrainmedicError
from trainmedic.models import PairResult, Strict

__all__ = [
    "Group",
    "LocateReport",
    "Locator",
    "Pair",
    "Role",
    "RoundRecord",
    "RunRound",
    "Verdict",
    "check_nodes",
    "default_seed",
    "judge_round",
    "locate",
    "pair_suspects",
    "plan_round_one",
    "plan_round_two",
    "reference_busbw",
    "shuffled",
]

Group = tuple[str, ...]
"""The nodes of one allgather test: two, or three for round one's odd group."""
Pair = Group
Role = Literal["screen", "verify", "cross"]
"""``screen``: round one. ``verify``: a suspect and a healthy partner. ``cross``: suspects."""
RunRound = Callable[[Sequence[Group]], Sequence[PairResult]]
"""Runs every group's test concurrently and returns one result per group, in any order."""

DEFAULT_SLOW_RATIO = 0.5
DEFAULT_REFERENCE_QUANTILE = 0.75
DEFAULT_MAX_ROUNDS = 10
DEFAULT_MAX_BLIND_ROUNDS = 3  # enough for every pairing of a failed group of three


class Verdict(StrEnum):
    PASS = "pass"  # noqa: S105 - a test verdict, not a password
    SLOW = "slow"
    ERROR = "error"

    @property
    def failed(self) -> bool:
        return self is not Verdict.PASS


# ----------------------------------------------------------------------------- planning


def check_nodes(nodes: Iterable[str], field: str = "nodes") -> list[str]:
    """Validate every name and reject duplicates and an empty list; keeps the order."""
    names: list[str] = []
    seen: set[str] = set()
    for name in nodes:
        validate.hostname(name, field)
        if name in seen:
            raise InputError(field, name, "node listed twice")
        seen.add(name)
        names.append(name)
    if not names:
        raise InputError(field, names, "names no node")
    return names


def default_seed(nodes: Iterable[str]) -> int:
    """A seed that depends only on the set of nodes, not on the order they came in."""
    digest = hashlib.sha256(",".join(sorted(nodes)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def shuffled(nodes: Iterable[str], seed: int) -> list[str]:
    order = sorted(nodes)
    # Not security: a seeded shuffle keeps bad racks from landing in one pair every run
    # while staying reproducible.
    random.Random(seed).shuffle(order)  # noqa: S311
    return order


def _group_in_order(order: Sequence[str]) -> list[Group]:
    if len(order) < 2:
        return []
    cut = len(order) - 3 if len(order) % 2 else len(order)
    groups: list[Group] = [(order[i], order[i + 1]) for i in range(0, cut, 2)]
    if len(order) % 2:
        groups.append(tuple(order[cut:]))
    return groups


def plan_round_one(nodes: Sequence[str], seed: int | None = None) -> list[Group]:
    """Shuffle with ``seed`` (default: :func:`default_seed`) and group two by two; an odd
    count ends with one group of three. Fewer than two nodes: no group."""
    names = check_nodes(nodes)
    return _group_in_order(shuffled(names, default_seed(names) if seed is None else seed))


def pair_suspects(suspects: Sequence[str], failed_together: Iterable[Group] = ()) -> list[Group]:
    """Pair suspects greedily in order, skipping pairs that already failed as a pair.

    A pair inside a failed group of three is allowed: the third member may be the bad one.
    A suspect with no allowed partner stays out.
    """
    banned = {frozenset(g) for g in failed_together if len(g) == 2}
    free = list(suspects)
    groups: list[Group] = []
    while free:
        first = free.pop(0)
        for i, other in enumerate(free):
            if frozenset((first, other)) not in banned:
                groups.append((first, other))
                del free[i]
                break
    return groups


def plan_round_two(
    suspects: Sequence[str],
    healthy: Sequence[str],
    *,
    failed_together: Iterable[Group] = (),
    pair_idle_suspects: bool = True,
) -> list[Group]:
    """Pair suspects, in order, with distinct healthy partners, in order.

    Suspects beyond the number of partners are paired among themselves
    (:func:`pair_suspects`) when ``pair_idle_suspects``, else left for a later round.
    """
    suspect_list = check_nodes(suspects, "suspects")
    partner_list = check_nodes(healthy, "healthy") if healthy else []
    both = set(suspect_list).intersection(partner_list)
    if both:
        raise InputError("healthy", sorted(both), "nodes cannot be suspect and healthy")
    verify: list[Group] = list(zip(suspect_list, partner_list, strict=False))
    idle = suspect_list[len(verify) :]
    cross = pair_suspects(idle, failed_together) if pair_idle_suspects else []
    return verify + cross


# ----------------------------------------------------------------------------- judging


def reference_busbw(
    results: Iterable[PairResult], quantile: float = DEFAULT_REFERENCE_QUANTILE
) -> float | None:
    """The ``quantile`` (nearest rank, rounding up) of completed tests' bus bandwidth;
    ``None`` when no test completed with a measurement. ``quantile=0.5`` is the upper
    median."""
    values = sorted(r.busbw_gbps for r in results if r.ok and r.busbw_gbps is not None)
    if not values:
        return None
    return values[min(len(values) - 1, math.floor(quantile * len(values)))]


def judge_round(
    results: Sequence[PairResult],
    slow_ratio: float = DEFAULT_SLOW_RATIO,
    reference: float | None = None,
) -> list[Verdict]:
    """One verdict per result: error, slow (below ``slow_ratio * reference``) or pass.

    ``reference`` defaults to :func:`reference_busbw` of these results. A completed test
    without a bandwidth, or with no reference at all, passes: nothing says it is slow.
    """
    if reference is None:
        reference = reference_busbw(results)
    verdicts: list[Verdict] = []
    for r in results:
        if not r.ok:
            verdicts.append(Verdict.ERROR)
        elif reference is not None and r.busbw_gbps is not None:
            too_slow = r.busbw_gbps < slow_ratio * reference
            verdicts.append(Verdict.SLOW if too_slow else Verdict.PASS)
        else:
            verdicts.append(Verdict.PASS)
    return verdicts


# ----------------------------------------------------------------------------- report


class RoundRecord(Strict):
    """One test round: what was planned, what came back (a retry's result replaces the
    first attempt's, ``attempts`` tells), and what the round decided."""

    index: int = Field(ge=1)
    groups: tuple[Group, ...]
    roles: tuple[Role, ...]
    results: tuple[PairResult, ...]
    verdicts: tuple[Verdict, ...]
    retried: int = Field(ge=0)
    reference_gbps: float | None
    cleared: tuple[str, ...]
    faulty: tuple[str, ...]
    slow: tuple[str, ...]

    def rows(self) -> list[dict[str, object]]:
        """One flat row per test, for a table artifact."""
        return [
            {
                "round": self.index,
                "nodes": ",".join(g),
                "role": role,
                "verdict": str(v),
                "busbw_gbps": r.busbw_gbps,
                "attempts": r.attempts,
                "error": r.error,
            }
            for g, role, r, v in zip(
                self.groups, self.roles, self.results, self.verdicts, strict=True
            )
        ]


class LocateReport(Strict):
    """The outcome: four disjoint sorted sets covering ``nodes``, and how it was reached.

    ``rounds`` counts planned test rounds (retries are not rounds); ``tests_run`` counts
    every group test executed, retries included.
    """

    nodes: tuple[str, ...]
    seed: int
    slow_ratio: float
    reference_gbps: float | None
    faulty: tuple[str, ...]
    slow: tuple[str, ...]
    healthy: tuple[str, ...]
    undetermined: tuple[str, ...]
    rounds: int = Field(ge=0)
    tests_run: int = Field(ge=0)
    records: tuple[RoundRecord, ...]

    def summary(self, wall_s: float) -> dict[str, object]:
        """The CLI's JSON object; ``wall_s`` is measured by the caller."""
        return {
            "faulty": list(self.faulty),
            "slow": list(self.slow),
            "undetermined": list(self.undetermined),
            "rounds": self.rounds,
            "tests_run": self.tests_run,
            "wall_s": round(wall_s, 3),
        }

    def rows(self) -> list[dict[str, object]]:
        return [row for record in self.records for row in record.rows()]


# ----------------------------------------------------------------------------- driver


class Locator:
    """The algorithm as a state machine, for a caller that runs the tests itself::

        loc = Locator(nodes)
        while groups := loc.plan():
            retry = loc.record(run_all(groups))
            if retry:
                loc.record_retries(run_all(retry))
        report = loc.report()

    :func:`locate` is exactly that loop.
    """

    def __init__(
        self,
        nodes: Sequence[str],
        *,
        seed: int | None = None,
        slow_ratio: float = DEFAULT_SLOW_RATIO,
        retry_failed: bool = True,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        max_blind_rounds: int = DEFAULT_MAX_BLIND_ROUNDS,
        reference_gbps: float | None = None,
        reference_quantile: float = DEFAULT_REFERENCE_QUANTILE,
        pair_idle_suspects: bool = True,
    ) -> None:
        names = check_nodes(nodes)
        if not 0.0 < slow_ratio <= 1.0:
            raise InputError("slow_ratio", slow_ratio, "must be in (0, 1]")
        if not 0.0 <= reference_quantile <= 1.0:
            raise InputError("reference_quantile", reference_quantile, "must be in [0, 1]")
        if max_rounds < 1:
            raise InputError("max_rounds", max_rounds, "must be at least 1")
        if max_blind_rounds < 0:
            raise InputError("max_blind_rounds", max_blind_rounds, "must be at least 0")
        if reference_gbps is not None and not reference_gbps > 0:
            raise InputError("reference_gbps", reference_gbps, "must be positive")
        self.seed = default_seed(names) if seed is None else seed
        self.slow_ratio = slow_ratio
        self.retry_failed = retry_failed
        self.max_rounds = max_rounds
        self.max_blind_rounds = max_blind_rounds
        self.reference_quantile = reference_quantile
        self.pair_idle_suspects = pair_idle_suspects
        self.reference_gbps = reference_gbps
        self._fixed_reference = reference_gbps is not None
        self._order = shuffled(names, self.seed)
        # dicts as ordered sets: partners are handed out in the order nodes were cleared
        self._healthy: dict[str, None] = {}
        self._convicted: dict[str, Verdict] = {}
        self._failures: dict[str, list[tuple[Group, Verdict]]] = {n: [] for n in names}
        self._failed_together: list[Group] = []
        self._records: list[RoundRecord] = []
        self._blind_rounds = 0
        self._tests = 0
        self._phase: Literal["plan", "record", "retry", "done"] = "plan"
        self._groups: list[Group] = []
        self._roles: list[Role] = []
        self._results: list[PairResult] = []
        self._verdicts: list[Verdict] = []
        self._retry: list[Group] = []
        self._before: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())

    # -- state, read-only for callers

    @property
    def healthy(self) -> list[str]:
        return list(self._healthy)

    @property
    def pending(self) -> list[str]:
        """Nodes neither cleared nor convicted, in the shuffled order."""
        return [n for n in self._order if n not in self._healthy and n not in self._convicted]

    @property
    def records(self) -> tuple[RoundRecord, ...]:
        return tuple(self._records)

    @property
    def done(self) -> bool:
        return self._phase == "done"

    # -- steps

    def plan(self) -> list[Group]:
        """The next round's groups; ``[]`` once nothing more can be learned."""
        if self._phase == "done":
            return []
        self._expect("plan")
        groups = self._next_groups()
        if not groups:
            self._phase = "done"
            return []
        self._groups = groups
        self._roles = [self._role(g) for g in groups]
        self._before = (frozenset(self._healthy), frozenset(self._convicted))
        self._phase = "record"
        return list(groups)

    def record(self, results: Sequence[PairResult]) -> list[Group]:
        """Take the round's results; return the groups to retry now (often none)."""
        self._expect("record")
        matched = _match(self._groups, results)
        self._tests += len(matched)
        if not self._fixed_reference and self.reference_gbps is None:
            self.reference_gbps = reference_busbw(matched, self.reference_quantile)
        self._results = matched
        self._verdicts = judge_round(matched, self.slow_ratio, self.reference_gbps)
        self._apply(self._groups, self._verdicts)
        self._retry = self._retry_groups() if self.retry_failed else []
        if self._retry:
            self._phase = "retry"
            return list(self._retry)
        self._close_round()
        return []

    def record_retries(self, results: Sequence[PairResult]) -> None:
        self._expect("retry")
        matched = _match(self._retry, results)
        self._tests += len(matched)
        verdicts = judge_round(matched, self.slow_ratio, self.reference_gbps)
        self._apply(self._retry, verdicts)
        position = {frozenset(g): i for i, g in enumerate(self._groups)}
        for group, result, verdict in zip(self._retry, matched, verdicts, strict=True):
            i = position[frozenset(group)]
            attempts = self._results[i].attempts + result.attempts
            self._results[i] = result.model_copy(update={"attempts": attempts})
            self._verdicts[i] = verdict
        self._close_round()

    def report(self) -> LocateReport:
        if self._phase not in ("plan", "done"):
            raise TrainmedicError(f"Locator.report() in the middle of a round ({self._phase})")
        return LocateReport(
            nodes=tuple(sorted(self._order)),
            seed=self.seed,
            slow_ratio=self.slow_ratio,
            reference_gbps=self.reference_gbps,
            faulty=_sorted(n for n, v in self._convicted.items() if v is Verdict.ERROR),
            slow=_sorted(n for n, v in self._convicted.items() if v is Verdict.SLOW),
            healthy=_sorted(self._healthy),
            undetermined=_sorted(self.pending),
            rounds=len(self._records),
            tests_run=self._tests,
            records=tuple(self._records),
        )

    # -- internals

    def _expect(self, phase: str) -> None:
        if self._phase != phase:
            raise TrainmedicError(f"Locator: expected step {phase!r}, not in phase {self._phase!r}")

    def _next_groups(self) -> list[Group]:
        if not self._records:
            return _group_in_order(self._order)
        pending = self.pending
        if not pending or len(self._records) >= self.max_rounds:
            return []
        if self._healthy:
            return plan_round_two(
                pending,
                list(self._healthy),
                failed_together=self._failed_together,
                pair_idle_suspects=self.pair_idle_suspects,
            )
        if self._blind_rounds >= self.max_blind_rounds:
            return []
        self._blind_rounds += 1
        return pair_suspects(pending, self._failed_together)

    def _role(self, group: Group) -> Role:
        if not self._records:
            return "screen"
        return "verify" if any(m in self._healthy for m in group) else "cross"

    def _apply(self, groups: Sequence[Group], verdicts: Sequence[Verdict]) -> None:
        for group, verdict in zip(groups, verdicts, strict=True):
            if verdict.failed:
                self._failed_together.append(group)
                for node in group:
                    self._failures[node].append((group, verdict))
            else:
                for node in group:
                    self._healthy.setdefault(node, None)
        # Convict after every clearing of the batch: a partner cleared in this very
        # round can turn an older failure clean.
        need = 2 if self.retry_failed else 1
        for node in self.pending:
            clean = self._clean_failures(node)
            if len(clean) >= need:
                slow = any(v is Verdict.SLOW for v in clean)
                self._convicted[node] = Verdict.SLOW if slow else Verdict.ERROR

    def _clean_failures(self, node: str) -> list[Verdict]:
        return [
            verdict
            for group, verdict in self._failures[node]
            if all(m == node or m in self._healthy for m in group)
        ]

    def _retry_groups(self) -> list[Group]:
        """This round's failed tests that are one clean failure short of convicting."""
        pending = set(self.pending)
        return [
            group
            for group, verdict in zip(self._groups, self._verdicts, strict=True)
            if verdict.failed
            and any(
                node in pending and all(m == node or m in self._healthy for m in group)
                for node in group
            )
        ]

    def _close_round(self) -> None:
        healthy_before, convicted_before = self._before
        new = [n for n in self._order if n in self._convicted and n not in convicted_before]
        self._records.append(
            RoundRecord(
                index=len(self._records) + 1,
                groups=tuple(self._groups),
                roles=tuple(self._roles),
                results=tuple(self._results),
                verdicts=tuple(self._verdicts),
                retried=len(self._retry),
                reference_gbps=self.reference_gbps,
                cleared=_sorted(n for n in self._healthy if n not in healthy_before),
                faulty=_sorted(n for n in new if self._convicted[n] is Verdict.ERROR),
                slow=_sorted(n for n in new if self._convicted[n] is Verdict.SLOW),
            )
        )
        self._retry = []
        self._phase = "plan"


def locate(
    nodes: Sequence[str],
    run_round: RunRound,
    *,
    seed: int | None = None,
    slow_ratio: float = DEFAULT_SLOW_RATIO,
    retry_failed: bool = True,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    max_blind_rounds: int = DEFAULT_MAX_BLIND_ROUNDS,
    reference_gbps: float | None = None,
    reference_quantile: float = DEFAULT_REFERENCE_QUANTILE,
    pair_idle_suspects: bool = True,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> LocateReport:
    """Run the whole search. ``run_round`` runs one batch of groups concurrently; it is
    called once per round and once more for the round's retries when there are any.
    ``on_round`` sees each round's record as soon as the round ends (e.g. to publish a
    table artifact)."""
    locator = Locator(
        nodes,
        seed=seed,
        slow_ratio=slow_ratio,
        retry_failed=retry_failed,
        max_rounds=max_rounds,
        max_blind_rounds=max_blind_rounds,
        reference_gbps=reference_gbps,
        reference_quantile=reference_quantile,
        pair_idle_suspects=pair_idle_suspects,
    )
    while groups := locator.plan():
        retry = locator.record(run_round(groups))
        if retry:
            locator.record_retries(run_round(retry))
        if on_round is not None:
            on_round(locator.records[-1])
    return locator.report()


def _match(groups: Sequence[Group], results: Sequence[PairResult]) -> list[PairResult]:
    """Results in the order of ``groups``, whatever order the executor returned them in."""
    by_group = {frozenset(r.nodes): r for r in results}
    if len(results) != len(groups) or len(by_group) != len(groups):
        raise InputError("run_round", len(results), f"expected {len(groups)} distinct results")
    missing = [g for g in groups if frozenset(g) not in by_group]
    if missing:
        raise InputError("run_round", list(missing[0]), "no result for this planned group")
    return [by_group[frozenset(g)] for g in groups]


def _sorted(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(names))
