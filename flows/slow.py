"""Triage of a job that fails slow (`job.slow`, raised by the watchdog): it still trains, but
its steps take twice as long as its own earlier steps — a thermally throttled GPU, a degraded
link. Nothing failed, so there is no error to diagnose; the pair test finds the node:

    confirm the slowdown in the log → hot GPUs from DCGM → save a checkpoint and stop the job
    → pair test over its nodes (isolating what it convicts, under the policy) → resubmit from
    the saved checkpoint without them → report with the temperatures
"""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger
from prefect.runtime import flow_run
from pydantic import BaseModel

from flows.locate import pair_test_job_nodes
from flows.tasks import (
    fetch_telemetry,
    request_checkpoint,
    restart_from,
    stop_job,
    tell_human,
    wait_for_checkpoint,
)
from flows.watchdog import job_slowdown
from trainmedic.adapters import checkpoints
from trainmedic.adapters.scheduler import get_scheduler
from trainmedic.core.models import ActionRecord, Checkpoint, JobInfo, JobState
from trainmedic.core.settings import get_settings
from trainmedic.decisions.attempts import exclusions
from trainmedic.diagnosis.engine import HOT_GPU_C
from trainmedic.reports.recovery import fail_slow_report

SAVE_TIMEOUT_S = 600.0


class SlowOutcome(BaseModel):
    """What the fail-slow path did, for triage's result; ``not_handled`` when nothing."""

    drained: list[str] = []
    checkpoint_step: int | None = None
    new_job_id: str | None = None
    report: str = ""
    not_handled: str | None = None
    human_needed: str | None = None


def remediate_slow(job: JobInfo, dry_run: bool) -> SlowOutcome:
    settings = get_settings()
    logger = get_run_logger()
    if job.state is not JobState.RUNNING:
        return SlowOutcome(not_handled=f"job {job.job_id} is {job.state}, no longer training")
    found = job_slowdown(job)
    if found is None:
        return SlowOutcome(not_handled=f"job {job.job_id} is back to its usual step time")
    logger.warning("job %s fails slow: %s", job.job_id, found.describe())
    hot = [
        f"{s.host} GPU {s.gpu} at {s.temperature_c:.0f} C"
        for s in fetch_telemetry(list(job.nodes))
        if s.temperature_c is not None and s.temperature_c >= HOT_GPU_C
    ]
    run_name = flow_run.get_name() or "local"
    actions: list[ActionRecord] = []

    # Save first: the job is making progress, slowly; stopping it must not lose that.
    before, _ = checkpoints.newest_valid_in(
        Path(job.checkpoint_dir), run_id=job.spec.run_id, deep=False
    )
    saved: Checkpoint | None = None
    if request_checkpoint(job, dry_run):
        saved = wait_for_checkpoint(job, before.step if before else -1, SAVE_TIMEOUT_S)
    actions.append(stop_job(job, f"trainmedic triage {run_name}: fail-slow", dry_run))

    located, tested = pair_test_job_nodes(job, dry_run=dry_run, slow_ratio=settings.slow_pair_ratio)
    actions.extend(tested)

    scheduler = get_scheduler()
    # Without the convicted nodes, even where a human declined their drain.
    drained_now = [n.name for n in scheduler.nodes() if n.state == "DRAINED"]
    exclude = list(exclusions(job, drained_now, [*located.faulty, *located.slow]))
    checkpoint = saved or before
    new_job, restarted = restart_from(job, checkpoint, exclude=exclude, changes={}, dry_run=dry_run)
    actions.extend(restarted)
    human_needed = None
    if not located.faulty and not located.slow and not dry_run:
        # Slow, yet no node shows it in a pair test: storage, data, the code? A human looks
        # before the next slowdown stops the job again.
        human_needed = f"{found.describe()}, but the pair test found no slow node"
        actions.append(
            tell_human(
                "page",
                job_id=job.job_id,
                category="fail-slow",
                summary=f"job {job.job_id} fails slow and no node was found: {human_needed}",
                evidence="; ".join(hot) or "no hot GPU reported",
                answer=f"`trainmedic runs --job {job.job_id}`; the job was resubmitted as "
                f"{new_job.job_id if new_job else 'nothing'}",
            )
        )
    report = fail_slow_report(
        job=job,
        slowdown=found,
        hot_gpus=hot,
        saved=saved,
        faulty=located.faulty,
        slow=located.slow,
        actions=actions,
        new_job=new_job,
        dry_run=dry_run,
    )
    return SlowOutcome(
        drained=[a.target for a in actions if a.what == "drain" and a.changed],
        checkpoint_step=checkpoint.step if checkpoint else None,
        new_job_id=new_job.job_id if new_job else None,
        report=report,
        human_needed=human_needed,
    )
