"""Prefect's in-process queues (logs, events) and test servers that stop: flush what can be
sent while a server is up, drop the rest at session end so the process exits."""

from __future__ import annotations


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
