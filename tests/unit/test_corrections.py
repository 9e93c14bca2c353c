"""A human's correction, learnt: the same failure lines (other numbers) get the human's
verdict and origin; other failures keep the engine's (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from trainmedic.core.models import Diagnosis
from trainmedic.core.taxonomy import Category, layer_of, remediation_for
from trainmedic.decisions.corrections import (
    apply_corrections,
    as_overlay,
    fingerprint,
    matching,
)
from trainmedic.diagnosis import LogSource, diagnose, load_catalogue
from trainmedic.diagnosis.overlay import load_with_overlay
from trainmedic.state.records import Correction

CAT = load_catalogue()


def failure(step: int, shard: int, host: str = "node007") -> list[LogSource]:
    """A failure no signature knows: a vendor library's message, then the collective cascade."""
    bad = (
        f"[2026-12-0{step % 9 + 1} 10:00:0{step % 10}] [rank{shard}]: WekaFS: "
        f"client lease lost for inode 0x{shard:x}ab{step} (generation {step * 7}), aborting I/O\n"
    )
    return [
        LogSource.from_text(
            f"rank-00001.{host}.err", bad + "RuntimeError: step failed\n", host=host
        ),
        LogSource.from_text(
            "rank-00000.node001.err",
            f"[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum={step})\n",
            host="node001",
        ),
    ]


def corrected(sources: list[LogSource], *, host: str | None) -> Correction:
    lines = fingerprint(sources, CAT)
    host_template = next((x.template for x in reversed(lines) if x.host == host), None)
    return Correction(
        id="c1",
        job_id="1001",
        category="StorageError",
        templates=tuple(x.template for x in lines),
        host_template=host_template,
        host=host,
        examples=tuple(x.text for x in lines),
        by="alice",
        reason="WekaFS lease loss",
        at=datetime.now(UTC),
    )


def test_the_unexplained_line_leads_the_fingerprint() -> None:
    lines = fingerprint(failure(120, 3), CAT)
    assert any("wekafs: client lease lost" in x.template for x in lines)
    assert all("1" not in x.template for x in lines)  # digits masked: numbers do not matter


def test_a_later_failure_with_the_same_lines_gets_the_human_verdict_and_origin() -> None:
    correction = corrected(failure(120, 3), host="node007")
    later = failure(5500, 12, host="node042")  # other step, shard, inode and node
    engine = diagnose(later)
    assert engine.category != Category.StorageError
    fixed = apply_corrections(engine, later, [correction], CAT)
    assert fixed.category is Category.StorageError and fixed.source == "human"
    assert fixed.root_cause_host == "node042"  # where the corrected line is, this time
    assert "alice corrected job 1001" in fixed.evidence[0].text
    assert fixed.layer == layer_of(Category.StorageError)


def test_other_failures_keep_the_engine_verdict() -> None:
    correction = corrected(failure(120, 3), host=None)
    other = [
        LogSource.from_text(
            "rank-00001.node002.err", "RuntimeError: CUDA error: an illegal memory access\n"
        )
    ]
    engine = diagnose(other)
    assert apply_corrections(engine, other, [correction], CAT) == engine
    unknown = Diagnosis(
        category=Category.Unknown,
        layer=layer_of(Category.Unknown),
        confidence=0.0,
        remediation=remediation_for(Category.Unknown),
    )
    assert apply_corrections(unknown, other, [], CAT) == unknown


def test_the_newest_matching_correction_wins() -> None:
    old = corrected(failure(120, 3), host=None)
    new = old.model_copy(
        update={"id": "c2", "category": "NetworkError", "at": old.at + timedelta(hours=1)}
    )
    lines = fingerprint(failure(7, 1), CAT)
    assert matching(lines, [old, new]) == new


def test_corrections_export_as_an_overlay_that_diagnoses_their_example(tmp_path) -> None:
    correction = corrected(failure(120, 3), host="node007")
    path = tmp_path / "overlay.toml"
    exported = as_overlay([correction])
    assert "wekafs" in exported.lower() and "correction-c1" in exported
    path.write_text(exported)
    catalogue = load_with_overlay(str(path))  # validates: regex, example, anchor
    later = failure(31337, 9, host="node042")[:1]
    assert diagnose(later, catalogue=catalogue).category is Category.StorageError
    assert as_overlay([]) == ""
