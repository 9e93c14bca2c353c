"""Job events on a real Prefect server: which jobs' runbook starts the server gave up on."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from support.waits import wait_until

from trainmedic.adapters.events import dropped_jobs, emit
from trainmedic.core.models import JobEvent

pytestmark = pytest.mark.server


def _action_failed(api_url: str, triggering_event_id: str) -> None:
    """What Prefect's actions service records when it gives up on a run-deployment action
    (its related resources name the event the automation fired on)."""
    body = {
        "id": str(uuid.uuid4()),
        "occurred": datetime.now(UTC).isoformat(),
        "event": "prefect.automation.action.failed",
        "resource": {"prefect.resource.id": f"prefect.automation.{uuid.uuid4()}"},
        "related": [
            {
                "prefect.resource.id": f"prefect.event.{uuid.uuid4()}",
                "prefect.resource.role": "automation-triggered-event",
            },
            {
                "prefect.resource.id": f"prefect.event.{triggering_event_id}",
                "prefect.resource.role": "triggering-event",
            },
        ],
        "payload": {"action_type": "run-deployment", "reason": "Unexpected status: 503"},
    }
    httpx.post(f"{api_url}/events", json=[body], timeout=10).raise_for_status()


def test_the_jobs_whose_triggered_start_the_server_dropped(prefect_server) -> None:
    from prefect.settings import PREFECT_API_URL

    api_url = str(PREFECT_API_URL.value()).rstrip("/")
    since = datetime.now(UTC) - timedelta(seconds=5)
    dropped = emit(JobEvent(kind="job.failed", job_id="4242"))
    emit(JobEvent(kind="job.failed", job_id="4243"))  # its action went through
    assert dropped_jobs(since) == set()
    _action_failed(api_url, dropped)
    # The server persists events in batches: a moment later it answers.
    wait_until(lambda: dropped_jobs(since) == {"4242"}, 30, "the dropped job")
    assert dropped_jobs(datetime.now(UTC) + timedelta(seconds=60)) == set()
