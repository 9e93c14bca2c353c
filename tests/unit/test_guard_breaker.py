from datetime import UTC, datetime, timedelta

from trainmedic.decisions.guard import CircuitBreaker, breaker_state
from trainmedic.state import ActionEntry, ActionKind

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def entry(minutes_ago: float, kind: ActionKind = ActionKind.drain) -> ActionEntry:
    return ActionEntry(kind=kind, target="node001", at=NOW - timedelta(minutes=minutes_ago))


def test_breaker_opens_at_the_limit_within_the_window() -> None:
    breaker = CircuitBreaker(limit=3, window_s=3600)
    assert not breaker_state([entry(1), entry(2)], NOW, breaker).open
    state = breaker_state([entry(1), entry(2), entry(3), entry(90)], NOW, breaker)
    assert state.open and state.count == 3
    assert "OPEN" in state.describe()


def test_room_is_what_the_breaker_still_lets_through() -> None:
    breaker = CircuitBreaker(limit=3, window_s=3600)
    assert breaker_state([], NOW, breaker).room == 3
    assert breaker_state([entry(1), entry(2)], NOW, breaker).room == 1
    assert breaker_state([entry(1), entry(2), entry(3), entry(4)], NOW, breaker).room == 0


def test_old_actions_age_out_and_a_reset_clears() -> None:
    breaker = CircuitBreaker(limit=2, window_s=600)
    assert not breaker_state([entry(11), entry(12), entry(1)], NOW, breaker).open
    crowded = [entry(3), entry(2), entry(1.5, ActionKind.breaker_reset), entry(1)]
    state = breaker_state(crowded, NOW, breaker)
    assert not state.open and state.count == 1
