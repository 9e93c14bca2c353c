"""The guard's state on a real Prefect server: every host sees the same records, and the guard
lock makes check-and-act atomic (two holders at once never both pass a one-slot guard)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from trainmedic.adapters.server_state import ACTION_RETENTION, ServerState, drain_variable_name
from trainmedic.state import ActionEntry, ActionKind, DrainRecord

pytestmark = pytest.mark.server


def cluster() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def entry(target: str, at: datetime | None = None) -> ActionEntry:
    return ActionEntry(kind=ActionKind.drain, target=target, at=at or datetime.now(UTC))


def test_actions_are_shared_per_cluster_and_old_ones_pruned(prefect_server) -> None:
    one, other = ServerState(cluster()), ServerState(cluster())
    one.record_action(entry("node001"))
    one.record_action(entry("node002"))
    one.record_action(entry("ancient", datetime.now(UTC) - ACTION_RETENTION - timedelta(hours=1)))
    other.record_action(entry("node009"))
    # A second reader (another worker, a CLI host) sees the same rows.
    assert [e.target for e in ServerState(one.cluster).actions()] == ["node001", "node002"]
    assert [e.target for e in other.actions()] == ["node009"]
    assert len(one.actions()) == 2  # the ancient one is gone, not just hidden


def test_drain_records_round_trip_and_are_forgotten(prefect_server) -> None:
    store = ServerState(cluster())
    record = DrainRecord(node="gpu-node-07", at=datetime.now(UTC), flow_run="r", reason="x")
    assert store.drain_record("gpu-node-07") is None
    store.record_drain(record)
    store.record_drain(record.model_copy(update={"reason": "y"}))  # a second drain: replaced
    assert store.drain_record("gpu-node-07").reason == "y"
    assert [r.node for r in store.drain_records()] == ["gpu-node-07"]
    store.forget_drain("gpu-node-07")
    store.forget_drain("gpu-node-07")  # idempotent
    assert store.drain_record("gpu-node-07") is None
    assert drain_variable_name("c1", "node-1") != drain_variable_name("c1-node", "1")


def test_two_holders_never_both_pass_a_one_slot_guard(prefect_server) -> None:
    """Each thread checks "fewer than one action recorded?", acts (slowly), records: without
    the lock both pass the check; with it the second sees the first's record."""
    store = ServerState(cluster())
    passed: list[str] = []

    def check_and_act(name: str) -> None:
        with store.lock():
            if len(store.actions()) < 1:
                time.sleep(1.0)  # the action itself
                passed.append(name)
                store.record_action(entry(name))

    threads = [threading.Thread(target=check_and_act, args=(n,)) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(passed) == 1 and len(store.actions()) == 1


def test_the_lock_is_reentrant_within_a_thread(prefect_server) -> None:
    store = ServerState(cluster())
    with store.lock(), store.lock(timeout_s=5):
        store.record_action(entry("node001"))
    assert len(store.actions()) == 1


@pytest.mark.parametrize(("updates", "fails"), [([503, 200], False), ([503] * 20, True)])
def test_replacing_a_record_while_the_server_stays_busy_is_a_server_error(
    monkeypatch, updates: list[int], fails: bool
) -> None:
    """A record that exists is replaced (409 on create, then PATCH); a busy answer is asked
    again, and one still busy after every retry is a ServerError naming the record, never the
    raw HTTP error (which once failed a storm's triage run at decide-incident)."""
    import http.server

    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_CLIENT_CSRF_SUPPORT_ENABLED,
        temporary_settings,
    )
    from support.http import serving

    import trainmedic.adapters.server_lock as server_lock
    from trainmedic.core.errors import ServerError

    asked: list[str] = []

    class Conflicting(http.server.BaseHTTPRequestHandler):
        def answer(self, status: int) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"detail": "busy or taken"}'
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            asked.append(f"POST {self.path}")
            self.answer(409)

        def do_PATCH(self) -> None:
            asked.append(f"PATCH {self.path}")
            self.answer(updates.pop(0) if updates else 503)

        def log_message(self, *args: object) -> None:
            pass

    monkeypatch.setattr(server_lock.time, "sleep", lambda _s: None)
    name = f"tm_incident_{uuid.uuid4().hex[:8]}"
    with (
        serving(Conflicting) as url,
        temporary_settings(
            {PREFECT_API_URL: f"{url}/api", PREFECT_CLIENT_CSRF_SUPPORT_ENABLED: False}
        ),
    ):
        state = ServerState(cluster())
        if fails:
            with pytest.raises(ServerError, match=f"recording {name}: .*HTTP 503"):
                state._put(name, {"jobs": ["1"]}, "tm-incident")
        else:
            state._put(name, {"jobs": ["1"]}, "tm-incident")
    assert asked[0] == "POST /api/variables/"
    assert asked[1:] and set(asked[1:]) == {f"PATCH /api/variables/name/{name}"}
    assert len(asked) == (1 + len(server_lock.BUSY_RETRY_S) + 1 if fails else 3)
