"""The ledgers: one API over every file trainmedic remembers; torn lines are skipped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from trainmedic.state import ActionEntry, ActionKind, DrainRecord, Ledgers

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def test_drain_ledger_round_trip_skips_torn_lines(tmp_path: Path) -> None:
    ledger = Ledgers(tmp_path).drains
    assert ledger.read() == []
    records = [
        DrainRecord(node=n, at=NOW - timedelta(minutes=m), flow_run="r")
        for n, m in (("n1", 3), ("n2", 2))
    ]
    ledger.append(records[0])
    with ledger.path.open("a") as handle:  # a writer killed mid-line, then junk
        handle.write('{"node": "n3", "at": "garb\n\nnot json\n')
    ledger.append(records[1])
    assert ledger.read() == records


def test_action_ledger_round_trip_skips_torn_lines(tmp_path: Path) -> None:
    ledger = Ledgers(tmp_path).actions
    entries = [
        ActionEntry(kind=k, target="node001", at=NOW - timedelta(minutes=m))
        for k, m in ((ActionKind.drain, 2), (ActionKind.breaker_reset, 1))
    ]
    ledger.append(entries[0])
    with ledger.path.open("a") as handle:
        handle.write('{"kind": "drain", "tar\n')
    ledger.append(entries[1])
    assert [e.at for e in ledger.read()] == [e.at for e in entries]


def test_diagnosis_ledger_keeps_the_last_verdict_per_job(tmp_path: Path) -> None:
    ledger = Ledgers(tmp_path).diagnoses
    ledger.record("7", "ECCError")
    ledger.record("8", "NCCLTimeout")
    ledger.record("7", "GPUFallenOff")
    assert ledger.categories() == {"7": "GPUFallenOff", "8": "NCCLTimeout"}


def test_every_ledger_lives_under_the_home(tmp_path: Path) -> None:
    ledgers = Ledgers(tmp_path)
    for path in (ledgers.drains.path, ledgers.actions.path, ledgers.diagnoses.path):
        assert tmp_path in path.parents
