"""Job events into Prefect: the intake's output, the deployments' triggers' input.

Events go over plain HTTP (``POST /api/events``) so that any sender — the intake, a training
framework, a Slurm strigger script — needs only an HTTP client, not Prefect.
"""

from __future__ import annotations

import os
import uuid

import httpx

from trainmedic.adapters.http import http_client
from trainmedic.core.errors import ServerError
from trainmedic.core.models import JobEvent

EVENT_PREFIX = "trainmedic."


def resource_id(job_id: str) -> str:
    return f"trainmedic.job.{job_id}"


def to_prefect_event(event: JobEvent, *, event_id: uuid.UUID | None = None) -> dict[str, object]:
    """The Prefect event for a job event. The id is derived from the job event's content, so a
    replayed job event keeps its id and the server drops the duplicate."""
    event_id = event_id or uuid.uuid5(
        uuid.NAMESPACE_URL, f"{event.kind}/{event.job_id}/{event.occurred.isoformat()}"
    )
    resource = {
        "prefect.resource.id": resource_id(event.job_id),
        "prefect.resource.name": f"job {event.job_id}",
        "trainmedic.job.id": event.job_id,
    }
    return {
        "id": str(event_id),
        "occurred": event.occurred.isoformat(),
        "event": EVENT_PREFIX + event.kind,
        "resource": resource,
        "related": [
            {"prefect.resource.id": f"trainmedic.node.{n}", "prefect.resource.role": "node"}
            for n in event.nodes
        ],
        "payload": event.model_dump(mode="json"),
    }


def _active_prefect_api_url() -> str:
    """Inside a flow run (or a Prefect settings context) the API URL lives in Prefect's
    settings rather than the environment; senders without Prefect installed never get here."""
    try:
        from prefect.settings import PREFECT_API_URL
    except ImportError:
        return ""
    return str(PREFECT_API_URL.value() or "")


def emit(
    event: JobEvent,
    *,
    api_url: str | None = None,
    timeout_s: float = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> str:
    """Send one job event to the Prefect API; returns the Prefect event id."""
    api_url = api_url or os.environ.get("PREFECT_API_URL") or _active_prefect_api_url()
    if not api_url:
        raise ServerError("PREFECT_API_URL is not set: where should the event go?")
    body = to_prefect_event(event)
    auth = os.environ.get("PREFECT_API_AUTH_STRING")
    headers = {}
    if auth:
        import base64

        headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
    try:
        with http_client(timeout_s, transport) as client:
            response = client.post(f"{api_url.rstrip('/')}/events", json=[body], headers=headers)
            response.raise_for_status()
    except httpx.HTTPError as exc:
        raise ServerError(f"could not send event {body['event']} to {api_url}: {exc}") from exc
    return str(body["id"])
