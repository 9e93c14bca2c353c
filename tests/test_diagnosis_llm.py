"""LLM fallback against a real local HTTP server speaking the OpenAI chat shape."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from trainmedic.diagnosis import LlmConfig, LogSource, diagnose, llm_config_from_env
from trainmedic.diagnosis.llm import classify_with_llm, parse_llm_reply
from trainmedic.taxonomy import Category

SECRET = "sk-test-very-secret-0123456789"


class FakeModel(BaseHTTPRequestHandler):
    reply: str = '{"category": "StorageError", "root_cause_host": "node005", "confidence": 0.9}'
    status: int = 200
    seen: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        body = json.loads(self.rfile.read(length))
        FakeModel.seen.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
        )
        payload = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": FakeModel.reply}}],
        }
        data = json.dumps(payload).encode()
        self.send_response(FakeModel.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = HTTPServer(("127.0.0.1", 0), FakeModel)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    FakeModel.seen = []
    FakeModel.status = 200
    FakeModel.reply = (
        '{"category": "StorageError", "root_cause_host": "node005", "confidence": 0.9}'
    )
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


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
    assert diagnose(unexplained(), llm=config).category is Category.Unknown


def test_server_error_never_leaks_the_key(server: str, caplog: pytest.LogCaptureFixture) -> None:
    FakeModel.status = 500
    config = LlmConfig(url=server, model="tiny", api_key=SECRET)
    with caplog.at_level(logging.WARNING):
        assert classify_with_llm({"a": ["x"]}, config) is None
    assert caplog.records and SECRET not in caplog.text
    assert SECRET not in repr(config)


def test_unreachable_endpoint_is_no_answer() -> None:
    config = LlmConfig(url="http://127.0.0.1:9", model="tiny", api_key=SECRET, timeout_s=1)
    assert diagnose(unexplained(), llm=config).category is Category.Unknown


def test_config_from_env_is_off_by_default() -> None:
    assert llm_config_from_env({}) is None
    config = llm_config_from_env(
        {
            "TRAINMEDIC_LLM_URL": "http://h:1",
            "TRAINMEDIC_LLM_MODEL": "m",
            "TRAINMEDIC_LLM_API_KEY": "k",
        }
    )
    assert config is not None and config.endpoint == "http://h:1/v1/chat/completions"


def test_parse_reply_rejects_garbage() -> None:
    assert parse_llm_reply({}) is None
    assert parse_llm_reply({"choices": [{"message": {"content": "no json here"}}]}) is None
    answer = parse_llm_reply(
        {"choices": [{"message": {"content": '{"category": "NaNLoss", "confidence": "high"}'}}]}
    )
    assert answer is not None and answer.category is Category.NaNLoss and answer.confidence == 0.3
