"""What every runbook, worker and CLI host must agree on lives on the Prefect server, never in
a local file: the guard's lock, the record of destructive actions (the circuit breaker and the
drain rate limit count them), trainmedic's drain records (drain ownership) and the humans'
corrections of diagnoses (every worker applies them).

* **The guard lock** is a Prefect global concurrency limit of one slot
  (:func:`trainmedic.adapters.server_lock.server_mutex`). A runbook checks the
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
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import httpx
from prefect.client.orchestration import SyncPrefectClient
from prefect.exceptions import ObjectNotFound
from pydantic import ValidationError

from trainmedic.adapters.server_lock import api_problem, fast_client, server_mutex, when_not_busy
from trainmedic.core.errors import ServerError
from trainmedic.state.records import ActionEntry, Correction, DrainRecord, Incident, RepairRecord

__all__ = [
    "ACTION_RETENTION",
    "GUARD_LOCK",
    "INCIDENT_LOCK",
    "REPAIR_RETENTION",
    "ServerState",
    "drain_variable_name",
    "guard_lock",
]

GUARD_LOCK = "trainmedic-guard"
INCIDENT_LOCK = "trainmedic-incident"
# No policy window may be longer (settings cap breaker and drain windows at 7 days).
ACTION_RETENTION = timedelta(days=7)
# The repair escalation window is capped at 30 days.
REPAIR_RETENTION = timedelta(days=30)
GUARD_WAIT_S = 300
GUARD_LEASE_S = 300
PAGE = 200

_held: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "trainmedic_guard_held", default=frozenset()
)


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
            raise ServerError(f"reading {tag} records: {api_problem(exc)}") from exc

    def _put(self, name: str, value: dict[str, Any], tag: str) -> None:
        body = {"value": value, "tags": [tag]}
        try:
            with self._client() as client:
                try:
                    when_not_busy(
                        partial(client.request, "POST", "/variables/", json={"name": name, **body})
                    )
                    return
                except httpx.HTTPStatusError as exc:
                    if exc.response.status_code != 409:
                        raise
                # It exists (an incident decided, then closed): its value is replaced. Still
                # busy after every retry is a ServerError like any other failed write, never
                # the raw HTTP error (a decided incident's record once failed a run that way).
                when_not_busy(
                    partial(
                        client.request,
                        "PATCH",
                        "/variables/name/{name}",
                        path_params={"name": name},
                        json=body,
                    )
                )
        except httpx.HTTPError as exc:
            raise ServerError(f"recording {name}: {api_problem(exc)}") from exc

    def _delete(self, name: str) -> None:
        try:
            with self._client() as client:
                when_not_busy(partial(client.delete_variable_by_name, name))
        except ObjectNotFound:  # already gone, which is what was wanted
            return
        except httpx.HTTPError as exc:
            raise ServerError(f"deleting {name}: {api_problem(exc)}") from exc

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
            raise ServerError(f"reading the drain record of {node}: {api_problem(exc)}") from exc
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
