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

__all__ = ["Admission", "EventScope", "admit", "event_scope"]


class EventScope(Strict):
    """Which events this installation acts on (server-side settings)."""

    max_age_s: int = Field(default=3600, ge=60, description="older events are stale")
    owners: frozenset[str] = Field(
        default=frozenset(), description="job owners managed (empty: every owner)"
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
    request (``event == "manual"``) is never stale, but still only for managed jobs."""
    if not job.managed:
        return Admission(
            admitted=False,
            kind="foreign",
            why=f"job {job.job_id} was not submitted through trainmedic: not its to remediate",
        )
    if scope.owners and job.spec.owner not in scope.owners:
        return Admission(
            admitted=False,
            kind="foreign",
            why=f"job {job.job_id} belongs to {job.spec.owner}, not one of the managed owners",
        )
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


def event_scope(settings: Settings) -> EventScope:
    owners = frozenset(o.strip() for o in settings.managed_owners.split(",") if o.strip())
    return EventScope(max_age_s=settings.event_max_age_s, owners=owners)
