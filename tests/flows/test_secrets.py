"""Secrets (the LLM key here) reach only the service they are for: never a log line or an
artifact of the run, whether they come from the environment or a Prefect Secret block."""

from __future__ import annotations

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from support.llm import FakeModel, model_endpoint
from support.waits import wait_step

from trainmedic.core.models import JobSpec
from trainmedic.core.settings import get_settings

pytestmark = pytest.mark.server
SECRET = "sk-live-DO-NOT-LEAK-4242424242"


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    reply = '{"category": "StorageError", "root_cause_host": null, "confidence": 0.5}'
    with model_endpoint(reply) as url:
        monkeypatch.setenv("TRAINMEDIC_LLM_URL", f"{url}/v1")
        monkeypatch.setenv("TRAINMEDIC_LLM_MODEL", "any-model")
        yield FakeModel


def unexplained_failure(sim):  # type: ignore[no-untyped-def]
    """A job stopped without a word in its logs: no rule explains it, the LLM is asked."""
    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="quiet", nodes=1, steps=100_000))
    wait_step(job, 5)
    scheduler.cancel(job.job_id, "stopped outside trainmedic")
    return scheduler.job(job.job_id)


def run_text(flow_run_id) -> str:  # type: ignore[no-untyped-def]
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
        )
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return "\n".join([*(log.message for log in logs), *(str(a.data) for a in artifacts)])


@pytest.mark.parametrize("source", ["env", "secret-block"])
def test_llm_key_is_used_but_never_logged(prefect_server, sim, llm, monkeypatch, source) -> None:
    from prefect.blocks.system import Secret

    from flows.triage import TriageRequest, triage

    if source == "env":
        monkeypatch.setenv("TRAINMEDIC_LLM_API_KEY", SECRET)
    else:
        monkeypatch.delenv("TRAINMEDIC_LLM_API_KEY", raising=False)
        Secret(value=SECRET).save("trainmedic-llm-key", overwrite=True)
        monkeypatch.setenv("TRAINMEDIC_LLM_API_KEY_BLOCK", "trainmedic-llm-key")
    get_settings.cache_clear()  # settings are read once per process: this one just changed
    job = unexplained_failure(sim)
    state = triage(TriageRequest(job_id=job.job_id), return_state=True)
    result = state.result()
    assert result.category == "StorageError"  # the model's answer, validated
    assert result.new_job_id is None  # a suggestion: a human confirms first
    assert [seen["auth"] for seen in llm.seen] == [f"Bearer {SECRET}"]
    text = run_text(state.state_details.flow_run_id)
    assert "StorageError" in text and "llm" in text
    assert SECRET not in text
