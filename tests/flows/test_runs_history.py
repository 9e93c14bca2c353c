"""`trainmedic runs` against a real Prefect server: the runs that happened, newest created
first (a run created and never started included, a run scheduled for later not), found by the
node their outcome drained, and saying when a run paged on-call."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support.waits import wait_until

from trainmedic.core.settings import Settings, get_settings
from trainmedic.stack import prefect_env

pytestmark = pytest.mark.server


@pytest.fixture(autouse=True)
def keep_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI points this process at the stack (PREFECT_API_URL...): undo it afterwards."""
    for key in prefect_env(get_settings()):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def runbook(prefect_server: None, tm_home: Settings) -> Iterator[tuple[str, Callable[..., Any]]]:
    """A runbook of its own name (other tests' runs share the server): it returns the result
    it is given, persisted as JSON where the CLI reads results, and pages on-call first when
    asked to, as the real runbooks do (a trainmedic.page event from inside the run)."""
    from prefect import flow
    from prefect.events import emit_event

    name = f"probe-{uuid.uuid4().hex[:8]}"

    def probe(request: dict[str, Any], result: dict[str, Any], page: str = "") -> dict[str, Any]:
        if page:
            emit_event(
                event="trainmedic.page",
                resource={"prefect.resource.id": "trainmedic.job.1"},
                payload={"summary": page},
            )
        return result

    storage = tm_home.prefect_home / "storage"
    yield (
        name,
        flow(name=name, persist_result=True, result_serializer="json", result_storage=storage)(
            probe
        ),
    )


def runs(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    from trainmedic.cli.main import main

    capsys.readouterr()
    assert main(["runs", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_runs_that_happened_newest_created_first(runbook, capsys) -> None:  # type: ignore[no-untyped-def]
    """Completed, then created and never started (no worker took it), then due for later
    (the watchdog's next minute: not history), then cancelled before its time (history), then
    due ten minutes ago and not started (Late: history): listed newest created first."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Pending, Scheduled

    name, probe = runbook
    probe({"job_id": "101"}, {"category": "ECCError", "drained": []})
    now = datetime.now(UTC)
    with get_client(sync_client=True) as client:
        pending = client.create_flow_run(probe, state=Pending())
        future = client.create_flow_run(
            probe, state=Scheduled(scheduled_time=now + timedelta(hours=1))
        )
        cancelled = client.create_flow_run(
            probe, state=Scheduled(scheduled_time=now + timedelta(hours=1))
        )
        client.set_flow_run_state(cancelled.id, Cancelled(message="not needed"), force=True)
        late = client.create_flow_run(
            probe, state=Scheduled(scheduled_time=now - timedelta(minutes=10))
        )

    listed = runs(capsys, "--runbook", name)
    ids = [row["flow_run_id"] for row in listed]
    assert str(future.id) not in ids
    assert len(ids) == 4 and ids[:3] == [str(late.id), str(cancelled.id), str(pending.id)]
    assert [row["state"] for row in listed] == ["Scheduled", "Cancelled", "Pending", "Completed"]
    assert listed[3]["job_id"] == "101" and listed[3]["started"] is not None
    assert listed[2]["started"] is None and listed[2]["created"] >= listed[3]["created"]

    assert [row["state"] for row in runs(capsys, "--runbook", name, "--state", "pending")] == [
        "Pending"
    ]
    # A scheduled run due in the past is history; the one due in an hour is not.
    scheduled = runs(capsys, "--runbook", name, "--state", "SCHEDULED")
    assert [row["flow_run_id"] for row in scheduled] == [str(late.id)]
    assert runs(capsys, "--runbook", name, "--limit", "2") == listed[:2]


def test_node_finds_the_runs_whose_outcome_drained_it(runbook, capsys) -> None:  # type: ignore[no-untyped-def]
    """Triage names a job, not a node: the node it drained is in its outcome."""
    name, probe = runbook
    node = f"node{uuid.uuid4().int % 900 + 100}"
    probe({"job_id": "202"}, {"category": "ECCError", "drained": [node], "new_job_id": "203"})
    probe({"node": node}, {"node": node, "restored": True})  # restore names the node
    probe({"job_id": "204"}, {"category": "NCCLTimeout", "drained": ["node999"]})

    found = runs(capsys, "--runbook", name, "--node", node)
    assert [row["job_id"] for row in found] == [None, "202"]
    assert f"drained {node}" in found[1]["outcome"]


def test_outcome_says_when_the_run_paged_on_call(runbook, capsys) -> None:  # type: ignore[no-untyped-def]
    name, probe = runbook
    probe(
        {"job_id": "301"},
        {"category": "Unknown", "drained": [], "human_needed": "cause unknown: a human looks"},
        page="job 301: Unknown needs a human",
    )
    probe({"job_id": "302"}, {"category": "ScriptError", "human_needed": "the owner fixes it"})

    def paged() -> list[dict[str, Any]] | None:
        rows = runs(capsys, "--runbook", name)
        return rows if "paged" in rows[1]["outcome"] else None

    # The page is an event: the server stores it a moment after the run emitted it.
    told, paging = wait_until(paged, 30, "the page shows in `runs`")
    assert paging["outcome"] == "Unknown; paged: cause unknown: a human looks"
    assert told["outcome"] == "ScriptError; human: the owner fixes it"  # told, not paged
    capsys.readouterr()
    from trainmedic.cli.main import main

    assert main(["runs", "--runbook", name]) == 0
    assert "paged: cause unknown" in capsys.readouterr().out
