"""Small file helpers: atomic file and JSON writes and cross-process locks."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

RecordT = TypeVar("RecordT", bound=BaseModel)


def write_json_atomic(path: Path, data: Any) -> None:
    write_bytes_atomic(path, json.dumps(data, indent=1, default=str).encode())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` whole or keeps what it held (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive advisory lock on ``path`` (created if missing), across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def append_line(path: Path, line: str) -> None:
    """Append one line (a JSON record) to a ledger file. One short O_APPEND write per record,
    so concurrent runbooks never tear each other's lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(line if line.endswith("\n") else line + "\n")


def parse_records(text: str, model: type[RecordT]) -> list[RecordT]:
    """The records of a JSON-lines ledger. A torn or foreign line (a writer killed mid-line,
    an edit by hand) is skipped, never fatal."""
    records: list[RecordT] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            records.append(model.model_validate(json.loads(line)))
        except (ValueError, ValidationError):
            continue
    return records
