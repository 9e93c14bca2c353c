"""The one ledger kept on the local disk: what each triage concluded, per job (the report of a
crash loop lists it). Everything a guard decides from (destructive actions, drains) is kept on
the Prefect server instead, where every worker and CLI host sees the same
(trainmedic.adapters.server_state)."""

from __future__ import annotations

from pathlib import Path

from trainmedic.core.files import locked, read_json, write_json_atomic

__all__ = ["DiagnosisLedger", "Ledgers"]


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
    """The local ledgers of one trainmedic home."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.diagnoses = DiagnosisLedger(self.home)
