"""trainmedic's own HTTP clients (telemetry, events): one place to make them.

Each gets the process's one TLS context: building one loads the whole CA bundle (~30 ms of CPU
in a forked flow run, where a triage makes several clients), and an SSL context is made to be
shared by every connection and thread. It is httpx's own default context (certifi's CAs, or
SSL_CERT_FILE / SSL_CERT_DIR), made once.
"""

from __future__ import annotations

import functools
import ssl

import httpx

__all__ = ["http_client"]


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def http_client(timeout_s: float, transport: httpx.BaseTransport | None = None) -> httpx.Client:
    """An httpx client with ``timeout_s`` for every phase, verifying TLS as httpx does."""
    return httpx.Client(timeout=timeout_s, transport=transport, verify=_tls_context())
