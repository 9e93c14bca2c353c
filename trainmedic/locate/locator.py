"""The two-round pair test, run: :class:`Locator` keeps the state between rounds (who is
cleared, convicted, pending), :func:`locate` drives it with a caller's round runner, and
:class:`LocateReport` is the outcome. Pure: the planning and judging come from
:mod:`trainmedic.locate.pairing`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from pydantic import Field

from trainmedic.core.errors import InputError, TrainmedicError
from trainmedic.core.models import PairResult, Strict
from trainmedic.locate.pairing import (
    DEFAULT_MAX_BLIND_ROUNDS,
    DEFAULT_MAX_ROUNDS,
    DEFAULT_REFERENCE_QUANTILE,
    DEFAULT_SLOW_RATIO,
    Group,
    Role,
    RunRound,
    Verdict,
    check_nodes,
    default_seed,
    group_in_order,
    judge_round,
    pair_suspects,
    plan_round_two,
    reference_busbw,
    shuffled,
)

__all__ = ["LocateReport", "Locator", "RoundRecord", "locate"]


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
    every group test executed, retries included. Defaults: nothing tested (none held)."""

    slow_ratio: float
    nodes: tuple[str, ...] = ()
    seed: int = 0
    reference_gbps: float | None = None
    faulty: tuple[str, ...] = ()
    slow: tuple[str, ...] = ()
    healthy: tuple[str, ...] = ()
    undetermined: tuple[str, ...] = ()
    rounds: int = Field(default=0, ge=0)
    tests_run: int = Field(default=0, ge=0)
    records: tuple[RoundRecord, ...] = ()

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
        # Retries may bring the first measurements (else a slow pair passes, clearing a slow node)
        if not self._fixed_reference and self.reference_gbps is None:
            self.reference_gbps = reference_busbw(matched, self.reference_quantile)
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
            return group_in_order(self._order)
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
            if verdict is Verdict.UNDETERMINED:
                continue  # says nothing about these nodes: they stay pending
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
        """This round's tests that said nothing (undetermined), and its failed tests that are
        one clean failure short of convicting."""
        pending = set(self.pending)
        return [
            group
            for group, verdict in zip(self._groups, self._verdicts, strict=True)
            if (verdict is Verdict.UNDETERMINED and any(node in pending for node in group))
            or (
                verdict.failed
                and any(
                    node in pending and all(m == node or m in self._healthy for m in group)
                    for node in group
                )
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
    ``on_round`` sees each round's record as soon as the round ends (e.g. for an artifact)."""
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
