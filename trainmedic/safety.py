"""The circuit breaker in front of every destructive action (drain, stop, resubmit, reset,
reboot). Pure: the ledger is read and written by the caller.

Automation that misfires does harm at machine speed: a bad rule or a flapping fabric can drain
half a cluster or requeue a job in a loop. So after ``limit`` destructive actions within
``window_s`` the breaker opens and every further automatic action is refused until a human
resets it (`trainmedic breaker --reset`), which is itself recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import Field

from trainmedic.files import parse_records
from trainmedic.models import Strict


class ActionKind(StrEnum):
    drain = "drain"
    stop_job = "stop_job"
    resubmit = "resubmit"
    reset_gpu = "reset_gpu"
    reboot = "reboot"
    breaker_reset = "breaker_reset"  # a human's reset: actions before it no longer count


class ActionEntry(Strict):
    kind: ActionKind
    target: str
    at: datetime
    flow_run: str = ""


class CircuitBreaker(Strict):
    limit: int = Field(default=20, ge=1, le=100_000, description="destructive actions per window")
    window_s: int = Field(default=3600, ge=60, le=7 * 86_400)


class BreakerState(Strict):
    open: bool
    count: int
    limit: int
    window_s: int

    def describe(self) -> str:
        state = "OPEN: automatic actions refused" if self.open else "closed"
        return (
            f"circuit breaker {state} ({self.count} destructive actions in the last "
            f"{self.window_s // 60} min, limit {self.limit})"
        )


def entry_line(entry: ActionEntry) -> str:
    return entry.model_dump_json() + "\n"


def parse_entries(text: str) -> list[ActionEntry]:
    """A torn or foreign line is skipped: it can only make the breaker more permissive by one."""
    return parse_records(text, ActionEntry)


def breaker_state(
    entries: Iterable[ActionEntry], now: datetime, breaker: CircuitBreaker
) -> BreakerState:
    since = now - timedelta(seconds=breaker.window_s)
    ordered: Sequence[ActionEntry] = sorted(entries, key=lambda e: e.at)
    resets = [e.at for e in ordered if e.kind is ActionKind.breaker_reset]
    if resets:
        since = max(since, resets[-1])
    count = sum(1 for e in ordered if e.at >= since and e.kind is not ActionKind.breaker_reset)
    return BreakerState(
        open=count >= breaker.limit, count=count, limit=breaker.limit, window_s=breaker.window_s
    )
