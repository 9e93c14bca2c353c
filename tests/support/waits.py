"""Pollers with a deadline: a test waits for a condition, never for a fixed time."""

from __future__ import annotations

import contextvars
import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from trainmedic.core.models import JobInfo

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1
) -> T:
    """Poll ``condition`` until it returns something truthy (returned), or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


def wait_finished(scheduler, job_id: str, timeout: float = 60) -> JobInfo:  # type: ignore[no-untyped-def]
    def finished() -> JobInfo | None:
        info = scheduler.job(job_id)
        return info if info.state.finished else None

    return wait_until(finished, timeout, f"job {job_id} finished")


def wait_step(job: JobInfo, step: int, timeout: float = 60) -> None:
    def reached() -> bool:
        try:
            return json.loads(Path(job.heartbeat_path).read_text())["step"] >= step
        except (OSError, ValueError, KeyError):
            return False

    wait_until(reached, timeout, f"job {job.job_id} at step {step}", interval=0.05)


def unique_run_name(prefix: str) -> str:
    """A flow run name no other test uses: how a test finds *its own* run on a shared server."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_paused(run_name: str, timeout: float = 90, box: dict | None = None) -> UUID:
    """The id of the flow run named ``run_name`` once it is paused (waiting for a human).
    ``box``: the run's thread result (run_in_thread): an error there ends the wait at once."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    seen: dict[str, str] = {}

    def paused() -> UUID | None:
        if box is not None and "error" in box:
            raise AssertionError(f"flow run {run_name} failed before pausing: {box['error']!r}")
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[run_name]))
            )
        seen["state"] = ", ".join(str(r.state.name if r.state else "?") for r in runs) or "none"
        return next((r.id for r in runs if r.state is not None and r.state.is_paused()), None)

    try:
        return wait_until(paused, timeout, f"flow run {run_name} paused", interval=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (its state: {seen.get('state', 'never read')})") from None


def run_in_thread(flow: Any, request: Any, run_name: str) -> tuple[threading.Thread, dict]:
    """Run ``flow(request)`` as ``run_name`` in a thread (it may pause for a human); the
    result or the exception lands in the returned dict."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["result"] = flow.with_options(flow_run_name=run_name)(request)
        except BaseException as exc:  # handed to the test thread
            box["error"] = exc

    # The server's URL may live in this thread's Prefect settings context, which a new thread
    # would not see (it would start an ephemeral server of its own): run inside a copy.
    thread = threading.Thread(target=contextvars.copy_context().run, args=(target,), daemon=True)
    thread.start()
    return thread, box


def server_events(resource_id: str, api_url: str | None = None) -> list[dict[str, Any]]:
    """The events the Prefect server stored about ``resource_id`` (a job's
    ``trainmedic.job.<id>``, a run's ``trainmedic.run.<name>``; a trailing ``*`` matches a
    prefix), oldest first."""
    import httpx
    from prefect.settings import PREFECT_API_URL

    url = api_url or str(PREFECT_API_URL.value())
    wanted = (
        {"id_prefix": [resource_id[:-1]]} if resource_id.endswith("*") else {"id": [resource_id]}
    )
    response = httpx.post(
        f"{url.rstrip('/')}/events/filter",
        json={"filter": {"any_resource": wanted, "order": "ASC"}, "limit": 50},
        timeout=10,
    )
    response.raise_for_status()
    return list(response.json()["events"])


def paused_triage(sim, prefix: str) -> tuple[JobInfo, str, str, threading.Thread, dict]:  # type: ignore[no-untyped-def]
    """A 2-node job whose second node lost a GPU (Xid 79), triaged in a thread as a run
    named from ``prefix``, paused asking a human to drain that node (the caller's policy
    asks before any drain). The failed job, the origin, the run name, the thread, its box."""
    from flows.triage import TriageRequest, triage
    from trainmedic.core.models import JobSpec

    cluster, scheduler = sim
    job = scheduler.submit(JobSpec(name="ask", nodes=2, steps=100_000, checkpoint_every=20))
    wait_step(job, 25)
    origin = job.nodes[1]
    cluster.inject(origin, "xid79")
    failed = wait_finished(scheduler, job.job_id)
    run_name = unique_run_name(prefix)
    thread, box = run_in_thread(triage, TriageRequest(job_id=failed.job_id), run_name)
    wait_paused(run_name, box=box)
    return failed, origin, run_name, thread, box
