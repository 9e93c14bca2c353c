"""Every decision that needs a human reaches one: each kind of page, owner notice and
approval request is produced by a real runbook on the simulated cluster, and delivered by the
real server's notification automation to a real HTTP receiver on 127.0.0.1, with the line
that answers it.

The kinds (issue 13): crash loop, retry budget spent, cause unknown, low confidence, the LLM
fallback's suggestion, a script error (the owner's notice), an approval needed, the circuit
breaker open."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.llm import model_endpoint
from support.ports import free_port
from support.receiver import Receiver, receiving
from support.stack import server_only
from support.waits import wait_finished, wait_step

from trainmedic.core.errors import PolicyRefused
from trainmedic.core.models import JobSpec
from trainmedic.core.settings import Settings, get_settings
from trainmedic.stack import Stack

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A server with its automation service, the notification automation installed towards a
    receiver (as `trainmedic up` does when a webhook is configured)."""
    from trainmedic.adapters.notifications import install

    home = Path(tmp_path_factory.mktemp("pages")) / "home"
    with server_only(Settings(home=home, server_port=free_port())) as stack, receiving() as url:
        install(block_name="oncall", webhook_url=url)
        yield stack


def delivered(kind: str, job_id: str, must: Callable[[dict], bool]) -> dict:
    """The receiver's message of ``kind`` about ``job_id`` that ``must`` accepts."""
    subject = f"trainmedic {kind}: job {job_id} "
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        found = [p for p in list(Receiver.posts) if p["subject"].startswith(subject) and must(p)]
        if found:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"no {kind} for job {job_id} reached the receiver: {Receiver.posts}")


@pytest.fixture(autouse=True)
def fresh_receiver() -> None:
    Receiver.posts = []  # each test's clusters number their jobs from 1001 again


def failed(sim, fault: str, *, name: str):  # type: ignore[no-untyped-def]
    cluster, scheduler = sim
    job = scheduler.submit(JobSpec(name=name, nodes=2, steps=100_000, checkpoint_every=20))
    wait_step(job, 25)
    cluster.inject(job.nodes[1], fault)
    return wait_finished(scheduler, job.job_id)


def stopped_without_a_word(sim):  # type: ignore[no-untyped-def]
    """A job stopped from outside with nothing in its logs: no rule explains it."""
    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="quiet", nodes=1, steps=100_000))
    wait_step(job, 5)
    scheduler.cancel(job.job_id, "stopped outside trainmedic")
    return job


def triage(job_id: str):  # type: ignore[no-untyped-def]
    from flows.triage import TriageRequest
    from flows.triage import triage as run

    return run(TriageRequest(job_id=job_id))


def test_a_script_error_tells_the_owner(server, sim) -> None:
    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="buggy", nodes=2, steps=100_000, owner="alice"))
    wait_step(job, 5)
    scheduler.inject_job_fault(job.job_id, "script")
    wait_finished(scheduler, job.job_id)
    result = triage(job.job_id)
    assert result.new_job_id is None
    message = delivered("owner.notify", job.job_id, lambda p: "ScriptError" in p["subject"])
    assert "KeyError" in message["text"] and "(alice)" in message["text"]
    assert f"trainmedic runs --job {job.job_id}" in message["text"]


def test_a_crash_loop_pages(server, sim, policy) -> None:
    policy(auto_approve_max=2, max_share=0.5, crash_loop_after=2)
    cluster, scheduler = sim
    first = failed(sim, "ecc", name="loop")
    again = scheduler.job(triage(first.job_id).new_job_id)
    wait_step(again, 30)
    cluster.inject(again.nodes[0], "xid79")
    second = wait_finished(scheduler, again.job_id)
    assert triage(second.job_id).new_job_id is None
    message = delivered("page", second.job_id, lambda p: "crash loop" in p["text"])
    assert f"trainmedic triage {second.job_id}" in message["text"]


def test_a_spent_retry_budget_pages(server, sim, monkeypatch) -> None:
    monkeypatch.setenv("TRAINMEDIC_RETRY_BUDGET", "0")
    get_settings.cache_clear()
    job = failed(sim, "xid79", name="budget")
    assert triage(job.job_id).new_job_id is None
    message = delivered("page", job.job_id, lambda p: "retry budget spent" in p["text"])
    assert "Xid 79" in message["text"] or "fallen off" in message["text"].lower()


def test_a_job_that_stops_without_a_word_pages(server, sim) -> None:
    """Its logs (and its node's kernel lines) just stop: a guess at a hang that no rule proves
    (a crash whose last lines were lost reads the same), so a human looks before any retry."""
    job = stopped_without_a_word(sim)
    result = triage(job.job_id)
    assert result.category == "Hang" and result.new_job_id is None
    message = delivered("page", job.job_id, lambda p: "Hang" in p["subject"])
    assert f"trainmedic triage {job.job_id}" in message["text"]
    assert "Hang needs a human" in message["text"] and "no word of an error" in message["text"]


def test_a_diagnosis_below_the_confidence_floor_pages_before_a_rollback(
    server, sim, monkeypatch
) -> None:
    monkeypatch.setenv("TRAINMEDIC_CONFIDENCE_FLOOR", "1.0")
    get_settings.cache_clear()
    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="unsure", nodes=2, steps=100_000, checkpoint_every=20))
    scheduler.inject_job_fault(job.job_id, "nan", batch=30)
    wait_step(job, 40)  # it trains on, its loss NaN: diagnosed 0.9 sure, the floor is 1.0
    result = triage(job.job_id)
    assert result.category == "NaNLoss" and result.new_job_id is None
    message = delivered("page", job.job_id, lambda p: "below the floor" in p["text"])
    assert "a human confirms the diagnosis first" in message["text"]


def test_the_llm_fallbacks_suggestion_pages(server, sim, monkeypatch) -> None:
    reply = '{"category": "StorageError", "root_cause_host": null, "confidence": 0.5}'
    with model_endpoint(reply) as url:
        monkeypatch.setenv("TRAINMEDIC_LLM_URL", f"{url}/v1")
        monkeypatch.setenv("TRAINMEDIC_LLM_MODEL", "any-model")
        get_settings.cache_clear()
        job = stopped_without_a_word(sim)
        result = triage(job.job_id)
    assert result.category == "StorageError" and result.new_job_id is None
    message = delivered("page", job.job_id, lambda p: "LLM" in p["text"])
    assert "a human confirms or corrects it" in message["text"]


def test_an_approval_needed_reaches_on_call_with_the_line_that_answers_it(
    server, sim, policy, monkeypatch
) -> None:
    policy(auto_approve_max=0, max_share=0.5)
    monkeypatch.setenv("TRAINMEDIC_APPROVAL_TIMEOUT_S", "10")
    get_settings.cache_clear()
    job = failed(sim, "xid79", name="ask")
    result = triage(job.job_id)  # nobody answers: after 10 s nothing is drained
    assert result.drained == []
    message = delivered("approval.needed", job.job_id, lambda p: "asks to drain" in p["text"])
    assert "trainmedic approve " in message["text"] and "--reject" in message["text"]


def test_an_open_circuit_breaker_pages(server, sim, policy) -> None:
    policy(breaker_limit=2, min_drainable=4)
    _, scheduler = sim
    first = failed(sim, "ecc", name="one")
    done = triage(first.job_id)  # drain + resubmit: the breaker's two actions
    assert done.drained and done.new_job_id
    scheduler.cancel(done.new_job_id, "free the nodes")
    second = failed(sim, "xid79", name="two")
    with pytest.raises(PolicyRefused):
        triage(second.job_id)
    refused = second.nodes[1]
    message = delivered(
        "page", "-", lambda p: "circuit breaker" in p["subject"] and refused in p["text"]
    )
    assert "trainmedic breaker --reset" in message["text"]
