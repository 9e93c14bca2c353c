"""A local OpenAI-compatible chat endpoint (real HTTP on 127.0.0.1) that answers what the
test sets and records what it was sent: the LLM fallback's counterpart in tests."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

from support.http import serving


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


@contextlib.contextmanager
def model_endpoint(reply: str, status: int = 200) -> Iterator[str]:
    """Serve ``reply`` as the model's answer; yields the base URL."""
    FakeModel.seen = []
    FakeModel.status = status
    FakeModel.reply = reply
    with serving(FakeModel) as url:
        yield url
