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


def test_a_worker_label_neither_delays_nor_crashes_the_run(monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """Prefect's worker awaits the run's worker labels before it submits the run (a 503 under
    a storm: seconds of back-off) and crashes the run when they are refused; the labels are
    for the UI only, so the warm worker sets them in the background and logs a refusal."""
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
    answered: list[asyncio.Event] = []

    async def refused(self, flow_run_id):  # type: ignore[no-untyped-def]
        await answered[0].wait()  # the server still retrying / backing off
        raise busy

    monkeypatch.setattr(BaseWorker, "_give_worker_labels_to_flow_run", refused)

    async def submit() -> None:
        answered.append(asyncio.Event())
        worker = object.__new__(WarmProcessWorker)
        worker._logger = logging.getLogger("test.warm")
        worker._labelling = set()
        # Returns with the label still pending (awaiting it would wait here for ever).
        await asyncio.wait_for(worker._give_worker_labels_to_flow_run(uuid.uuid4()), 10)
        assert len(worker._labelling) == 1
        answered[0].set()
        await asyncio.gather(*worker._labelling)  # no exception out of it
        assert not worker._labelling

    with caplog.at_level(logging.WARNING, logger="test.warm"):
        asyncio.run(submit())
    assert "worker labels not set" in caplog.text and "the run goes ahead" in caplog.text


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
