"""Accuracy on the dev corpus of real failure excerpts (category and root-cause host)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.corpus import read_rows

from trainmedic.diagnosis import LogSource, diagnose

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "dev-logs.jsonl"
CORPUS_CANDIDATES = [CORPUS, Path("/work/shared/corpus/dev-logs.jsonl")]
CATEGORY_THRESHOLD = 0.95
HOST_THRESHOLD = 0.9

_KEY_TOKENS = (
    re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}(?:\.\d)?"),  # PCI id
    re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b"),  # IP
    re.compile(r"\brank \d+\b"),
    re.compile(r"\b[a-z][a-z0-9]*\d[a-z0-9-]*\b"),  # node004, gpu5, viz3d-1
    re.compile(r"\bgpu \d+\b"),
)


def key_tokens(expected: str) -> list[str]:
    text = expected.lower()
    for pattern in _KEY_TOKENS:
        found = pattern.findall(text)
        if found:
            return found
    return [text]


def host_matches(expected: str, got: str | None) -> bool:
    """Any key token of the expected place (node, rank, PCI id, IP) stands, as a whole token,
    in ours: "rank 3" is not "rank 30", "node004" is in "node004 GPU 1"."""
    if got is None:
        return False
    text = got.lower()
    return any(
        re.search(rf"(?<![\w.:]){re.escape(token)}(?![\w:])", text)
        for token in key_tokens(expected)
    )


def load_corpus() -> list[dict]:
    for path in CORPUS_CANDIDATES:
        if path.exists():
            return read_rows(path)
    pytest.skip("dev corpus not available")


def test_key_tokens() -> None:
    assert key_tokens("node004 GPU 1") == ["node004"]
    assert key_tokens("GPU PCI:0000:dc:00 (Xid 149)") == ["0000:dc:00"]
    assert key_tokens("rank 0 (GPU 0)") == ["rank 0"]
    assert host_matches("Rank 0", "rank 0")
    assert host_matches("node004 GPU 1", "node004")
    assert host_matches("GPU PCI:0000:dc:00", "node7 (PCI 0000:dc:00.0)")
    assert not host_matches("rank 3", "rank 30 GPU 1")
    assert not host_matches("node004", "node0041")
    assert not host_matches("node004", None)


def test_dev_corpus_accuracy() -> None:
    rows = load_corpus()
    category_ok = 0
    host_total = host_ok = 0
    misses = []
    for row in rows:
        diagnosis = diagnose([LogSource.from_text(row["id"], row["log"])])
        if diagnosis.category.value == row["label"]:
            category_ok += 1
        else:
            misses.append(f"{row['id']}: {row['label']} -> {diagnosis.category.value}")
        assert diagnosis.layer.value == row["layer"] or diagnosis.category.value != row["label"]
        if row["root_cause_host"]:
            host_total += 1
            if host_matches(row["root_cause_host"], diagnosis.root_cause_host):
                host_ok += 1
            else:
                misses.append(
                    f"{row['id']}: host {row['root_cause_host']!r} -> {diagnosis.root_cause_host!r}"
                )
    assert category_ok / len(rows) >= CATEGORY_THRESHOLD, misses
    assert host_ok / host_total >= HOST_THRESHOLD, misses
