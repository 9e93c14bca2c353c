"""Waiting on simulated jobs (polling with a deadline; never a bare sleep)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from trainmedic.models import JobInfo


def wait_finished(scheduler, job_id: str, timeout: float = 60) -> JobInfo:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    info = scheduler.job(job_id)
    while time.monotonic() < deadline:
        info = scheduler.job(job_id)
        if info.state.finished:
            return info
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} still {info.state} after {timeout} s")


def wait_step(job: JobInfo, step: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads(Path(job.heartbeat_path).read_text())["step"] >= step:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"job {job.job_id} never reached step {step}")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a server of the test's own)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
