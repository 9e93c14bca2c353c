"""Job events into Prefect: the intake's output, the deployments' triggers' input.

Events go over plain HTTP (``POST /api/events``) so that any sender — the intake, a training
framework, a Slurm strigger script — needs only an HTTP client, not Prefect.
"""

from __future__ import annotations

import os
import uuid
from datetime import datetime

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
    try:
        with http_client(timeout_s, transport) as client:
            response = client.post(f"{api_url.rstrip('/')}/events", json=[body], headers=_headers())
            response.raise_for_status()
    except httpx.HTTPError as exc:
        raise ServerError(f"could not send event {body['event']} to {api_url}: {exc}") from exc
    return str(body["id"])


def _headers() -> dict[str, str]:
    auth = os.environ.get("PREFECT_API_AUTH_STRING")
    if not auth:
        return {}
    import base64

    return {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()}


# The server's page of /events/filter. A server that dropped more starts than this in the
# intake's grace drops nearly everything: the ones past the page wait out the grace.
_PAGE = 50


def dropped_jobs(
    since: datetime,
    *,
    api_url: str | None = None,
    timeout_s: float = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> set[str]:
    """The jobs whose event an automation fired on since ``since`` and whose action the
    server then gave up on (``prefect.automation.action.failed``: under a burst on SQLite, a
    run it could not create): the failed action names its triggering event, which names the
    job."""
    api_url = (api_url or os.environ.get("PREFECT_API_URL") or _active_prefect_api_url()).rstrip(
        "/"
    )
    if not api_url:
        raise ServerError("PREFECT_API_URL is not set: which server dropped what?")
    failed = {
        "filter": {
            "occurred": {"since": since.isoformat()},
            "event": {"name": ["prefect.automation.action.failed"]},
        },
        "limit": _PAGE,
    }
    try:
        with http_client(timeout_s, transport) as client:
            response = client.post(f"{api_url}/events/filter", json=failed, headers=_headers())
            response.raise_for_status()
            triggering = sorted(
                {
                    related["prefect.resource.id"].removeprefix("prefect.event.")
                    for event in response.json().get("events", [])
                    for related in event.get("related", [])
                    if related.get("prefect.resource.role") == "triggering-event"
                }
            )
            if not triggering:
                return set()
            body = {"filter": {"id": {"id": triggering}}, "limit": _PAGE}
            response = client.post(f"{api_url}/events/filter", json=body, headers=_headers())
            response.raise_for_status()
    except (httpx.HTTPError, ValueError) as exc:
        raise ServerError(f"could not read dropped actions from {api_url}: {exc}") from exc
    return {
        str(event["resource"]["trainmedic.job.id"])
        for event in response.json().get("events", [])
        if str(event.get("event", "")).startswith(EVENT_PREFIX + "job.")
        and event.get("resource", {}).get("trainmedic.job.id")
    }
