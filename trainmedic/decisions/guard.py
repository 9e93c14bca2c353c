"""The one "may we act" guard: who may be drained and who has to say so, and the circuit
breaker in front of every destructive action. Pure: no I/O, no clock; the records are read
and written by the caller, on the Prefect server (trainmedic.adapters.server_state), under
the one guard lock that makes check-and-act atomic.

**Isolation.** The runbooks convict nodes (a proven origin, failed pair tests); draining
them is the first step that costs capacity. The policy decides, from the candidates, the
cluster's size, the nodes already drained and the recent drains (the action record), whether
the isolation

* may go ahead without a human (``auto``): no more than ``auto_approve_max`` new nodes, and
  inside the blast-radius guard;
* needs a human (``approval``): bigger, or outside the guard. The guard is never crossed
  without an explicit approval: a timed-out approval drains nothing.

The blast-radius guard: after this isolation no more than ``max_share`` of the cluster may be
drained, and no more than ``max_per_window`` nodes drained by trainmedic within
``window_s``. A mass conviction is more likely a fabric, switch or test problem than that
many broken nodes, and draining a tenth of a cluster stops training as surely as any fault.

**Circuit breaker.** Automation that misfires does harm at machine speed: a bad rule or a
flapping fabric can drain half a cluster or requeue a job in a loop. So after ``limit``
destructive actions within ``window_s`` the breaker opens and every further automatic action
is refused until a human resets it (`trainmedic breaker --reset`), which is itself recorded.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field

from trainmedic.core.errors import InputError
from trainmedic.core.models import Strict
from trainmedic.core.settings import Settings
from trainmedic.state.records import ActionEntry, ActionKind

__all__ = [
    "ApprovalDecision",
    "BreakerState",
    "CircuitBreaker",
    "IsolationDecision",
    "IsolationPolicy",
    "approved_nodes",
    "breaker_state",
    "circuit_breaker",
    "counted_actions",
    "decide_isolation",
    "drains_of",
    "isolation_policy",
    "lemon",
    "recent_drains",
]

ApprovalDecision = Literal["approve", "reject", "approve_subset"]


class IsolationPolicy(Strict):
    """Limits on draining without a human. The defaults suit a cluster of hundreds of nodes."""

    auto_approve_max: int = Field(
        default=1, ge=0, le=64, description="isolations of at most this many nodes need no human"
    )
    max_share: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="most of the cluster that may be drained (already drained + these) "
        "without explicit approval",
    )
    max_per_window: int = Field(
        default=4,
        ge=0,
        le=10_000,
        description="most nodes trainmedic may drain per window without explicit approval",
    )
    window_s: int = Field(default=3600, ge=60, le=7 * 86_400, description="the rate window")
    min_drainable: int = Field(
        default=1,
        ge=0,
        le=64,
        description="drained nodes any cluster may have within the share guard, however small "
        "(5% of 16 nodes is 0, yet a node whose GPU fell off the bus runs nothing anyway)",
    )


class IsolationDecision(Strict):
    """What the policy says about one isolation."""

    mode: Literal["none", "auto", "approval"]
    nodes: tuple[str, ...]  # the candidates not drained yet: what an approval would drain
    already_drained: tuple[str, ...]
    guard: tuple[str, ...] = ()  # why the guard wants a human, one sentence each
    reasons: tuple[str, ...] = ()  # why approval is needed at all (guard or size)

    @property
    def needs_approval(self) -> bool:
        return self.mode == "approval"


def recent_drains(
    actions: Iterable[ActionEntry], now: datetime, window_s: int
) -> list[ActionEntry]:
    """trainmedic's drains younger than the window, one per node (its latest)."""
    since = now - timedelta(seconds=window_s)
    latest: dict[str, ActionEntry] = {}
    for entry in actions:
        if entry.kind is not ActionKind.drain or entry.at < since:
            continue
        if entry.target not in latest or entry.at > latest[entry.target].at:
            latest[entry.target] = entry
    return sorted(latest.values(), key=lambda e: (e.at, e.target))


def decide_isolation(
    candidates: Sequence[str],
    *,
    cluster_size: int,
    drained: Collection[str],
    recent: Sequence[ActionEntry],
    policy: IsolationPolicy,
) -> IsolationDecision:
    """Decide for ``candidates`` (convicted nodes) given the state of the cluster.

    ``drained``: nodes drained now, for whatever reason; ``recent``: trainmedic's drains
    within the policy's window (:func:`recent_drains`).
    """
    if cluster_size < 1:
        raise InputError("cluster_size", cluster_size, "must be at least 1")
    already = tuple(n for n in candidates if n in drained)
    new = tuple(n for n in dict.fromkeys(candidates) if n not in drained)
    if not new:
        return IsolationDecision(mode="none", nodes=(), already_drained=already)

    guard: list[str] = []
    allowed_drained = max(policy.min_drainable, math.floor(policy.max_share * cluster_size))
    after = len(set(drained) | set(new))
    if after > allowed_drained:
        guard.append(
            f"blast radius: {after} of {cluster_size} nodes would be drained, more than "
            f"{policy.max_share:.0%} ({allowed_drained})"
        )
    in_window = len({r.target for r in recent} | set(new))
    if in_window > policy.max_per_window:
        guard.append(
            f"rate limit: {in_window} nodes drained by trainmedic within "
            f"{policy.window_s // 60} min, more than {policy.max_per_window}"
        )
    reasons = list(guard)
    if len(new) > policy.auto_approve_max:
        reasons.append(
            f"{len(new)} nodes to drain, more than the {policy.auto_approve_max} "
            "approved automatically"
        )
    return IsolationDecision(
        mode="approval" if reasons else "auto",
        nodes=new,
        already_drained=already,
        guard=tuple(guard),
        reasons=tuple(reasons),
    )


def approved_nodes(
    decision: IsolationDecision, answer: ApprovalDecision, subset: Sequence[str] = ()
) -> tuple[list[str], list[str]]:
    """The nodes a human's answer lets the runbook drain, and the requested ones ignored
    because they were not candidates (an approval can narrow an isolation, never widen it)."""
    if answer == "reject":
        return [], []
    if answer == "approve":
        return list(decision.nodes), []
    wanted = list(dict.fromkeys(subset))
    return (
        [n for n in decision.nodes if n in wanted],
        [n for n in wanted if n not in decision.nodes],
    )


class CircuitBreaker(Strict):
    limit: int = Field(default=20, ge=1, le=100_000, description="destructive actions per window")
    window_s: int = Field(default=3600, ge=60, le=7 * 86_400)


class BreakerState(Strict):
    open: bool
    count: int
    limit: int
    window_s: int

    @property
    def room(self) -> int:
        """How many more destructive actions the breaker lets through now."""
        return max(0, self.limit - self.count)

    def describe(self) -> str:
        state = "OPEN: automatic actions refused" if self.open else "closed"
        return (
            f"circuit breaker {state} ({self.count} destructive actions in the last "
            f"{self.window_s // 60} min, limit {self.limit})"
        )


def counted_actions(
    entries: Iterable[ActionEntry], now: datetime, breaker: CircuitBreaker
) -> list[ActionEntry]:
    """The actions that count against the breaker now: inside its window and after the last
    human reset, oldest first."""
    since = now - timedelta(seconds=breaker.window_s)
    ordered: Sequence[ActionEntry] = sorted(entries, key=lambda e: e.at)
    resets = [e.at for e in ordered if e.kind is ActionKind.breaker_reset]
    if resets:
        since = max(since, resets[-1])
    return [e for e in ordered if e.at >= since and e.kind is not ActionKind.breaker_reset]


def breaker_state(
    entries: Iterable[ActionEntry], now: datetime, breaker: CircuitBreaker
) -> BreakerState:
    count = len(counted_actions(entries, now, breaker))
    return BreakerState(
        open=count >= breaker.limit, count=count, limit=breaker.limit, window_s=breaker.window_s
    )


def isolation_policy(settings: Settings) -> IsolationPolicy:
    """The isolation policy of this installation (server-side settings, never a run's form)."""
    return IsolationPolicy(
        auto_approve_max=settings.drain_auto_approve_max,
        max_share=settings.drain_max_share,
        max_per_window=settings.drain_max_per_hour,
        window_s=3600,
        min_drainable=settings.drain_min_drainable,
    )


def circuit_breaker(settings: Settings) -> CircuitBreaker:
    return CircuitBreaker(limit=settings.breaker_limit, window_s=settings.breaker_window_s)


def drains_of(
    entries: Iterable[ActionEntry], node: str, now: datetime, window: timedelta
) -> list[ActionEntry]:
    """trainmedic's drains of ``node`` within ``window`` before ``now``, oldest first: a node
    drained again and again is a lemon, whatever each drain's diagnosis was."""
    since = now - window
    return sorted(
        (e for e in entries if e.kind is ActionKind.drain and e.target == node and e.at >= since),
        key=lambda e: e.at,
    )


def lemon(
    entries: Iterable[ActionEntry], node: str, now: datetime, *, drains: int, window_days: float
) -> str | None:
    """Why ``node`` is a lemon (drained ``drains`` times or more within ``window_days``), as
    "drained 3 times in 7 days (12-01 10:00, ...)"; None when it is not one."""
    found = drains_of(entries, node, now, timedelta(days=window_days))
    if len(found) < drains:
        return None
    when = ", ".join(f"{e.at:%m-%d %H:%M}" for e in found)
    return f"drained {len(found)} times in {window_days:g} days ({when})"
