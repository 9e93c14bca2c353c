"""What every runbook, worker and CLI host must agree on lives on the Prefect server, never in
a local file: the guard's lock, the record of destructive actions (the circuit breaker and the
drain rate limit count them), trainmedic's drain records (drain ownership) and the humans'
corrections of diagnoses (every worker applies them).

* **The guard lock** is a Prefect global concurrency limit of one slot. A runbook checks the
  guard and acts while holding it, so two runs at once cannot both pass a guard that has room
  for one. It is reentrant within one thread (an isolation holds it around its drains, each of
  which passes the breaker), and held for seconds: never across a human's approval.
* **Records** are Prefect Variables, rows in the server's database (SQLite or PostgreSQL)
  that every host reads the same: one per destructive action (``tm_action_*``, kept for the
  longest window a policy may have) and one per node trainmedic holds drained
  (``tm_drain_*``, deleted when trainmedic returns the node), and one per human
  correction (``tm_correction_*``), and one per incident (``tm_incident_*``: a storm's jobs,
  claimed by one run under the incident lock, kept for the action retention), and one per
  repair (``tm_repair_*``: how a repeated fault is recognised, kept for the repair retention).

Both are per cluster (``Settings.cluster``): clusters that share one Prefect server each have
their own lock, breaker and drain records.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar
from uuid import UUID

import httpx
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings
from pydantic import ValidationError

from trainmedic.core.errors import ServerError
from trainmedic.state.records import ActionEntry, Correction, DrainRecord, Incident, RepairRecord

__all__ = [
    "ACTION_RETENTION",
    "GUARD_LOCK",
    "INCIDENT_LOCK",
    "REPAIR_RETENTION",
    "ServerState",
    "drain_variable_name",
    "ensure_limit",
    "guard_lock",
    "server_mutex",
]

GUARD_LOCK = "trainmedic-guard"
INCIDENT_LOCK = "trainmedic-incident"
# No policy window may be longer (settings cap breaker and drain windows at 7 days).
ACTION_RETENTION = timedelta(days=7)
# The repair escalation window is capped at 30 days.
REPAIR_RETENTION = timedelta(days=30)
GUARD_WAIT_S = 300
# A busy server (SQLite answering 503 "database is locked" under a storm's writes) is asked
# again within milliseconds, not after Prefect's client backs off 2 s, 4 s, 8 s...: each
# remediation met a few of these, seconds each. Still about 25 s in all before giving up.
BUSY_RETRY_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8)
# A waiter asks for a held lock this often at most. The server's own Retry-After is its
# average hold times the waiters, up to 30 s: in a burst the slot sat free while the runs
# waiting for it slept.
LOCK_POLL_S = 0.5
T = TypeVar("T")
_log = logging.getLogger(__name__)
_jitter = secrets.SystemRandom()  # waiters spread out, not in step
GUARD_LEASE_S = 300
PAGE = 200

_held: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "trainmedic_guard_held", default=frozenset()
)


@contextlib.contextmanager
def fast_client() -> Iterator[SyncPrefectClient]:
    """A Prefect client whose requests do not retry by themselves, for :func:`when_not_busy`."""
    with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}), get_client(sync_client=True) as c:
        yield c


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
                    raise ServerError(f"lock {name}: {_api_problem(exc)}") from exc
                wait = min(float(exc.response.headers.get("Retry-After", 1)), LOCK_POLL_S)
            except httpx.HTTPError as exc:
                raise ServerError(f"lock {name}: {_api_problem(exc)}") from exc
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


@contextlib.contextmanager
def guard_lock(cluster: str, timeout_s: float = GUARD_WAIT_S) -> Iterator[None]:
    """Hold the one guard lock of ``cluster`` (reentrant within a thread)."""
    name = f"{GUARD_LOCK}-{cluster}"
    if name in _held.get():
        yield
        return
    with server_mutex(name, timeout_s, GUARD_LEASE_S):
        token = _held.set(_held.get() | {name})
        try:
            yield
        finally:
            _held.reset(token)


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
        raise ServerError(f"concurrency limit {name}: {_api_problem(exc)}") from exc
    _known_limits.add(name)


def _api_problem(exc: httpx.HTTPError) -> str:
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


def drain_variable_name(cluster: str, node: str) -> str:
    """Node names are validated hostnames (lowercase letters, digits, dashes): valid in a
    variable name as they are."""
    return f"tm_drain_{cluster}_{node}"


class ServerState:
    """One cluster's server-side records. Each call opens its own client: safe from any
    thread."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.action_tag = f"trainmedic-action-{cluster}"
        self.drain_tag = f"trainmedic-drain-{cluster}"
        self.correction_tag = f"trainmedic-correction-{cluster}"
        self.incident_tag = f"trainmedic-incident-{cluster}"
        self.repair_tag = f"trainmedic-repair-{cluster}"

    def lock(self, timeout_s: float = GUARD_WAIT_S) -> contextlib.AbstractContextManager[None]:
        return guard_lock(self.cluster, timeout_s)

    def _client(self) -> contextlib.AbstractContextManager[SyncPrefectClient]:
        # Every request goes through when_not_busy: a busy moment costs milliseconds.
        return fast_client()

    def _values(self, tag: str, name_like: str) -> list[tuple[str, Any]]:
        found: list[tuple[str, Any]] = []
        try:
            with self._client() as client:
                while True:
                    body = {
                        "variables": {"tags": {"all_": [tag]}, "name": {"like_": name_like}},
                        "sort": "NAME_ASC",
                        "offset": len(found),
                        "limit": PAGE,
                    }
                    page = when_not_busy(
                        partial(client.request, "POST", "/variables/filter", json=body)
                    ).json()
                    found += [(v["name"], v["value"]) for v in page]
                    if len(page) < PAGE:
                        return found
        except httpx.HTTPError as exc:
            raise ServerError(f"reading {tag} records: {_api_problem(exc)}") from exc

    def _put(self, name: str, value: dict[str, Any], tag: str) -> None:
        try:
            with self._client() as client:
                when_not_busy(
                    partial(
                        client.request,
                        "POST",
                        "/variables/",
                        json={"name": name, "value": value, "tags": [tag]},
                    )
                )
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code in (401, 403):
                raise ServerError(f"recording {name}: {_api_problem(exc)}") from exc
            if exc.response.status_code != 409:
                raise ServerError(f"recording {name}: {exc.response.text[:200]}") from exc
            with self._client() as client:
                when_not_busy(
                    partial(
                        client.request,
                        "PATCH",
                        "/variables/name/{name}",
                        path_params={"name": name},
                        json={"value": value, "tags": [tag]},
                    )
                )
        except httpx.HTTPError as exc:
            raise ServerError(f"recording {name}: {_api_problem(exc)}") from exc

    def _delete(self, name: str) -> None:
        try:
            with self._client() as client:
                when_not_busy(partial(client.delete_variable_by_name, name))
        except ObjectNotFound:  # already gone, which is what was wanted
            return
        except httpx.HTTPError as exc:
            raise ServerError(f"deleting {name}: {_api_problem(exc)}") from exc

    # ------------------------------------------------------------------ actions

    def record_action(self, entry: ActionEntry) -> None:
        stamp = entry.at.astimezone(UTC).strftime("%Y%m%dt%H%M%S%f")
        name = f"tm_action_{self.cluster}_{stamp}_{secrets.token_hex(4)}"
        self._put(name, entry.model_dump(mode="json"), self.action_tag)

    def actions(self) -> list[ActionEntry]:
        """Every recorded action still kept, oldest first; records older than the retention
        are deleted on the way (a torn or foreign value is skipped, as a ledger line was)."""
        cutoff = datetime.now(UTC) - ACTION_RETENTION
        entries: list[ActionEntry] = []
        for name, value in self._values(self.action_tag, f"tm_action_{self.cluster}_%"):
            try:
                entry = ActionEntry.model_validate(value)
            except ValidationError:
                continue
            if entry.at < cutoff:
                self._delete(name)
                continue
            entries.append(entry)
        return sorted(entries, key=lambda e: e.at)

    # ------------------------------------------------------------------ drains

    def record_drain(self, record: DrainRecord) -> None:
        name = drain_variable_name(self.cluster, record.node)
        self._put(name, record.model_dump(mode="json"), self.drain_tag)

    def drain_record(self, node: str) -> DrainRecord | None:
        try:
            with self._client() as client:
                name = drain_variable_name(self.cluster, node)
                variable = when_not_busy(partial(client.read_variable_by_name, name))
        except httpx.HTTPError as exc:
            raise ServerError(f"reading the drain record of {node}: {_api_problem(exc)}") from exc
        if variable is None:
            return None
        try:
            record = DrainRecord.model_validate(variable.value)
        except ValidationError:
            return None
        return record if record.node == node else None

    def drain_records(self) -> list[DrainRecord]:
        records = []
        for _, value in self._values(self.drain_tag, f"tm_drain_{self.cluster}_%"):
            with contextlib.suppress(ValidationError):
                records.append(DrainRecord.model_validate(value))
        return sorted(records, key=lambda r: (r.at, r.node))

    def forget_drain(self, node: str) -> None:
        self._delete(drain_variable_name(self.cluster, node))

    # ------------------------------------------------------------------ repairs

    def record_repair(self, record: RepairRecord) -> None:
        stamp = record.at.astimezone(UTC).strftime("%Y%m%dt%H%M%S%f")
        name = f"tm_repair_{self.cluster}_{stamp}_{secrets.token_hex(4)}"
        self._put(name, record.model_dump(mode="json"), self.repair_tag)

    def repairs(self, node: str | None = None) -> list[RepairRecord]:
        """The repairs still kept (of ``node``), oldest first; older ones are deleted."""
        cutoff = datetime.now(UTC) - REPAIR_RETENTION
        found = []
        for name, value in self._values(self.repair_tag, f"tm_repair_{self.cluster}_%"):
            try:
                record = RepairRecord.model_validate(value)
            except ValidationError:
                continue
            if record.at < cutoff:
                self._delete(name)
            elif node is None or record.node == node:
                found.append(record)
        return sorted(found, key=lambda r: r.at)

    # ------------------------------------------------------------------ corrections

    def record_correction(self, correction: Correction) -> None:
        name = f"tm_correction_{self.cluster}_{correction.id}"
        self._put(name, correction.model_dump(mode="json"), self.correction_tag)

    def corrections(self) -> list[Correction]:
        """Every human correction of this cluster, oldest first."""
        found = []
        for _, value in self._values(self.correction_tag, f"tm_correction_{self.cluster}_%"):
            with contextlib.suppress(ValidationError):
                found.append(Correction.model_validate(value))
        return sorted(found, key=lambda c: c.at)

    # ------------------------------------------------------------------ incidents

    def incident_lock(
        self, timeout_s: float = GUARD_WAIT_S
    ) -> contextlib.AbstractContextManager[None]:
        """Held while a run reads the incidents and claims its jobs: two runs never claim one
        job. Held for a moment (a read and a write), never across diagnostics."""
        return server_mutex(f"{INCIDENT_LOCK}-{self.cluster}", timeout_s, GUARD_LEASE_S)

    def put_incident(self, incident: Incident) -> None:
        name = f"tm_incident_{self.cluster}_{incident.incident_id}"
        self._put(name, incident.model_dump(mode="json"), self.incident_tag)

    def incidents(self, since: datetime | None = None) -> list[Incident]:
        """This cluster's incidents (opened since ``since``), oldest first."""
        found = []
        for _, value in self._values(self.incident_tag, f"tm_incident_{self.cluster}_%"):
            with contextlib.suppress(ValidationError):
                found.append(Incident.model_validate(value))
        if since is not None:
            found = [i for i in found if i.opened_at >= since]
        return sorted(found, key=lambda i: i.opened_at)
