"""Runbook `rollback`: the loss spiked (or went NaN) and did not come back.

load job → read its loss curve → where did the spike begin (it must be in the curve at or
before the reported step; if not, a human decides, and no answer is no) → newest valid
checkpoint before it → retry budget and crash loop (page instead) → (approval, if asked) →
stop the diverged job → resubmit from that checkpoint, skipping the data batches from the
checkpoint through the spike → verify → report
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel, ConfigDict, Field

from flows.tasks import (
    admit_event,
    ask_yes_no,
    job_lock,
    load_job,
    read_loss_history,
    restart_from,
    stop_job,
    tell_human,
)
from trainmedic.adapters import checkpoints
from trainmedic.adapters.scheduler import get_scheduler
from trainmedic.core.errors import CheckpointError
from trainmedic.core.models import ActionRecord, JobId
from trainmedic.core.settings import get_settings
from trainmedic.decisions.attempts import attempts_so_far, exclusions, failure_streak
from trainmedic.decisions.training import at_step, spike_start
from trainmedic.reports.recovery import rollback_report


class RollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: JobId
    event: str = Field(default="manual", pattern=r"^[a-z_.]{1,40}$")
    reported_step: int | None = Field(
        default=None, ge=0, description="step at which the framework saw the spike"
    )
    require_approval: bool = Field(default=False, description="pause for a human before acting")
    approval_timeout_s: int = Field(default=3600, ge=10, le=86_400)
    dry_run: bool = False
    occurred: datetime | None = Field(
        default=None, description="when the event happened (a stale one starts nothing)"
    )


class RollbackResult(BaseModel):
    job_id: str
    spike_step: int
    checkpoint_step: int | None
    checkpoint_path: str | None = None
    skip_batches: tuple[int, int] | None
    new_job_id: str | None
    report_id: str
    acted: bool = True  # False: a human or the budget said no; nothing was stopped
    not_handled: str | None = None  # a duplicate, stale or foreign event: nothing done, why


@flow(name="rollback", log_prints=True, persist_result=True, result_serializer="json")
def rollback(request: RollbackRequest) -> RollbackResult:
    with job_lock(request.job_id):
        job = load_job(request.job_id)
        admission = admit_event(job, request.event, request.occurred)
        if not admission.admitted:
            get_run_logger().warning("job %s: %s: %s", job.job_id, admission.kind, admission.why)
            return RollbackResult(
                job_id=job.job_id,
                spike_step=request.reported_step or 0,
                checkpoint_step=None,
                skip_batches=None,
                new_job_id=None,
                report_id="",
                acted=False,
                not_handled=f"{admission.kind}: {admission.why}",
            )
        return roll_back(request)


def roll_back(request: RollbackRequest) -> RollbackResult:
    """The runbook's steps, for a caller that holds the job's lock (triage, for a loss spike
    it diagnosed)."""
    logger = get_run_logger()
    settings = get_settings()
    job = load_job(request.job_id)
    history = read_loss_history(job)
    actions: list[ActionRecord] = []
    spike = spike_start(history, request.reported_step)
    approval_needed = request.require_approval
    if spike is None:
        # Reported, but not in the curve: nothing is stopped unless a human says so.
        logger.warning(
            "job %s: no loss spike in its curve at or before step %s: asking a human",
            job.job_id,
            request.reported_step,
        )
        approval_needed = True
        spike = at_step(history, request.reported_step or 0) or history[-1]
        actions.append(
            ActionRecord(
                what="verify spike",
                target=f"job {job.job_id}",
                outcome=f"no spike or NaN in the loss curve up to step {request.reported_step}: "
                "not acted on without a human",
            )
        )
    else:
        logger.info(
            "job %s: loss spike began at step %d (batch %d, loss %.4g)",
            job.job_id,
            spike.step,
            spike.batch,
            spike.loss,
        )
    target, invalid = checkpoints.newest_valid_in(
        Path(job.checkpoint_dir), before_step=spike.step, run_id=job.spec.run_id
    )
    if target is None:
        raise CheckpointError(
            f"job {job.job_id}: no valid checkpoint before step {spike.step}"
            + "".join(f"; skipped {c.step} ({c.problem})" for c in invalid)
        )
    skip = checkpoints.skip_range(target, spike.batch)
    logger.info("roll back to step %d, skip batches %d-%d", target.step, *skip)

    history_jobs = get_scheduler().jobs()
    attempts = attempts_so_far(job, history_jobs)
    streak = failure_streak(job, history_jobs)
    approved = True
    if attempts >= settings.retry_budget or streak >= settings.crash_loop_after:
        approved = False
        why = "crash loop" if streak >= settings.crash_loop_after else "retry budget spent"
        actions.append(
            tell_human(
                "page",
                job_id=job.job_id,
                category="LossSpike",
                summary=f"job {job.job_id}: loss spike at step {spike.step}, not rolled back "
                f"again ({why}): {attempts} resubmissions (budget {settings.retry_budget}), "
                f"{streak} failed attempts in a row",
                evidence=f"loss {spike.loss:.4g} at step {spike.step} (batch {spike.batch})",
                answer=f"check the data from batch {spike.batch} on, then `trainmedic restart "
                f"{job.job_id} --from-checkpoint {target.step}`",
            )
        )
    elif approval_needed and not request.dry_run:
        approved, outcome = ask_yes_no(
            job_id=job.job_id,
            category="LossSpike",
            asks=f"to roll job {job.job_id} back past a loss spike at step {spike.step}",
            evidence=f"loss spike reported at step {spike.step}",
            prompt=f"### Roll job {job.job_id} back past the loss spike at step {spike.step}?\n\n"
            "Approve to stop it, resume from the checkpoint before the spike and skip the "
            "batches through it. No answer: nothing is done.",
            timeout_s=request.approval_timeout_s,
        )
        actions.append(ActionRecord(what="approval", target="on-call", outcome=outcome))
    new_job = None
    if approved:
        actions.append(
            stop_job(job, f"trainmedic rollback: loss spike at step {spike.step}", request.dry_run)
        )
        new_job, restarted = restart_from(
            job,
            target,
            exclude=list(exclusions(job, _drained())),
            changes={"skip_batches": skip},
            dry_run=request.dry_run,
        )
        actions.extend(restarted)
    report_id = create_markdown_artifact(
        key=f"rollback-{job.job_id}",
        markdown=rollback_report(
            job=job,
            spike=spike,
            checkpoint=target,
            skip=skip,
            invalid=invalid,
            actions=actions,
            new_job=new_job,
            dry_run=request.dry_run,
        ),
        description=f"Rollback of job {job.job_id} after a loss spike",
    )
    return RollbackResult(
        job_id=job.job_id,
        spike_step=spike.step,
        checkpoint_step=target.step if approved else None,
        checkpoint_path=target.path if approved else None,
        skip_batches=skip if approved else None,
        new_job_id=new_job.job_id if new_job else None,
        report_id=str(report_id),
        acted=approved,
    )


def _drained() -> list[str]:
    return [n.name for n in get_scheduler().nodes() if n.state == "DRAINED"]
