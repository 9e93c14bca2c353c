"""Log sources: a file, stdin or in-memory lines, read as big binary blocks."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from trainmedic.core.errors import InputError
from trainmedic.core.validate import log_number

__all__ = ["BLOCK_SIZE", "LogSource", "host_and_rank_from_name"]

# 1 MiB blocks: big enough that per-block Python overhead vanishes, small enough to stay
# in cache for the translate/split passes and to keep RSS flat.
BLOCK_SIZE = 1 << 20
BINARY_PROBE = 8192

_NAME_TOKEN_SPLIT = re.compile(r"[._\s]+")
_RANK_TOKEN = re.compile(r"^(?:rank|r)-?0*(\d+)$", re.IGNORECASE)
_HOST_TOKEN = re.compile(r"^[a-z][a-z0-9]*?\d+(?:-\d+)?$", re.IGNORECASE)
_NOT_HOSTS = frozenset({"log", "err", "out", "stdout", "stderr", "dmesg", "txt", "jsonl"})
_SLURM_OUTPUT = re.compile(r"^(?:slurm|job)-?\d+$", re.IGNORECASE)


def host_and_rank_from_name(name: str) -> tuple[str | None, int | None]:
    """Guess host and rank from names like ``node007.log``, ``rank-00003.node002.err``,
    ``node002-dmesg.log`` or ``rank3.log``."""
    stem = Path(name).name
    host: str | None = None
    rank: int | None = None
    tokens = [t for t in _NAME_TOKEN_SPLIT.split(stem) if t]
    for token in tokens:
        # "rank-00003" and "node002-dmesg" both use "-": rank first, then host-dash-suffix.
        rank_match = _RANK_TOKEN.match(token)
        if rank_match and rank is None:
            rank = log_number(rank_match.group(1))
            continue
        for part in _dash_candidates(token):
            rank_match = _RANK_TOKEN.match(part)
            if rank_match:
                if rank is None:
                    rank = log_number(rank_match.group(1))
                break
            if (
                host is None
                and _HOST_TOKEN.match(part)
                and part.lower() not in _NOT_HOSTS
                and not _SLURM_OUTPUT.match(part)
            ):
                host = part.lower()
                break
    return host, rank


def _dash_candidates(token: str) -> list[str]:
    # "node002-dmesg" -> node002 ; "viz3d-1" stays whole ; "rank-3" handled by the caller.
    candidates = [token]
    if "-" in token:
        head = token.split("-", 1)[0]
        candidates.append(head)
    return candidates


@dataclass
class LogSource:
    """One log of one job: a rank's stdout, a node's dmesg, a launcher log.

    ``open_blocks`` returns an iterator of raw byte blocks; it is called once per
    diagnosis, so a source built from a path can be diagnosed twice.
    """

    name: str
    open_blocks: Callable[[], Iterator[bytes]] = field(repr=False)
    host: str | None = None
    rank: int | None = None

    @classmethod
    def from_path(cls, path: str | Path, *, host: str | None = None, rank: int | None = None):
        text_path = str(path)
        if text_path == "-":
            return cls.from_stream("<stdin>", sys.stdin.buffer, host=host, rank=rank)
        resolved = Path(path)
        if not resolved.exists():
            raise InputError("logfile", text_path, "no such file")
        if not resolved.is_file():
            raise InputError("logfile", text_path, "not a regular file")
        guessed_host, guessed_rank = host_and_rank_from_name(text_path)

        def blocks() -> Iterator[bytes]:
            try:
                with resolved.open("rb", buffering=0) as handle:
                    yield from _checked_blocks(handle, text_path)
            except OSError as exc:
                raise InputError("logfile", text_path, exc.strerror or str(exc)) from exc

        return cls(
            name=text_path,
            open_blocks=blocks,
            host=host if host is not None else guessed_host,
            rank=rank if rank is not None else guessed_rank,
        )

    @classmethod
    def from_stream(
        cls, name: str, stream: BinaryIO, *, host: str | None = None, rank: int | None = None
    ):
        consumed = False

        def blocks() -> Iterator[bytes]:
            nonlocal consumed
            if consumed:
                raise InputError("logfile", name, "a stream can only be read once")
            consumed = True
            yield from _checked_blocks(stream, name)

        return cls(name=name, open_blocks=blocks, **_placed(name, host, rank))

    @classmethod
    def from_text(cls, name: str, text: str, *, host: str | None = None, rank: int | None = None):
        data = text.encode("utf-8", "surrogateescape")
        return cls(name=name, open_blocks=lambda: iter((data,)), **_placed(name, host, rank))

    @classmethod
    def from_lines(
        cls,
        name: str,
        lines: Iterable[str | bytes],
        *,
        host: str | None = None,
        rank: int | None = None,
    ):
        def blocks() -> Iterator[bytes]:
            pending: list[bytes] = []
            size = 0
            for line in lines:
                raw = line.encode("utf-8", "surrogateescape") if isinstance(line, str) else line
                if not raw.endswith(b"\n"):
                    raw += b"\n"
                pending.append(raw)
                size += len(raw)
                if size >= BLOCK_SIZE:
                    yield b"".join(pending)
                    pending, size = [], 0
            if pending:
                yield b"".join(pending)

        return cls(name=name, open_blocks=blocks, **_placed(name, host, rank))


def _placed(name: str, host: str | None, rank: int | None) -> dict[str, str | int | None]:
    guessed_host, guessed_rank = host_and_rank_from_name(name)
    return {
        "host": host if host is not None else guessed_host,
        "rank": rank if rank is not None else guessed_rank,
    }


def _checked_blocks(handle: BinaryIO, name: str) -> Iterator[bytes]:
    first = True
    while True:
        block = handle.read(BLOCK_SIZE)
        if not block:
            return
        if first:
            first = False
            if b"\x00" in block[:BINARY_PROBE]:
                raise InputError("logfile", name, "binary file (NUL bytes), not a text log")
        yield block
