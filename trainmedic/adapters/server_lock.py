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
import logging
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


# The settings without client retries, derived once per settings in force (the last one):
# Prefect's temporary_settings rebuilds and validates the whole Settings model on each entry,
# which was a fifth of a triage run's CPU in a burst of failures (bench/burst.py, py-spy).
_no_retries: list[tuple[PrefectSettings, PrefectSettings]] = []


def _settings_without_retries(settings: PrefectSettings) -> PrefectSettings:
    for base, derived in _no_retries:
        if base is settings:
            return derived
    derived = settings.copy_with_update(updates={PREFECT_CLIENT_MAX_RETRIES: 0})
    _no_retries[:] = [(settings, derived)]
    return derived


@contextlib.contextmanager
def fast_client() -> Iterator[SyncPrefectClient]:
    """A Prefect client whose requests do not retry by themselves, for :func:`when_not_busy`
    (the retry count is read per request, from the settings in force)."""
    context = get_settings_context()
    settings = _settings_without_retries(context.settings)
    with (
        SettingsContext(profile=context.profile, settings=settings),
        get_client(sync_client=True) as client,
    ):
        yield client


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
