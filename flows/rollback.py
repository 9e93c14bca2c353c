"""Runbook `rollback`: the loss spiked (or went NaN) and did not come back.

load job → read its loss curve → where did the spike begin → newest valid checkpoint
before it → (approval, if asked) → stop the diverged job → resubmit from that checkpoint,
skipping the data batches from the checkpoint through the spike → verify → report
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger, pause_flow_run
from prefect.artifacts import create_markdown_artifact
from prefect.input import RunInput
from pydantic import BaseModel, ConfigDict, Field

from flows.tasks import (
    job_lock,
    load_job,
    read_loss_history,
    restart_from,
    stop_job,
)
from trainmedic.adapters import checkpoints
from trainmedic.core.models import ActionRecord, JobId
from trainmedic.decisions.training import spike_start
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


class RollbackApproval(RunInput):
    approve: bool = Field(description="roll back and resubmit as planned")
    note: str = Field(default="", max_length=200)


class RollbackResult(BaseModel):
    job_id: str
    spike_step: int
    checkpoint_step: int | None
    skip_batches: tuple[int, int] | None
    new_job_id: str | None
    report_id: str


@flow(name="rollback", log_prints=True)
def rollback(request: RollbackRequest) -> RollbackResult:
    logger = get_run_logger()
    with job_lock(request.job_id):
        job = load_job(request.job_id)
        history = read_loss_history(job)
        spike = spike_start(history, request.reported_step)
        logger.info(
            "job %s: loss spike began at step %d (batch %d, loss %.4g)",
            job.job_id,
            spike.step,
            spike.batch,
            spike.loss,
        )
        found = checkpoints.scan(Path(job.checkpoint_dir))
        target, skip = checkpoints.rollback_plan(
            found, spike_step=spike.step, spike_batch=spike.batch
        )
        logger.info("roll back to step %d, skip batches %d-%d", target.step, *skip)

        actions: list[ActionRecord] = []
        approved = True
        if request.require_approval and not request.dry_run:
            answer = pause_flow_run(
                wait_for_input=RollbackApproval.with_initial_data(approve=True),
                timeout=request.approval_timeout_s,
            )
            approved = answer.approve
            actions.append(
                ActionRecord(
                    what="approval",
                    target="on-call",
                    outcome=("approved" if approved else "rejected")
                    + (f": {answer.note}" if answer.note else ""),
                )
            )
        new_job = None
        if approved:
            actions.append(
                stop_job(
                    job, f"trainmedic rollback: loss spike at step {spike.step}", request.dry_run
                )
            )
            new_job, restarted = restart_from(
                job,
                target,
                exclude=list(job.spec.exclude),
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
                invalid=[c for c in found if not c.valid],
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
        skip_batches=skip if approved else None,
        new_job_id=new_job.job_id if new_job else None,
        report_id=str(report_id),
    )
