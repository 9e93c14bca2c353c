"""One API over every ledger trainmedic keeps under its home directory.

* ``drains``: every drain trainmedic made (JSON lines); the blast-radius rate limit reads it.
* ``actions``: every destructive action and breaker reset (JSON lines); the circuit breaker.
* ``diagnoses``: what each triage concluded, per job: tells a crash loop from bad luck.

JSON-lines ledgers are appended with one short O_APPEND write per record, so concurrent
runbooks never tear each other's lines; a torn or foreign line is skipped when read.
"""

from __future__ import annotations

from pathlib import Path

from trainmedic.core.files import append_line, locked, parse_records, read_json, write_json_atomic
from trainmedic.state.records import ActionEntry, DrainRecord

__all__ = ["ActionLedger", "DiagnosisLedger", "DrainLedger", "Ledgers"]


class DrainLedger:
    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, record: DrainRecord) -> None:
        append_line(self.path, record.model_dump_json())

    def read(self) -> list[DrainRecord]:
        """The ledger's records; losing a torn one only makes the rate limit more permissive
        by one node."""
        return parse_records(self.path.read_text(), DrainRecord) if self.path.exists() else []


class ActionLedger:
    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, entry: ActionEntry) -> None:
        append_line(self.path, entry.model_dump_json())

    def read(self) -> list[ActionEntry]:
        """A torn or foreign line is skipped: it can only make the breaker more permissive
        by one."""
        return parse_records(self.path.read_text(), ActionEntry) if self.path.exists() else []


class DiagnosisLedger:
    def __init__(self, home: Path) -> None:
        self.path = Path(home) / "diagnoses.json"
        self.lock = Path(home) / "diagnoses.lock"

    def record(self, job_id: str, category: str) -> None:
        with locked(self.lock):
            data = read_json(self.path, {}) or {}
            data[job_id] = category
            write_json_atomic(self.path, data)

    def categories(self) -> dict[str, str]:
        return dict(read_json(self.path, {}) or {})


class Ledgers:
    """Every ledger of one trainmedic home, found one way."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.drains = DrainLedger(self.home / "isolation" / "drains.jsonl")
        self.actions = ActionLedger(self.home / "safety" / "actions.jsonl")
        self.diagnoses = DiagnosisLedger(self.home)
