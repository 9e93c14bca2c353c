"""A local OpenAI-compatible chat endpoint (real HTTP on 127.0.0.1) that answers what the
test sets and records what it was sent: the LLM fallback's counterpart in tests."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar


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
    httpd = HTTPServer(("127.0.0.1", 0), FakeModel)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    FakeModel.seen = []
    FakeModel.status = status
    FakeModel.reply = reply
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
