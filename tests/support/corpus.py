"""The labelled dev corpus (tests/corpus/dev-logs.jsonl): real failure excerpts from public
sources, read once per test process however many modules check the diagnosis against it."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

DEV_CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "dev-logs.jsonl"


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A labelled corpus's rows (JSON Lines, blank lines skipped), in file order."""
    text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@cache
def dev_rows() -> tuple[dict[str, Any], ...]:
    """Every row, in file order. Callers must not change them: the tuple is shared."""
    return tuple(read_rows(DEV_CORPUS))


@cache
def dev_lines() -> tuple[str, ...]:
    """Every distinct log line, in first-seen order. A quarter of the corpus's lines repeat (a
    log's warnings over and over), and a check of one line's verdict needs it once."""
    return tuple(dict.fromkeys(line for row in dev_rows() for line in row["log"].splitlines()))
