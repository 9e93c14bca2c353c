"""Builders: a valid model with every field a test does not care about filled in, and the
log lines many diagnosis tests need."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from trainmedic.core.models import Diagnosis, JobInfo, JobSpec, JobState
from trainmedic.diagnosis import LogSource, diagnose


def job_info(
    job_id: str = "1001",
    *,
    state: JobState = JobState.FAILED,
    nodes: Sequence[str] = ("node001",),
    resubmission_of: str | None = None,
    ended: bool = False,
    gpus_per_node: int = 4,
) -> JobInfo:
    """A job of the training run "gpt" that ended with ``state`` (exit code 1)."""
    now = datetime.now(UTC)
    return JobInfo(
        job_id=job_id,
        name="gpt",
        state=state,
        nodes=tuple(nodes),
        exit_code=1,
        log_dir="/x/logs",
        checkpoint_dir="/x/ckpt",
        heartbeat_path="/x/hb",
        spec=JobSpec(name="gpt", nodes=len(nodes), gpus_per_node=gpus_per_node),
        submitted_at=now,
        ended_at=now if ended else None,
        resubmission_of=resubmission_of,
    )


def nccl_watchdog_timeout(rank: int, seq: int = 812) -> str:
    """PyTorch's NCCL watchdog reporting rank ``rank``'s collective ``seq`` timed out."""
    return (
        f"[rank{rank}]:[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1048576, "
        "NumelOut=1048576, Timeout(ms)=600000) ran for 600012 milliseconds before timing out."
    )


def diagnosed(*lines: str) -> Diagnosis:
    """The diagnosis of one log file holding these lines."""
    return diagnose([LogSource.from_lines("job.log", list(lines))])
