"""Which events start a remediation: never a replay of a job already resubmitted, a stale
event (unless a human asks), or a job trainmedic does not manage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from support.builders import job_info

from trainmedic.decisions.admission import EventScope, admit

NOW = datetime(2026, 12, 3, 3, 0, tzinfo=UTC)
SCOPE = EventScope(max_age_s=3600)


def decide(job=None, *, event="job.failed", age_s=10.0, resubmissions=(), scope=SCOPE):  # type: ignore[no-untyped-def]
    return admit(
        job or job_info("1001"),
        event=event,
        occurred=NOW - timedelta(seconds=age_s),
        now=NOW,
        resubmissions=list(resubmissions),
        scope=scope,
    )


def test_a_fresh_event_about_a_managed_job_is_admitted() -> None:
    assert decide().admitted


def test_a_replay_after_the_resubmission_is_a_duplicate() -> None:
    verdict = decide(resubmissions=[job_info("1002", resubmission_of="1001")])
    assert not verdict.admitted and verdict.kind == "duplicate" and "1002" in verdict.why


def test_an_old_event_is_stale_unless_a_human_asks() -> None:
    old = decide(age_s=2 * 3600)
    assert not old.admitted and old.kind == "stale" and "120 min old" in old.why
    assert decide(event="manual", age_s=2 * 3600).admitted


def test_jobs_not_ours_are_foreign() -> None:
    unmanaged = job_info("1001").model_copy(update={"managed": False})
    assert decide(unmanaged).kind == "foreign"
    team = EventScope(owners=frozenset({"pretrain"}))
    verdict = decide(scope=team)
    assert not verdict.admitted and verdict.kind == "foreign" and "unknown" in verdict.why
    # A human asking does not make someone else's job ours.
    assert decide(unmanaged, event="manual").kind == "foreign"
