"""Runbook `restart`: an on-call engineer resubmits a job by hand, from the newest valid
checkpoint or from a step they name, excluding drained nodes, and checks it trains again.

    load job → stop it if it still runs → checkpoint (named step must be valid) →
    resubmit excluding drained nodes → verify → report
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel, ConfigDict, Field

from flows.tasks import job_lock, load_job, restart_from, stop_job
from trainmedic.adapters import checkpoints
from trainmedic.adapters.scheduler import get_scheduler
from trainmedic.core.errors import CheckpointError
from trainmedic.core.models import ActionRecord, JobId
from trainmedic.decisions.attempts import exclusions
from trainmedic.reports.recovery import restart_report


class RestartRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: JobId
    from_checkpoint: int | None = Field(
        default=None, ge=0, description="checkpoint step to resume from (default: newest valid)"
    )
    dry_run: bool = False


class RestartResult(BaseModel):
    job_id: str
    checkpoint_step: int
    new_job_id: str | None
    report_id: str


@flow(name="restart", log_prints=True, persist_result=True, result_serializer="json")
def restart(request: RestartRequest) -> RestartResult:
    logger = get_run_logger()
    with job_lock(request.job_id):
        job = load_job(request.job_id)
        directory = Path(job.checkpoint_dir)
        if request.from_checkpoint is None:
            # As triage chooses: newest first, this run's own, stopping at the first valid.
            target, skipped = checkpoints.newest_valid_in(directory, run_id=job.spec.run_id)
            if target is None:
                problems = ", ".join(f"{c.step} ({c.problem})" for c in skipped)
                raise CheckpointError(
                    "no valid checkpoint" + (f"; skipped invalid: {problems}" if problems else "")
                )
        else:
            path = directory / checkpoints.checkpoint_dirname(request.from_checkpoint)
            target = checkpoints.verify(path, run_id=job.spec.run_id) if path.is_dir() else None
            if target is None or not target.valid:
                problem = target.problem if target else "no such checkpoint"
                found = checkpoints.scan(directory, run_id=job.spec.run_id)
                valid = ", ".join(str(c.step) for c in found if c.valid) or "none"
                raise CheckpointError(
                    f"from_checkpoint={request.from_checkpoint}: {problem} (valid steps: {valid})"
                )
        actions: list[ActionRecord] = []
        if not job.state.finished:
            actions.append(stop_job(job, "trainmedic restart by on-call", request.dry_run))
        drained = [n.name for n in get_scheduler().nodes() if n.state == "DRAINED"]
        exclude = list(exclusions(job, drained))
        new_job, restarted = restart_from(
            job, target, exclude=exclude, changes={}, dry_run=request.dry_run
        )
        actions.extend(restarted)
        logger.info(
            "restart of %s from step %d: %s",
            job.job_id,
            target.step,
            new_job.job_id if new_job else "not resubmitted",
        )
        report_id = create_markdown_artifact(
            key=f"restart-{job.job_id}",
            markdown=restart_report(
                job=job,
                checkpoint=target,
                exclude=exclude,
                actions=actions,
                dry_run=request.dry_run,
            ),
        )
    return RestartResult(
        job_id=job.job_id,
        checkpoint_step=target.step,
        new_job_id=new_job.job_id if new_job else None,
        report_id=str(report_id),
    )
