"""A runbook that fails notifies on-call through a Prefect automation and a webhook block:
a real server's automation service posts to a real HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import HTTPServer
from pathlib import Path

import pytest
from prefect import flow, tags
from support.ports import free_port
from support.receiver import Receiver
from support.stack import server_only
from support.waits import wait_until

from trainmedic.core.settings import Settings
from trainmedic.stack import Stack

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = Settings(home=tmp_path_factory.mktemp("notify") / "home", server_port=free_port())
    with server_only(settings) as stack:
        yield stack


@flow(name="broken-runbook")
def broken_runbook() -> None:
    raise RuntimeError("scheduler unreachable")


def test_failed_runbook_posts_to_the_webhook(server: Stack) -> None:
    from trainmedic.adapters.notifications import install

    httpd = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    Receiver.posts = []
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/hook"
        install(block_name="oncall", webhook_url=url)
        install(block_name="oncall", webhook_url=url)  # idempotent: replaced, not doubled
        with tags("trainmedic"):
            state = broken_runbook(return_state=True)
        assert state.is_failed()
        deadline = time.monotonic() + 90
        while not Receiver.posts and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(3)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert len(Receiver.posts) == 1, Receiver.posts
    message = Receiver.posts[0]
    assert "broken-runbook" in message["subject"] and "Failed" in message["subject"]
    assert "scheduler unreachable" in message["text"]
    assert "/runs/flow-run/" in message["text"]


@flow(name="paging-runbook")
def paging_runbook() -> str:
    from flows.tasks import tell_human

    record = tell_human(
        "page",
        job_id="4242",
        category="ECCError",
        summary="job 4242: crash loop: the last 3 runs of this training job failed",
        evidence="NVRM: Xid 48 on node007",
        answer="`trainmedic triage 4242` after checking",
    )
    return record.outcome


def test_a_page_reaches_the_receiver_with_the_line_that_answers_it(server: Stack) -> None:
    from trainmedic.adapters.notifications import install

    httpd = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    Receiver.posts = []
    try:
        install(block_name="oncall", webhook_url=f"http://127.0.0.1:{httpd.server_address[1]}/p")
        outcome = paging_runbook()
        assert "sent to the notification automation" in outcome
        deadline = time.monotonic() + 90
        while not Receiver.posts and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(2)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert len(Receiver.posts) == 1, Receiver.posts
    message = Receiver.posts[0]
    assert message["subject"] == "trainmedic page: job 4242 ECCError"
    assert "crash loop" in message["text"] and "Xid 48 on node007" in message["text"]
    assert "`trainmedic triage 4242` after checking" in message["text"]


def test_an_email_block_made_in_the_ui_is_accepted(server: Stack) -> None:
    """E-mail is a SendgridEmail block (made in the UI, its key a secret there): `notify
    --block NAME` installs the automations to it as to a webhook."""
    from prefect.automations import Automation
    from prefect.blocks.notifications import SendgridEmail

    from trainmedic.adapters.notifications import PAGE_AUTOMATION_NAME, install

    SendgridEmail(
        api_key="SG.not-a-real-key",
        sender_email="trainmedic@example.org",
        to_emails=["oncall@example.org"],
    ).save("oncall-mail", overwrite=True)
    install(block_name="oncall-mail")
    action = Automation.read(name=PAGE_AUTOMATION_NAME).actions[0]
    assert str(action.block_document_id) == str(
        SendgridEmail.load("oncall-mail")._block_document_id
    )


def test_up_with_a_webhook_installs_the_automations_and_status_says_so(
    tmp_path: Path,
) -> None:
    """`trainmedic up` with TRAINMEDIC_WEBHOOK_URL set installs the notification automations
    on the server it starts; `status` shows them installed (and the intake's lag)."""
    import contextlib
    import io

    from prefect.automations import Automation
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from support.stack import CLEARED, patched_environ

    from trainmedic.adapters.notifications import PAGE_AUTOMATION_NAME
    from trainmedic.cli.main import main
    from trainmedic.core.settings import get_settings
    from trainmedic.sim.cluster import SimCluster

    env = {
        "TRAINMEDIC_HOME": str(tmp_path / "home"),
        "TRAINMEDIC_INVENTORY": str(tmp_path / "inventory"),
        "TRAINMEDIC_SERVER_PORT": str(free_port()),
        "TRAINMEDIC_SIM_EXPORTER_PORT": str(free_port()),
        "TRAINMEDIC_WEBHOOK_URL": "http://127.0.0.1:9/pager",
    }
    with patched_environ(env, CLEARED):
        get_settings.cache_clear()
        settings = get_settings()
        SimCluster(settings.sim_home).create(2, inventory_dir=settings.inventory)
        out = io.StringIO()
        # As a fresh CLI process: its own server, whatever server an earlier test's fixture
        # left in this thread's Prefect settings.
        with temporary_settings({PREFECT_API_URL: settings.api_url}):
            try:
                with contextlib.redirect_stdout(out):
                    assert main(["up"]) == 0
                assert "on-call: pages and failed runs go to block" in out.getvalue()
                assert Automation.read(name=PAGE_AUTOMATION_NAME).enabled

                def status_once_the_intake_has_passed() -> str | None:
                    # The intake's first pass lands a moment after `up` returns; on a busy
                    # 2-core machine that can be after the first `status`.
                    status = io.StringIO()
                    with contextlib.redirect_stdout(status):
                        main(["status"])
                    return status.getvalue() if "last pass" in status.getvalue() else None

                shown = wait_until(status_once_the_intake_has_passed, 60, "intake's first pass", 1)
                assert "on-call: automations installed" in shown
                assert "intake: running" in shown
            finally:
                with contextlib.redirect_stdout(io.StringIO()):
                    main(["down"])
                get_settings.cache_clear()
