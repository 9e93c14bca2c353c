"""Does this event start a remediation at all? Automation that acts on replayed, stale or
someone else's events does harm at machine speed: a drain driven by a day-old event hits a
node repaired since; a resubmission of a job already resubmitted runs two copies; a job
trainmedic does not manage is not its to touch. So before any diagnostics, a run is admitted
or it ends at once, recorded with why. Pure: the caller reads the job, the clock and the
scheduler's history."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from pydantic import Field

from trainmedic.core.models import JobInfo, Strict
from trainmedic.core.settings import Settings

__all__ = ["Admission", "EventScope", "admit", "event_scope", "out_of_scope"]


class EventScope(Strict):
    """Which events this installation acts on (server-side settings)."""

    max_age_s: int = Field(default=3600, ge=60, description="older events are stale")
    owners: frozenset[str] = Field(
        default=frozenset(), description="job owners managed (empty: every owner)"
    )
    partitions: frozenset[str] = Field(
        default=frozenset(), description="scheduler partitions managed (empty: every one)"
    )
    accounts: frozenset[str] = Field(
        default=frozenset(), description="scheduler accounts managed (empty: every one)"
    )
    comment_tag: str = Field(
        default="", description="text a managed job's comment contains (empty: any comment)"
    )


class Admission(Strict):
    admitted: bool
    kind: str  # "admitted", "duplicate", "stale", "foreign"
    why: str


def admit(
    job: JobInfo,
    *,
    event: str,
    occurred: datetime | None,
    now: datetime,
    resubmissions: Collection[JobInfo],
    scope: EventScope,
) -> Admission:
    """``resubmissions``: the jobs the scheduler knows as resubmissions of ``job``. A human's
    request (``event == "manual"``) is never stale, but still only for managed jobs: submitted
    through trainmedic, and within the scope's owners, partitions, accounts and comment tag.
    Scope comes first: a job not ours is reported as such, whatever else is true of it."""
    foreign = out_of_scope(job, scope)
    if foreign is not None:
        return Admission(admitted=False, kind="foreign", why=foreign)
    if resubmissions:
        first = sorted(resubmissions, key=lambda j: int(j.job_id.split("_")[0]))[0]
        return Admission(
            admitted=False,
            kind="duplicate",
            why=f"job {job.job_id} was already resubmitted as {first.job_id}: "
            f"this {event} event is a replay or a re-detection",
        )
    if event != "manual" and occurred is not None:
        age = (now - occurred).total_seconds()
        if age > scope.max_age_s:
            return Admission(
                admitted=False,
                kind="stale",
                why=f"the {event} event is {age / 60:.0f} min old (more than "
                f"{scope.max_age_s // 60} min): the cluster has moved on since; "
                "a human can still run `trainmedic triage` on it",
            )
    return Admission(admitted=True, kind="admitted", why="")


def out_of_scope(job: JobInfo, scope: EventScope) -> str | None:
    """Why ``job`` is not this installation's to remediate (not submitted through trainmedic,
    or outside the scope's owners, partitions, accounts or comment tag); None when it is."""
    if not job.managed:
        return f"job {job.job_id} was not submitted through trainmedic: not its to remediate"
    if scope.owners and job.spec.owner not in scope.owners:
        return f"job {job.job_id} belongs to {job.spec.owner}, not one of the managed owners"
    # What the scheduler reports, never the spec's wishes: a job is where Slurm put it.
    # Unknown ("") is out of scope when a scope is set: automation acts only where the scope
    # is proven.
    if scope.partitions and job.partition not in scope.partitions:
        return (
            f"job {job.job_id} is in partition {job.partition or '(unknown)'}, not one "
            f"of the managed partitions ({', '.join(sorted(scope.partitions))})"
        )
    if scope.accounts and job.account not in scope.accounts:
        return (
            f"job {job.job_id} is charged to account {job.account or '(none)'}, not one "
            f"of the managed accounts ({', '.join(sorted(scope.accounts))})"
        )
    if scope.comment_tag and scope.comment_tag not in job.comment:
        # Someone else's comment is free text: a bounded excerpt in the record.
        return (
            f"job {job.job_id}'s comment {job.comment[:120]!r} lacks the managed tag "
            f"{scope.comment_tag!r}"
        )
    return None


def event_scope(settings: Settings) -> EventScope:
    return EventScope(
        max_age_s=settings.event_max_age_s,
        owners=_names(settings.managed_owners),
        partitions=_names(settings.managed_partitions),
        accounts=_names(settings.managed_accounts),
        comment_tag=settings.managed_comment_tag,
    )


def _names(value: str) -> frozenset[str]:
    """A comma-separated setting; blanks around the commas and empty items are ignored."""
    return frozenset(n.strip() for n in value.split(",") if n.strip())
