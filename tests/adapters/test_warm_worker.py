"""The warm worker's parts that need no server: the stack starts it (or Prefect's process
worker when told), and a fork of its forkserver has every runbook imported already."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmedic.adapters.warm_worker import PRELOAD, cold_modules, warm_context
from trainmedic.core.settings import REPO_ROOT, Settings
from trainmedic.stack import WORK_POOL, Stack


def test_every_runbook_module_is_preloaded() -> None:
    runbooks = {f"flows.{p.stem}" for p in (REPO_ROOT / "flows").glob("*.py")} - {"flows.__init__"}
    assert runbooks <= set(PRELOAD)


def test_a_fork_of_the_warm_interpreter_has_every_preload_imported() -> None:
    assert cold_modules(warm_context()) == []


@pytest.mark.parametrize(
    ("warm", "command"),
    [(True, "trainmedic.adapters.warm_worker"), (False, "worker start")],
)
def test_the_stack_starts_the_worker_it_is_told(tmp_path: Path, warm: bool, command: str) -> None:
    stack = Stack(Settings(home=tmp_path, warm_worker=warm))
    argv = " ".join(stack.worker.argv)
    assert command in argv and WORK_POOL in argv and "trainmedic-local" in argv
    assert stack.status()["worker_kind"] == ("warm" if warm else "process")


def test_a_refused_worker_label_does_not_crash_the_run(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Prefect's worker crashes a run whose worker labels the server refused (SQLite busy:
    503 after the client's retries) before it starts; the labels are for the UI only, so the
    warm worker logs it and the run goes ahead."""
    import asyncio
    import logging
    import uuid

    import httpx
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.workers.base import BaseWorker

    from trainmedic.adapters.warm_worker import WarmProcessWorker

    request = httpx.Request("PATCH", "http://127.0.0.1/api/flow_runs/x/labels")
    busy = PrefectHTTPStatusError.from_httpx_error(
        httpx.HTTPStatusError("503", request=request, response=httpx.Response(503, request=request))
    )

    async def refused(self, flow_run_id):  # type: ignore[no-untyped-def]
        raise busy

    monkeypatch.setattr(BaseWorker, "_give_worker_labels_to_flow_run", refused)
    worker = object.__new__(WarmProcessWorker)
    worker._logger = logging.getLogger("test")
    asyncio.run(worker._give_worker_labels_to_flow_run(uuid.uuid4()))  # no exception


@pytest.mark.parametrize(
    ("env", "bundle"),
    [
        ({"PREFECT_API_URL": "http://127.0.0.1:4200/api"}, True),  # plain HTTP: no CA needed
        ({"PREFECT_API_URL": "https://prefect.example.org/api"}, False),  # TLS: certifi's
        ({"PREFECT_API_URL": "http://h/api", "PREFECT_API_SSL_CERT_FILE": "/etc/site.pem"}, False),
        ({}, False),
    ],
    ids=["http", "https", "site bundle", "no url"],
)
def test_a_run_on_a_plain_http_api_loads_a_ca_bundle_that_trusts_nothing(env, bundle) -> None:
    import ssl

    from trainmedic.adapters.warm_worker import TRUSTS_NOTHING, plain_http_tls

    assert plain_http_tls(env) == (
        {"PREFECT_API_SSL_CERT_FILE": str(TRUSTS_NOTHING)} if bundle else {}
    )
    context = ssl.create_default_context(cafile=str(TRUSTS_NOTHING))
    assert context.cert_store_stats()["x509_ca"] == 1  # its own self-signed one, keyless
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
