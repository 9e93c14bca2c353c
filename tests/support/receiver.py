"""On-call's end of a webhook: a real HTTP receiver on 127.0.0.1 that keeps what it gets."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

from support.http import serving


class Receiver(BaseHTTPRequestHandler):
    posts: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.posts.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def receiving() -> Iterator[str]:
    """A receiver listening for the block; yields its URL. ``Receiver.posts`` starts empty."""
    Receiver.posts = []
    with serving(Receiver) as url:
        yield f"{url}/hook"
