"""Locks and requests on a real Prefect server that a busy moment does not stall: a one-slot
lock has one holder, times out for a waiter and is free once released; a busy server is asked
again at once, an answer is not."""

from __future__ import annotations

import uuid

import httpx
import pytest
from support.http import serving

from trainmedic.adapters.server_lock import server_mutex, when_not_busy

pytestmark = pytest.mark.server


def test_a_held_lock_times_out_for_a_waiter_and_is_free_once_released(prefect_server) -> None:
    name = f"trainmedic-test-{uuid.uuid4().hex[:10]}"
    with (
        server_mutex(name, timeout_s=5, lease_s=60),
        pytest.raises(TimeoutError, match=name),
        server_mutex(name, 1, 60),
    ):
        pytest.fail("two holders of a one-slot lock")
    # Released on exit (an exception inside too): the next holder gets it at once.
    with pytest.raises(RuntimeError), server_mutex(name, 5, 60):
        raise RuntimeError("the work under the lock failed")
    with server_mutex(name, timeout_s=1, lease_s=60):
        pass


def test_a_busy_server_is_asked_again_soon_and_a_refusal_is_not(monkeypatch) -> None:
    """503 (SQLite busy) and an unreachable server are retried after milliseconds; a 4xx
    is an answer, raised at once."""
    monkeypatch.setattr("trainmedic.adapters.server_lock.BUSY_RETRY_S", (0.0, 0.0, 0.0))
    request = httpx.Request("POST", "http://prefect/api/variables/")
    answers = [
        httpx.HTTPStatusError("busy", request=request, response=httpx.Response(503)),
        httpx.ConnectError("refused", request=request),
        "done",
    ]

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert when_not_busy(call) == "done" and not answers
    refused = httpx.HTTPStatusError("no", request=request, response=httpx.Response(409))
    calls = []

    def conflict() -> None:
        calls.append(1)
        raise refused

    with pytest.raises(httpx.HTTPStatusError):
        when_not_busy(conflict)
    assert len(calls) == 1
    busy = httpx.HTTPStatusError("busy", request=request, response=httpx.Response(503))
    with pytest.raises(httpx.HTTPStatusError):  # still busy after every retry: raised
        when_not_busy(lambda: (_ for _ in ()).throw(busy))


def test_the_fast_client_never_retries_and_follows_the_settings_in_force() -> None:
    """No retries of Prefect's own (when_not_busy retries, sooner), without rebuilding the
    settings on every request, and never with settings that are no longer in force."""
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    from trainmedic.adapters.server_lock import fast_client

    for url in ("http://127.0.0.1:9/api", "http://127.0.0.1:10/api", "http://127.0.0.1:9/api"):
        with temporary_settings({PREFECT_API_URL: url, PREFECT_CLIENT_MAX_RETRIES: 5}):
            for _ in range(2):
                with fast_client() as client:
                    assert PREFECT_CLIENT_MAX_RETRIES.value() == 0
                    assert str(client.api_url).startswith(url)
            assert PREFECT_CLIENT_MAX_RETRIES.value() == 5  # restored after each use


def test_a_busy_answer_comes_back_at_once_without_prefects_back_off(monkeypatch) -> None:
    """Prefect's client sleeps out a back-off even after its last try before it returns a
    503 (2 s with retries off); the fast client raises it without sleeping, body readable,
    and the next request on the same client is answered."""
    import http.server

    import prefect.client.base
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from trainmedic.adapters.server_lock import fast_client

    answers = [503, 200]
    seen: list[str] = []

    class Busy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            status = answers.pop(0)
            body = b'{"exception_message": "Service Unavailable"}' if status == 503 else b"[]"
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    sleeps: list[float] = []
    monkeypatch.setattr(prefect.client.base.time, "sleep", sleeps.append)
    with (
        serving(Busy) as url,
        temporary_settings({PREFECT_API_URL: f"{url}/api"}),
        fast_client() as client,
    ):
        with pytest.raises(httpx.HTTPStatusError) as busy:
            client.hello()
        assert busy.value.response.status_code == 503
        assert "Service Unavailable" in busy.value.response.text
        assert client.hello().status_code == 200
    assert sleeps == [] and len(seen) == 2 and not answers
