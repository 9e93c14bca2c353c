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


def drain_prefect_workers(timeout: float = 10) -> None:
    """Send what in-process runs queued (logs, events) while their server is still up.

    Left queued, the items are retried one by one against the stopped server when the test
    process exits, which can keep it alive for a very long time.
    """
    import contextlib

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        with contextlib.suppress(Exception):
            worker.drain_all(timeout=timeout)


def discard_undeliverable_prefect_items() -> int:
    """At the end of the session: drop what is still queued for servers that are gone.

    Prefect's queue services drain at interpreter exit without a deadline; with the test
    servers stopped, nothing queued can be delivered any more.
    """
    import queue

    from prefect._internal.concurrency.services import _QueueServiceBase

    dropped = 0
    for service in list(_QueueServiceBase._instances.values()):
        pending = service._queue
        while True:
            try:
                item = pending.get_nowait()
            except queue.Empty:
                break
            if item is None:  # the stop sentinel stays: the service must still end
                pending.put_nowait(None)
                break
            pending.task_done()
            dropped += 1
    return dropped
