"""The resubmission chain of a training run: every job trainmedic resubmitted, back to the
first. Walked once, here; the retry budget and the crash-loop stop both read it. Pure."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from trainmedic.core.models import JobInfo, JobSpec, JobState

__all__ = [
    "FAILED_STATES",
    "attempts_so_far",
    "exclusions",
    "failure_categories",
    "failure_streak",
    "resubmission_chain",
    "spec_changes_for",
]

# How an attempt that did not end well ends: a cancellation here is trainmedic's (a hung or
# diverged job stopped before its resubmission).
FAILED_STATES = frozenset(
    {JobState.FAILED, JobState.NODE_FAIL, JobState.TIMEOUT, JobState.CANCELLED}
)


def resubmission_chain(job: JobInfo, history: Collection[JobInfo]) -> list[JobInfo]:
    """``job`` and the jobs it was resubmitted from, newest first, as far as ``history``
    (the scheduler's jobs) still knows them. A cycle in a corrupt history ends the walk."""
    by_id = {j.job_id: j for j in history}
    chain = [job]
    seen = {job.job_id}
    current = job
    while current.resubmission_of is not None and current.resubmission_of in by_id:
        current = by_id[current.resubmission_of]
        if current.job_id in seen:
            break
        seen.add(current.job_id)
        chain.append(current)
    return chain


def attempts_so_far(job: JobInfo, history: Collection[JobInfo]) -> int:
    """How many times this training run was already resubmitted."""
    return len(resubmission_chain(job, history)) - 1


def failure_streak(job: JobInfo, history: Collection[JobInfo]) -> int:
    """How many attempts of this training run failed in a row, ``job`` (the failure at hand)
    included, whatever each was diagnosed as: three misreadings of one fault (ECC, then
    NCCL timeout, then Unknown) are a crash loop as surely as three identical verdicts."""
    return len(_failed_in_a_row(job, resubmission_chain(job, history)))


def failure_categories(
    job: JobInfo, history: Collection[JobInfo], categories: Mapping[str, str]
) -> list[str]:
    """What each attempt of the streak was diagnosed as, newest first (for the report)."""
    streak = _failed_in_a_row(job, resubmission_chain(job, history))
    return [categories.get(run.job_id, "?") for run in streak]


def _failed_in_a_row(job: JobInfo, chain: list[JobInfo]) -> list[JobInfo]:
    streak = []
    for run in chain:
        if run is not job and run.state not in FAILED_STATES:
            break  # an attempt that ended otherwise (completed, or still running) ends the run
        streak.append(run)
    return streak


def exclusions(
    job: JobInfo, drained_now: Collection[str], draining: Collection[str] = ()
) -> tuple[str, ...]:
    """The nodes the next attempt must avoid: those this remediation is draining, and those
    drained now among the job's nodes and its earlier exclusions. Not every node ever
    excluded: one excluded for an earlier attempt and returned to service since (repaired,
    passed its checks) is a good node again, and excluding it for ever only shrinks the
    pool the job can start on."""
    earlier = {*job.nodes, *job.spec.exclude}
    return tuple(sorted({*draining, *(n for n in drained_now if n in earlier)}))


def spec_changes_for(
    previous: JobSpec, resume_from: int | None, changes: Mapping[str, object]
) -> dict[str, object]:
    """The spec changes of the next attempt: this remediation's ``changes``, and what the
    previous attempt's own fixes become. A fix for a lasting condition (``num_workers=0`` for
    killed dataloader workers, GC at fixed intervals) stays with the training run; batches
    skipped to get past a loss spike belong to the attempt that needed them: an attempt
    that resumes past them does not carry them on (nor report skipping them)."""
    carried: dict[str, object] = {}
    skipped = previous.skip_batches
    if skipped is not None and "skip_batches" not in changes and (resume_from or 0) >= skipped[1]:
        carried["skip_batches"] = None
    return {**carried, **changes}
