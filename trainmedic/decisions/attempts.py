"""The resubmission chain of a training run: every job trainmedic resubmitted, back to the
first. Walked once, here; the retry budget and the crash-loop stop both read it. Pure."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from trainmedic.core.models import JobInfo

__all__ = ["attempts_so_far", "resubmission_chain", "same_failure_streak"]


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


def same_failure_streak(
    job: JobInfo, history: Collection[JobInfo], categories: Mapping[str, str]
) -> int:
    """How many consecutive runs of this training run ended with the same category
    (``categories`` maps job id → diagnosed category)."""
    category = categories.get(job.job_id)
    if not category:
        return 0
    streak = 0
    for run in resubmission_chain(job, history):
        if categories.get(run.job_id) != category:
            break
        streak += 1
    return streak
