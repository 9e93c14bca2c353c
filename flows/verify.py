"""Runbook `verify-resubmission`: a resubmitted job that waits in the queue is queued, not
failed. The remediation that resubmitted it ends (its job lock released) and this run,
started through its deployment, waits for the job instead:

    PENDING (up to TRAINMEDIC_PENDING_TIMEOUT_S) → RUNNING → heartbeat past the checkpoint
    (up to TRAINMEDIC_VERIFY_TIMEOUT_S) → Completed; never started, or ended before any
    progress → Failed, with why (a Failed run is what the on-call notification hears)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.exceptions import ObjectNotFound
from pydantic import BaseModel, ConfigDict, Field

from trainmedic.adapters.scheduler import get_scheduler
from trainmedic.core.errors import SchedulerError
from trainmedic.core.models import JobId, JobInfo, JobState
from trainmedic.core.settings import get_settings

__all__ = [
    "VerifyRequest",
    "VerifyResult",
    "heartbeat_step",
    "schedule_verification",
    "training_again",
    "verify_resubmission",
]

DEPLOYMENT = "verify-resubmission/verify-resubmission"
POLL_S = 2.0


class VerifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: JobId = Field(description="the resubmitted job")
    from_step: int = Field(ge=0, description="the checkpoint step it resumes from")


class VerifyResult(BaseModel):
    job_id: str
    state: str
    step: int | None
    waited_s: float


def heartbeat_step(heartbeat: Path) -> int | None:
    try:
        return int(json.loads(heartbeat.read_text())["step"])
    except (OSError, ValueError, KeyError):
        return None


def training_again(job: JobInfo, from_step: int) -> bool:
    """True once the job trains past ``from_step`` (or has trained to its end); raises when
    it ended without getting there."""
    if job.state is JobState.COMPLETED:
        return True  # a short remainder, or checked late
    if job.state.finished:
        why = f" ({job.reason})" if job.reason else ""
        raise SchedulerError(
            f"resubmitted job {job.job_id} ended {job.state}{why} before any progress"
        )
    step = heartbeat_step(Path(job.heartbeat_path))
    return step is not None and step > from_step


def schedule_verification(job_id: str, from_step: int) -> str | None:
    """Start this runbook for a queued resubmission (through its deployment, on the worker);
    the run's name, or None when the deployment is missing (nothing will verify it)."""
    from prefect.deployments import run_deployment

    request = VerifyRequest(job_id=job_id, from_step=from_step)
    try:
        run = run_deployment(
            DEPLOYMENT, parameters={"request": request.model_dump(mode="json")}, timeout=0
        )
    except ObjectNotFound:
        get_run_logger().error("no %s deployment: job %s is not verified", DEPLOYMENT, job_id)
        return None
    return run.name


@flow(name="verify-resubmission", log_prints=True, persist_result=True, result_serializer="json")
def verify_resubmission(request: VerifyRequest) -> VerifyResult:
    settings = get_settings()
    scheduler = get_scheduler()
    logger = get_run_logger()
    started = time.monotonic()
    pending_until = started + settings.pending_timeout_s
    job = scheduler.job(request.job_id)
    while job.state is JobState.PENDING:
        if time.monotonic() > pending_until:
            raise SchedulerError(
                f"resubmitted job {job.job_id} still PENDING ({job.reason or 'no reason'}) "
                f"after {settings.pending_timeout_s:.0f} s: it never started"
            )
        time.sleep(POLL_S)
        job = scheduler.job(request.job_id)
    logger.info("job %s left the queue: %s", job.job_id, job.state)
    progress_until = time.monotonic() + settings.verify_timeout_s
    while not training_again(job, request.from_step):
        if time.monotonic() > progress_until:
            raise SchedulerError(
                f"resubmitted job {job.job_id} made no progress past step {request.from_step} "
                f"within {settings.verify_timeout_s:.0f} s of starting"
            )
        time.sleep(POLL_S / 4)
        job = scheduler.job(request.job_id)
    step = heartbeat_step(Path(job.heartbeat_path))
    logger.info("job %s is training again (step %s)", job.job_id, step)
    return VerifyResult(
        job_id=job.job_id,
        state=str(job.state),
        step=step,
        waited_s=round(time.monotonic() - started, 1),
    )
