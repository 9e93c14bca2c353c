"""Production setting: basic auth on the Prefect API (PREFECT_SERVER_API_AUTH_STRING), with
every client of the stack sending PREFECT_API_AUTH_STRING. A real server checks it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.ports import free_port
from support.stack import server_only

from trainmedic.adapters.events import emit
from trainmedic.core.errors import ServerError
from trainmedic.core.models import JobEvent
from trainmedic.core.settings import Settings
from trainmedic.stack import Stack

pytestmark = [pytest.mark.server, pytest.mark.slow]
AUTH = "oncall:correct-horse-battery"


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("auth") / "home"
    settings = Settings(home=home, server_port=free_port(), server_auth=AUTH)
    with server_only(settings, client=False) as stack:
        yield stack


def test_api_refuses_requests_without_credentials(guarded_server: Stack) -> None:
    url = f"{guarded_server.api_url}/flows/filter"
    assert httpx.post(url, json={}, timeout=10).status_code == 401
    assert httpx.post(url, json={}, auth=("oncall", "wrong"), timeout=10).status_code == 401
    assert httpx.post(url, json={}, auth=tuple(AUTH.split(":")), timeout=10).status_code == 200


def test_events_need_the_credentials_too(guarded_server: Stack, monkeypatch) -> None:
    event = JobEvent(kind="job.failed", job_id="4242")
    monkeypatch.delenv("PREFECT_API_AUTH_STRING", raising=False)
    with pytest.raises(ServerError, match="401"):
        emit(event, api_url=guarded_server.api_url)
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", AUTH)
    emit(event, api_url=guarded_server.api_url)


def test_the_credentials_stay_out_of_status_and_logs(guarded_server: Stack) -> None:
    assert AUTH not in str(guarded_server.status())
    assert AUTH not in Path(guarded_server.server.log_file).read_text()
    assert guarded_server.healthy()  # the stack's own probe authenticates
