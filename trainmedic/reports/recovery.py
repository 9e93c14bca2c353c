"""Reports of the recovery runbooks: rollback, restart, planned stop. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from trainmedic.core.models import ActionRecord, Checkpoint, JobInfo
from trainmedic.decisions.training import LossRecord, Slowdown
from trainmedic.reports.common import actions_table, dry_run_mark


def rollback_report(
    *,
    job: JobInfo,
    spike: LossRecord,
    checkpoint: Checkpoint,
    skip: tuple[int, int],
    invalid: Sequence[Checkpoint],
    actions: Sequence[ActionRecord],
    new_job: JobInfo | None,
    dry_run: bool,
) -> str:
    lines = [
        f"# Rollback of job {job.job_id} ({job.name}){dry_run_mark(dry_run)}",
        "",
        f"- loss spike began at **step {spike.step}** (data batch {spike.batch}, loss "
        f"{spike.loss:.4g})",
        f"- newest valid checkpoint before it: **step {checkpoint.step}** (`{checkpoint.path}`)",
        f"- data batches skipped on resubmission: **{skip[0]}-{skip[1]}**",
        f"- steps lost: {max(spike.step - checkpoint.step, 0)}",
    ]
    lines += [f"- skipped invalid checkpoint step {c.step}: {c.problem}" for c in invalid]
    lines += ["", "## Actions", "", *actions_table(actions)]
    if new_job is not None:
        lines += [
            "",
            f"New job **{new_job.job_id}** ({new_job.state}) on {', '.join(new_job.nodes)}",
        ]
    return "\n".join(lines) + "\n"


def restart_report(
    *,
    job: JobInfo,
    checkpoint: Checkpoint,
    exclude: Sequence[str],
    actions: Sequence[ActionRecord],
    dry_run: bool,
) -> str:
    lines = [
        f"# Restart of job {job.job_id} ({job.name}){dry_run_mark(dry_run)}",
        "",
        f"- checkpoint: step {checkpoint.step} (`{checkpoint.path}`)",
        f"- excluded nodes: {', '.join(exclude) or 'none'}",
        "",
        *actions_table(actions),
    ]
    return "\n".join(lines) + "\n"


def planned_stop_report(
    *,
    job: JobInfo,
    reason: str,
    newest_before: int | None,
    saved: Checkpoint | None,
    stop: ActionRecord,
    dry_run: bool,
) -> str:
    resume_step = saved.step if saved else newest_before if newest_before is not None else -1
    lines = [
        f"# Planned stop of job {job.job_id} ({job.name}){dry_run_mark(dry_run)}",
        "",
        f"- reason: {reason}",
        f"- newest checkpoint before the request: step "
        f"{newest_before if newest_before is not None else '—'}",
        f"- checkpoint saved on request: **step {saved.step}** (`{saved.path}`)"
        if saved
        else "- no checkpoint requested (dry run)",
        f"- job stopped: {'yes' if stop.changed else 'no'} ({stop.outcome})",
        f"- resume with: `trainmedic restart {job.job_id} --from-checkpoint {resume_step}`",
    ]
    return "\n".join(lines) + "\n"


def fail_slow_report(
    *,
    job: JobInfo,
    slowdown: Slowdown,
    hot_gpus: Sequence[str],
    saved: Checkpoint | None,
    faulty: Sequence[str],
    slow: Sequence[str],
    actions: Sequence[ActionRecord],
    new_job: JobInfo | None,
    dry_run: bool,
) -> str:
    lines = [
        f"# Fail-slow triage of job {job.job_id} ({job.name}){dry_run_mark(dry_run)}",
        "",
        f"- the job still trained, slowly: {slowdown.describe()}",
        "- hot GPUs (DCGM): " + (", ".join(hot_gpus) if hot_gpus else "none reported"),
        f"- checkpoint saved before the stop: step {saved.step} (`{saved.path}`)"
        if saved
        else "- no checkpoint saved on request (dry run, or the job ended first)",
        f"- pair test over its nodes: faulty {', '.join(faulty) or 'none'}, "
        f"slow {', '.join(slow) or 'none'}",
        "",
        "## Actions",
        "",
        *actions_table(actions),
    ]
    if new_job is not None:
        lines += [
            "",
            f"New job **{new_job.job_id}** ({new_job.state}) on {', '.join(new_job.nodes)}",
        ]
    return "\n".join(lines) + "\n"
