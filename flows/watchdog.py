"""Runbook `watchdog` (scheduled): find jobs that hang silently — no log line, no heartbeat,
GPUs idle — which the study found only when a user happened to look, and raise `job.hung`
for each; and jobs that fail slow — still training, but their steps take twice as long as
their own earlier steps (an overheating or throttled GPU, a degraded link) — and raise
`job.slow`. Both trigger `triage`.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, ConfigDict, Field

from flows.tasks import fetch_telemetry
from trainmedic.adapters.events import emit
from trainmedic.adapters.scheduler import get_scheduler
from trainmedic.core.models import JobEvent, JobInfo, JobState
from trainmedic.core.settings import get_settings
from trainmedic.decisions.training import Slowdown, is_hung, parse_step_times, slowdown

# Enough of a log's end for a few hundred steps' lines.
LOG_TAIL_BYTES = 256 * 1024


class WatchdogRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hang_timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        description="no heartbeat and no log line for this long (default: the setting "
        "TRAINMEDIC_HANG_TIMEOUT_S, which triage uses too)",
    )
    dry_run: bool = False


class SlowFinding(BaseModel):
    job_id: str
    slowdown: Slowdown
    hot_gpus: list[str]  # "node003 GPU 2 at 96 C"


class HangFinding(BaseModel):
    job_id: str
    heartbeat_age_s: float | None
    log_age_s: float | None
    gpu_utilization_max: float | None
    stalled_since: datetime  # last heartbeat or log line, whole seconds


def _age(path: Path, now: float) -> float | None:
    try:
        return now - path.stat().st_mtime
    except OSError:
        return None


def _log_age(job: JobInfo, now: float) -> float | None:
    log_dir = Path(job.log_dir)
    try:
        newest = max((p.stat().st_mtime for p in log_dir.iterdir() if p.is_file()), default=None)
    except OSError:
        return None
    return None if newest is None else now - newest


@task(name="find-hung-jobs", cache_policy=NO_CACHE)
def find_hung_jobs(timeout_s: float) -> list[HangFinding]:
    now = time.time()
    findings = []
    for job in get_scheduler().jobs():
        if job.state is not JobState.RUNNING:
            continue
        heartbeat_age = _age(Path(job.heartbeat_path), now)
        log_age = _log_age(job, now)
        utilization = [
            s.gpu_utilization
            for s in fetch_telemetry.fn(list(job.nodes))
            if s.gpu_utilization is not None
        ]
        if is_hung(
            heartbeat_age_s=heartbeat_age,
            log_age_s=log_age,
            timeout_s=timeout_s,
            gpu_utilization=utilization,
        ):
            age = min(a for a in (heartbeat_age, log_age) if a is not None)
            findings.append(
                HangFinding(
                    job_id=job.job_id,
                    heartbeat_age_s=heartbeat_age,
                    log_age_s=log_age,
                    gpu_utilization_max=max(utilization) if utilization else None,
                    stalled_since=datetime.fromtimestamp(int(now - age), UTC),
                )
            )
    return findings


def rank0_log(job: JobInfo) -> Path | None:
    """Rank 0's stdout (where the framework prints its step lines), if the job has one."""
    log_dir = Path(job.log_dir)
    candidates = sorted(log_dir.glob("rank-00000.*.out")) or sorted(log_dir.glob("*.out"))
    return candidates[0] if candidates else None


def rank0_log_tail(job: JobInfo) -> list[str]:
    """The last lines of rank 0's stdout."""
    path = rank0_log(job)
    if path is None:
        return []
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - LOG_TAIL_BYTES))
            data = handle.read()
    except OSError:
        return []
    lines = data.decode(errors="replace").splitlines()
    return lines[1:] if size > LOG_TAIL_BYTES else lines  # the first may be cut


def job_slowdown(job: JobInfo) -> Slowdown | None:
    """The job's slowdown against its own history, by the installation's settings."""
    settings = get_settings()
    return slowdown(
        parse_step_times(rank0_log_tail(job)),
        factor=settings.slow_step_factor,
        recent=settings.slow_recent_steps,
        min_duration_s=settings.slow_min_s,
    )


@task(name="find-slow-jobs", cache_policy=NO_CACHE)
def find_slow_jobs(hung: list[str]) -> list[SlowFinding]:
    from trainmedic.diagnosis.engine import HOT_GPU_C

    findings = []
    for job in get_scheduler().jobs():
        if job.state is not JobState.RUNNING or job.job_id in hung:
            continue
        found = job_slowdown(job)
        if found is None:
            continue
        hot = [
            f"{s.host} GPU {s.gpu} at {s.temperature_c:.0f} C"
            for s in fetch_telemetry.fn(list(job.nodes))
            if s.temperature_c is not None and s.temperature_c >= HOT_GPU_C
        ]
        findings.append(SlowFinding(job_id=job.job_id, slowdown=found, hot_gpus=hot))
    return findings


@flow(name="watchdog", log_prints=True)
def watchdog(request: WatchdogRequest) -> list[HangFinding]:
    logger = get_run_logger()
    timeout_s = request.hang_timeout_s or get_settings().hang_timeout_s
    findings = find_hung_jobs(timeout_s)
    for finding in findings:
        age = min(a for a in (finding.heartbeat_age_s, finding.log_age_s) if a is not None)
        logger.warning("job %s hangs: no progress for %.0f s", finding.job_id, age)
        if not request.dry_run:
            job = get_scheduler().job(finding.job_id)
            # "occurred" is when progress stopped, not now: every watchdog pass that sees the
            # same hang sends the same event id, which the server keeps once.
            emit(
                JobEvent(
                    kind="job.hung",
                    job_id=job.job_id,
                    nodes=job.nodes,
                    occurred=finding.stalled_since,
                    reason=f"no heartbeat or log line for {age:.0f} s",
                )
            )
    if not findings:
        logger.info("no hung job (timeout %.0f s)", timeout_s)
    for slow in find_slow_jobs([f.job_id for f in findings]):
        why = slow.slowdown.describe() + (
            f"; hot: {', '.join(slow.hot_gpus)}" if slow.hot_gpus else ""
        )
        logger.warning("job %s fails slow: %s", slow.job_id, why)
        if not request.dry_run:
            job = get_scheduler().job(slow.job_id)
            emit(
                JobEvent(
                    kind="job.slow",
                    job_id=job.job_id,
                    nodes=job.nodes,
                    # When the slowdown began, where the log says: one event id per slowdown.
                    occurred=slow.slowdown.since.replace(tzinfo=UTC)
                    if slow.slowdown.since
                    else datetime.now(UTC),
                    step=slow.slowdown.since_step,
                    reason=why[:512],
                )
            )
    return findings
