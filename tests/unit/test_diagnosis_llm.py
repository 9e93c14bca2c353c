"""LLM fallback against a real local HTTP server speaking the OpenAI chat shape."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from support.llm import FakeModel, model_endpoint

from trainmedic.core.settings import Settings
from trainmedic.core.taxonomy import Category
from trainmedic.diagnosis import LlmConfig, LogSource, diagnose, llm_config_from_settings
from trainmedic.diagnosis.learned import NO_WORDS
from trainmedic.diagnosis.llm import classify_with_llm, parse_llm_reply

SECRET = "sk-test-very-secret-0123456789"


@pytest.fixture
def server() -> Iterator[str]:
    with model_endpoint(
        '{"category": "StorageError", "root_cause_host": "node005", "confidence": 0.9}'
    ) as url:
        yield url


def unexplained() -> list[LogSource]:
    return [LogSource.from_lines("node005.log", ["step 10 ok", "lustre client evicted, giving up"])]


def test_llm_used_only_when_rules_fail(server: str) -> None:
    config = LlmConfig(url=server, model="tiny", api_key=SECRET, timeout_s=5)
    diagnosis = diagnose(unexplained(), llm=config)
    assert diagnosis.category is Category.StorageError
    assert diagnosis.source == "llm"
    assert diagnosis.confidence <= 0.6  # capped: a guess never looks like a rule
    assert diagnosis.root_cause_host == "node005"
    (request,) = FakeModel.seen
    assert request["path"] == "/v1/chat/completions"
    assert request["auth"] == f"Bearer {SECRET}"
    assert "lustre client evicted" in request["body"]["messages"][-1]["content"]
    ruled = diagnose([LogSource.from_text("x.log", "KeyError: 'a'\n")], llm=config)
    assert ruled.category is Category.ScriptError and len(FakeModel.seen) == 1


def test_unknown_label_becomes_unknown(server: str) -> None:
    FakeModel.reply = 'Sure! ```json\n{"category": "CosmicRay", "confidence": 0.99}\n```'
    config = LlmConfig(url=server + "/v1", model="tiny")
    assert diagnose(unexplained(), llm=config, learned=NO_WORDS).category is Category.Unknown


def test_server_error_never_leaks_the_key(server: str, caplog: pytest.LogCaptureFixture) -> None:
    FakeModel.status = 500
    config = LlmConfig(url=server, model="tiny", api_key=SECRET)
    with caplog.at_level(logging.WARNING):
        assert classify_with_llm({"a": ["x"]}, config) is None
    assert caplog.records and SECRET not in caplog.text
    assert SECRET not in repr(config)


def test_unreachable_endpoint_is_no_answer() -> None:
    config = LlmConfig(url="http://127.0.0.1:9", model="tiny", api_key=SECRET, timeout_s=1)
    assert diagnose(unexplained(), llm=config, learned=NO_WORDS).category is Category.Unknown


def test_config_from_settings_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TRAINMEDIC_LLM_URL", "TRAINMEDIC_LLM_MODEL", "TRAINMEDIC_LLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert llm_config_from_settings(Settings()) is None
    monkeypatch.setenv("TRAINMEDIC_LLM_URL", "http://h:1")
    monkeypatch.setenv("TRAINMEDIC_LLM_MODEL", "m")
    monkeypatch.setenv("TRAINMEDIC_LLM_API_KEY", "k")
    config = llm_config_from_settings(Settings())
    assert config is not None and config.endpoint == "http://h:1/v1/chat/completions"
    assert config.api_key == "k"


def test_parse_reply_rejects_garbage() -> None:
    assert parse_llm_reply({}) is None
    assert parse_llm_reply({"choices": [{"message": {"content": "no json here"}}]}) is None
    answer = parse_llm_reply(
        {"choices": [{"message": {"content": '{"category": "NaNLoss", "confidence": "high"}'}}]}
    )
    assert answer is not None and answer.category is Category.NaNLoss and answer.confidence == 0.3
