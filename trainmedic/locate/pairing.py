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

This module holds the planning and judging of one round; :mod:`trainmedic.locate.locator`
runs the rounds. Both are pure: no clock, no threads, no I/O. Running a round's tests
concurrently is the caller's job: pass it to :func:`~trainmedic.locate.locator.locate` as
``run_round``, or drive :class:`~trainmedic.locate.locator.Locator` step by step.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import Literal

from trainmedic.core import validate
from trainmedic.core.errors import InputError
from trainmedic.core.models import PairResult

__all__ = [
    "Group",
    "Pair",
    "Role",
    "RunRound",
    "Verdict",
    "check_nodes",
    "default_seed",
    "judge_round",
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
    # The test never ran or was cut off from outside (an overloaded controller, a killed
    # playbook): it says nothing about the nodes. Retried, never counted towards a conviction.
    UNDETERMINED = "undetermined"

    @property
    def failed(self) -> bool:
        return self in (Verdict.SLOW, Verdict.ERROR)


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


def group_in_order(order: Sequence[str]) -> list[Group]:
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
    return group_in_order(shuffled(names, default_seed(names) if seed is None else seed))


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
        if r.undetermined:
            verdicts.append(Verdict.UNDETERMINED)
        elif not r.ok:
            verdicts.append(Verdict.ERROR)
        elif reference is not None and r.busbw_gbps is not None:
            too_slow = r.busbw_gbps < slow_ratio * reference
            verdicts.append(Verdict.SLOW if too_slow else Verdict.PASS)
        else:
            verdicts.append(Verdict.PASS)
    return verdicts


# ----------------------------------------------------------------------------- report
