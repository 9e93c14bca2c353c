"""What each triage concluded, per job: the memory that tells a crash loop (the same failure
again and again after every resubmission) from bad luck."""

from __future__ import annotations

from pathlib import Path

from trainmedic.files import locked, read_json, write_json_atomic


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
