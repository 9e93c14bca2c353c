"""Locks and requests on the Prefect server that a busy moment does not stall.

* :func:`server_mutex` holds a one-slot Prefect global concurrency limit (the server's atomic
  check: one holder across every worker and host) on a lease this process acquires, renews and
  releases itself. A waiter asks again every :data:`LOCK_POLL_S` at most: the server's own
  Retry-After is its average hold times the waiters, up to 30 s, and in a burst the slot sat
  free while the runs waiting for it slept.
* :func:`when_not_busy` asks again within milliseconds when the server is busy (SQLite
  answering 503 "database is locked" under a storm's writes) or unreachable, where Prefect's
  client backs off 2 s, 4 s, 8 s...: each remediation met a few of these, seconds each.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import TypeVar
from uuid import UUID

import httpx
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.context import SettingsContext, get_settings_context
from prefect.exceptions import ObjectAlreadyExists
from prefect.settings import PREFECT_CLIENT_MAX_RETRIES
from prefect.settings import Settings as PrefectSettings

from trainmedic.core.errors import ServerError

__all__ = [
    "BUSY_RETRY_S",
    "LOCK_POLL_S",
    "api_problem",
    "ensure_limit",
    "fast_client",
    "server_mutex",
    "when_not_busy",
]

# Waits between tries while the server is busy: about 25 s in all before giving up.
BUSY_RETRY_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8)
LOCK_POLL_S = 0.5  # the longest a waiter sleeps between asks for a held lock
T = TypeVar("T")
_log = logging.getLogger(__name__)
_jitter = secrets.SystemRandom()  # waiters spread out, not in step


# Answers that mean "busy, ask again". Prefect's client sleeps out its back-off even after its
# last try before it hands such an answer back (2 s with retries off: the two 503s of a single
# triage were 4.5 of its 8 s); the fast client's response hook raises them at once instead.
_BUSY_STATUS = frozenset({408, 429, 502, 503, 504})


def _raise_when_busy(response: httpx.Response) -> None:
    if response.status_code in _BUSY_STATUS:
        response.read()  # the hook runs before the body is read; api_problem quotes it
        response.raise_for_status()


@dataclasses.dataclass(frozen=True)
class _FastClient:
    pid: int  # a forked child (the warm worker's runs) makes its own: sockets are not shared
    base: PrefectSettings
    settings: PrefectSettings  # ``base`` without client retries
    client: SyncPrefectClient


# One fast client per settings in force (the last one), kept open: a client built from
# certifi's CAs costs 40 ms of CPU, and Prefect's temporary_settings rebuilds the whole
# settings model on each entry (a fifth of a triage run's CPU in a burst, py-spy).
_fast: list[_FastClient] = []


def _fast_client_for(context: SettingsContext) -> _FastClient:
    for fast in _fast:
        if fast.base is context.settings and fast.pid == os.getpid():
            return fast
    settings = context.settings.copy_with_update(updates={PREFECT_CLIENT_MAX_RETRIES: 0})
    with SettingsContext(profile=context.profile, settings=settings):
        client = get_client(
            sync_client=True, httpx_settings={"event_hooks": {"response": [_raise_when_busy]}}
        )
        client.__enter__()  # open for the life of the process; httpx clients are thread-safe
    fast = _FastClient(os.getpid(), context.settings, settings, client)
    _fast[:] = [fast]
    return fast


@contextlib.contextmanager
def fast_client() -> Iterator[SyncPrefectClient]:
    """A Prefect client whose requests neither retry nor wait by themselves, for
    :func:`when_not_busy`: a busy answer raises ``httpx.HTTPStatusError`` at once."""
    context = get_settings_context()
    fast = _fast_client_for(context)
    # Prefect reads the retry count per request, from the settings in force.
    with SettingsContext(profile=context.profile, settings=fast.settings):
        yield fast.client


def when_not_busy(call: Callable[[], T]) -> T:
    """``call()``, asked again soon while the server is busy (502/503/504) or unreachable."""
    for delay in (*BUSY_RETRY_S, None):
        try:
            return call()
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code not in (502, 503, 504) or delay is None:
                raise
        except httpx.TransportError:
            if delay is None:
                raise
        time.sleep(delay * _jitter.uniform(0.75, 1.25))
    raise AssertionError("unreachable")  # pragma: no cover - the last try returns or raises


@contextlib.contextmanager
def server_mutex(name: str, timeout_s: float, lease_s: float) -> Iterator[None]:
    """Hold the one-slot global concurrency limit ``name`` (created on first use): one
    holder at a time across every worker and host, on a lease the holder renews. A lost
    renewal (a server restart, a slow moment) does not abort the holder half-way: what runs
    under it is idempotent. TimeoutError when not acquired within ``timeout_s``."""
    lease_id = _acquire(name, timeout_s, lease_s)
    stop = threading.Event()
    renewal = threading.Thread(
        target=_renew, args=(name, lease_id, lease_s, stop), name=f"lease {name}", daemon=True
    )
    renewal.start()
    try:
        yield
    finally:
        stop.set()
        renewal.join()
        try:
            with fast_client() as client:
                when_not_busy(lambda: client.release_concurrency_slots_with_lease(lease_id))
        except httpx.HTTPError as exc:
            # The lease runs out by itself: the lock is free again after lease_s at most.
            _log.warning("lock %s not released (%s): free in %g s", name, exc, lease_s)


def _acquire(name: str, timeout_s: float, lease_s: float) -> UUID:
    deadline = time.monotonic() + timeout_s
    ensure_limit(name, 1)
    with fast_client() as client:
        while True:
            try:
                response = when_not_busy(
                    lambda: client.increment_concurrency_slots_with_lease(
                        names=[name], slots=1, mode="concurrency", lease_duration=lease_s
                    )
                )
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 423:
                    raise ServerError(f"lock {name}: {api_problem(exc)}") from exc
                wait = min(float(exc.response.headers.get("Retry-After", 1)), LOCK_POLL_S)
            except httpx.HTTPError as exc:
                raise ServerError(f"lock {name}: {api_problem(exc)}") from exc
            else:
                body = response.json()
                if body.get("limits"):
                    return UUID(body["lease_id"])
                # The limit was deleted meanwhile: a lease on nothing locks nothing.
                stray = UUID(body["lease_id"])
                when_not_busy(partial(client.release_concurrency_slots_with_lease, stray))
                _known_limits.discard(name)
                ensure_limit(name, 1)
                continue
            if time.monotonic() + wait > deadline:
                raise TimeoutError(f"lock {name} not acquired within {timeout_s:g} s")
            time.sleep(wait * _jitter.uniform(0.5, 1.0))


def _renew(name: str, lease_id: UUID, lease_s: float, stop: threading.Event) -> None:
    while not stop.wait(lease_s / 3):
        try:
            with fast_client() as client:
                when_not_busy(lambda: client.renew_concurrency_lease(lease_id, lease_s))
        except httpx.HTTPError as exc:
            _log.warning("lock %s: lease not renewed (%s); trying again", name, exc)


# Limits this process made sure of: one server round trip per name, not one per hold.
_known_limits: set[str] = set()


def ensure_limit(name: str, limit: int) -> None:
    """Create the global concurrency limit ``name`` unless it exists. Two runs creating it at
    once is normal (two events for one job): the loser finds the winner's."""
    if name in _known_limits:
        return
    try:
        # ObjectAlreadyExists: created by the other run meanwhile.
        with fast_client() as client, contextlib.suppress(ObjectAlreadyExists):
            when_not_busy(lambda: client.upsert_global_concurrency_limit_by_name(name, limit))
    except httpx.HTTPError as exc:
        raise ServerError(f"concurrency limit {name}: {api_problem(exc)}") from exc
    _known_limits.add(name)


def api_problem(exc: httpx.HTTPError) -> str:
    """What went wrong, in one line: credentials refused is not a server away (the
    exception's own text names neither, over several lines)."""
    if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in (401, 403):
        return (
            f"the Prefect API refused our credentials (HTTP {exc.response.status_code}): "
            "check TRAINMEDIC_SERVER_AUTH"
        )
    if isinstance(exc, httpx.HTTPStatusError):
        detail = " ".join(exc.response.text.split())[:160]
        return f"the Prefect API answered HTTP {exc.response.status_code}: {detail}"
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"Prefect API unreachable ({type(exc).__name__}: {first[:160]})"
