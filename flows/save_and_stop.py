"""Runbook `save-and-stop`: a planned stop (maintenance, re-queue) that loses no progress.

load job → ask it to save a checkpoint now → wait until the checkpoint is valid on disk
→ stop the job → report which step the next run resumes from
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel, ConfigDict, Field

from flows.tasks import job_lock, load_job, request_checkpoint, stop_job, wait_for_checkpoint
from trainmedic.adapters import checkpoints
from trainmedic.core.errors import SchedulerError
from trainmedic.core.models import JobId
from trainmedic.core.validate import SAFE_TEXT_RE
from trainmedic.reports.recovery import planned_stop_report


class SaveAndStopRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: JobId
    reason: str = Field(default="planned stop", pattern=SAFE_TEXT_RE.pattern, max_length=200)
    save_timeout_s: float = Field(default=600, gt=0, le=7200)
    dry_run: bool = False


class SaveAndStopResult(BaseModel):
    job_id: str
    saved_step: int | None
    stopped: bool
    report_id: str


@flow(name="save-and-stop", log_prints=True, persist_result=True, result_serializer="json")
def save_and_stop(request: SaveAndStopRequest) -> SaveAndStopResult:
    logger = get_run_logger()
    with job_lock(request.job_id):
        job = load_job(request.job_id)
        if job.state.finished:
            raise SchedulerError(f"job {job.job_id} is not running ({job.state}): nothing to stop")
        # Only which step is newest matters here: manifest and sizes, no checksums.
        before, _ = checkpoints.newest_valid_in(
            Path(job.checkpoint_dir), run_id=job.spec.run_id, deep=False
        )
        newest_before = before.step if before else -1
        saved = None
        if request_checkpoint(job, request.dry_run):
            saved = wait_for_checkpoint(job, newest_before, request.save_timeout_s)
            logger.info("job %s saved step %d on request", job.job_id, saved.step)
        action = stop_job(job, f"trainmedic save-and-stop: {request.reason}", request.dry_run)
        report_id = create_markdown_artifact(
            key=f"save-and-stop-{job.job_id}",
            markdown=planned_stop_report(
                job=job,
                reason=request.reason,
                newest_before=newest_before if before else None,
                saved=saved,
                stop=action,
                dry_run=request.dry_run,
            ),
            description=f"Planned stop of job {job.job_id}",
        )
    return SaveAndStopResult(
        job_id=job.job_id,
        saved_step=saved.step if saved else None,
        stopped=action.changed,
        report_id=str(report_id),
    )
