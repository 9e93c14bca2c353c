"""The local diagnosis ledger (everything a guard reads lives on the Prefect server)."""

from __future__ import annotations

from pathlib import Path

from trainmedic.state import Ledgers


def test_diagnosis_ledger_keeps_the_last_verdict_per_job(tmp_path: Path) -> None:
    ledger = Ledgers(tmp_path).diagnoses
    ledger.record("7", "ECCError")
    ledger.record("8", "NCCLTimeout")
    ledger.record("7", "GPUFallenOff")
    assert ledger.categories() == {"7": "GPUFallenOff", "8": "NCCLTimeout"}


def test_every_ledger_lives_under_the_home(tmp_path: Path) -> None:
    ledgers = Ledgers(tmp_path)
    assert tmp_path in ledgers.diagnoses.path.parents
