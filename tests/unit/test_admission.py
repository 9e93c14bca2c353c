"""Which events start a remediation: never a replay of a job already resubmitted, a stale
event (unless a human asks), or a job trainmedic does not manage (not submitted through it,
or outside the site's owners, partitions, accounts or comment tag)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError
from support.builders import job_info

from trainmedic.cli.common import validation_message
from trainmedic.core.settings import Settings
from trainmedic.decisions.admission import EventScope, admit, event_scope

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


def _ran(partition: str = "gpu", account: str = "llm", comment: str = ""):  # type: ignore[no-untyped-def]
    """A managed job as the scheduler reports where it ran, who pays and its comment."""
    return job_info("1001").model_copy(
        update={"partition": partition, "account": account, "comment": comment}
    )


def test_partition_scope() -> None:
    scope = EventScope(partitions=frozenset({"gpu", "a100"}))
    assert decide(_ran(partition="a100"), scope=scope).admitted
    verdict = decide(_ran(partition="cpu"), scope=scope)
    assert not verdict.admitted and verdict.kind == "foreign"
    assert "partition cpu" in verdict.why and "(a100, gpu)" in verdict.why
    # A scheduler that does not say where the job ran never puts it in scope.
    assert "(unknown)" in decide(_ran(partition=""), scope=scope).why
    assert decide(_ran(partition="cpu")).admitted  # no partitions set: every one


def test_account_scope() -> None:
    scope = EventScope(accounts=frozenset({"llm"}))
    assert decide(_ran(account="llm"), scope=scope).admitted
    verdict = decide(_ran(account="vision"), scope=scope)
    assert not verdict.admitted and verdict.kind == "foreign"
    assert "account vision" in verdict.why and "(llm)" in verdict.why
    assert "account (none)" in decide(_ran(account=""), scope=scope).why  # Account=(null)
    assert decide(_ran(account="vision")).admitted


def test_comment_tag_scope() -> None:
    scope = EventScope(comment_tag="tm-managed")
    # Slurm reports trainmedic's run tag first, the spec's own comment after it.
    assert decide(_ran(comment="trainmedic:gpt-1 tm-managed"), scope=scope).admitted
    verdict = decide(_ran(comment="trainmedic:gpt-1 nightly"), scope=scope)
    assert not verdict.admitted and verdict.kind == "foreign"
    assert "'tm-managed'" in verdict.why and "'trainmedic:gpt-1 nightly'" in verdict.why
    assert decide(_ran(comment=""), scope=scope).kind == "foreign"
    assert decide(_ran(comment="")).admitted  # no tag set: any comment, or none


def test_scope_is_decided_before_duplicate_and_stale_and_binds_humans() -> None:
    scope = EventScope(partitions=frozenset({"gpu"}), accounts=frozenset({"llm"}))
    outside = _ran(partition="cpu")
    replay = decide(outside, scope=scope, resubmissions=[job_info("1002")], age_s=2 * 3600)
    assert replay.kind == "foreign"
    assert decide(outside, event="manual", scope=scope).kind == "foreign"
    assert decide(_ran(), event="manual", scope=scope, age_s=2 * 3600).admitted


def test_event_scope_reads_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OWNERS", "PARTITIONS", "ACCOUNTS", "COMMENT_TAG"):
        monkeypatch.delenv(f"TRAINMEDIC_MANAGED_{name}", raising=False)
    settings = Settings(
        managed_owners="alice, bob",
        managed_partitions="gpu, a100,",
        managed_accounts="llm",
        managed_comment_tag="tm-managed",
        event_max_age_s=600,
    )
    assert event_scope(settings) == EventScope(
        max_age_s=600,
        owners=frozenset({"alice", "bob"}),
        partitions=frozenset({"gpu", "a100"}),
        accounts=frozenset({"llm"}),
        comment_tag="tm-managed",
    )
    default = Settings(_env_file=None)  # type: ignore[call-arg]
    assert event_scope(default) == EventScope(max_age_s=default.event_max_age_s)


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("TRAINMEDIC_MANAGED_PARTITIONS", "gpu;cpu"),
        ("TRAINMEDIC_MANAGED_ACCOUNTS", "llm vision"),
        ("TRAINMEDIC_MANAGED_COMMENT_TAG", "two words"),
    ],
)
def test_bad_scope_settings_are_one_line_naming_field_and_value(
    env: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ValidationError) as caught:
        Settings(_env_file=None)  # type: ignore[call-arg]
    line = validation_message(caught.value)
    field = env.removeprefix("TRAINMEDIC_").lower()
    assert line.startswith(f"{field}={value!r}: ") and "\n" not in line
