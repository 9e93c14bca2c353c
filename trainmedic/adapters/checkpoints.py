"""Checkpoints: validate them and choose the one to restart from.

Layout (Megatron-style): ``<dir>/iter_0000150/`` holding shard files and a ``manifest.json``
written last, with the sha256 and size of every shard, the step, the last data batch consumed
and the training run that wrote it. A checkpoint without a manifest (the job died while
saving), with a shard whose size or checksum does not match (truncated, corrupted), or written
by another training run (a stale directory of the same name) is invalid and never chosen.

Checksums cost: a terabyte checkpoint takes hours to hash. So validation goes newest first
and stops at the first valid checkpoint, shard hashes are cached by (path, size, mtime), and
polling for a new checkpoint only checks the manifest and the sizes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path

from trainmedic.core.errors import CheckpointError
from trainmedic.core.models import Checkpoint

MANIFEST = "manifest.json"
_DIR_RE = re.compile(r"^iter_(\d{7,})$")
_CHUNK = 1 << 20


def checkpoint_dirname(step: int) -> str:
    return f"iter_{step:07d}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


_HASHES: dict[tuple[str, int, int], str] = {}
_HASH_CACHE_MAX = 4096


def cached_sha256(path: Path) -> str:
    """sha256 of ``path``, hashed once per (path, size, mtime): a shard rewritten in place
    gets a new mtime, hence a new hash."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHES:
        if len(_HASHES) >= _HASH_CACHE_MAX:
            _HASHES.pop(next(iter(_HASHES)))
        _HASHES[key] = sha256_file(path)
    return _HASHES[key]


def verify(path: Path, *, run_id: str | None = None, deep: bool = True) -> Checkpoint:
    """Check one checkpoint directory against its manifest: every shard's size, and with
    ``deep`` its checksum; with ``run_id``, that the manifest names this training run."""
    match = _DIR_RE.match(path.name)
    step = int(match[1]) if match else -1
    if step < 0:
        return Checkpoint(step=0, path=str(path), valid=False, problem="not a checkpoint dir")
    manifest_path = path / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        return Checkpoint(step=step, path=str(path), valid=False, problem="no manifest (partial)")
    except (OSError, ValueError) as exc:
        return Checkpoint(step=step, path=str(path), valid=False, problem=f"bad manifest: {exc}")
    if manifest.get("step") != step:
        return Checkpoint(
            step=step, path=str(path), valid=False, problem="manifest step does not match"
        )
    written_by = manifest.get("run")
    if run_id is not None and written_by is not None and written_by != run_id:
        return Checkpoint(
            step=step,
            path=str(path),
            valid=False,
            problem=f"written by another training run ({written_by})",
        )
    sizes = manifest.get("sizes", {})
    for name, expected in sorted(manifest.get("files", {}).items()):
        shard = path / name
        if not shard.is_file():
            return Checkpoint(step=step, path=str(path), valid=False, problem=f"{name} missing")
        if name in sizes and shard.stat().st_size != sizes[name]:
            return Checkpoint(step=step, path=str(path), valid=False, problem=f"{name} truncated")
        if deep and cached_sha256(shard) != expected:
            return Checkpoint(
                step=step, path=str(path), valid=False, problem=f"{name} checksum mismatch"
            )
    if not manifest.get("files"):
        return Checkpoint(step=step, path=str(path), valid=False, problem="manifest lists no files")
    return Checkpoint(
        step=step,
        path=str(path),
        valid=True,
        loss=manifest.get("loss"),
        batch=manifest.get("batch", step),
    )


def checkpoint_dirs(checkpoint_dir: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every checkpoint under ``checkpoint_dir``, newest first; nothing
    read but the directory listing."""
    if not checkpoint_dir.is_dir():
        return []
    found = []
    for path in checkpoint_dir.iterdir():
        match = _DIR_RE.match(path.name)
        if match and path.is_dir():
            found.append((int(match[1]), path))
    return sorted(found, reverse=True)


def scan(checkpoint_dir: Path, *, run_id: str | None = None, deep: bool = True) -> list[Checkpoint]:
    """Every checkpoint under ``checkpoint_dir``, oldest first (valid or not)."""
    found = [verify(p, run_id=run_id, deep=deep) for _, p in checkpoint_dirs(checkpoint_dir)]
    return sorted(found, key=lambda c: c.step)


def newest_valid_in(
    checkpoint_dir: Path,
    *,
    before_step: int | None = None,
    run_id: str | None = None,
    deep: bool = True,
) -> tuple[Checkpoint | None, list[Checkpoint]]:
    """The newest valid checkpoint (strictly before ``before_step``), checking newest first
    and stopping at the first valid one; and the invalid ones met on the way."""
    skipped = []
    for step, path in checkpoint_dirs(checkpoint_dir):
        if before_step is not None and step >= before_step:
            continue
        found = verify(path, run_id=run_id, deep=deep)
        if found.valid:
            return found, skipped
        skipped.append(found)
    return None, skipped


def newest_valid(
    checkpoints: Sequence[Checkpoint], *, before_step: int | None = None
) -> Checkpoint:
    """The newest valid checkpoint, optionally strictly before ``before_step``."""
    candidates = [
        c for c in checkpoints if c.valid and (before_step is None or c.step < before_step)
    ]
    if not candidates:
        where = f" before step {before_step}" if before_step is not None else ""
        skipped = ", ".join(f"{c.step} ({c.problem})" for c in checkpoints if not c.valid)
        raise CheckpointError(
            f"no valid checkpoint{where}" + (f"; skipped invalid: {skipped}" if skipped else "")
        )
    return max(candidates, key=lambda c: c.step)


def skip_range(target: Checkpoint, spike_batch: int) -> tuple[int, int]:
    """The data batches a resumption from ``target`` skips: the first batch after it through
    the spike's batch, so the batches that drove the model off course are not replayed."""
    first = (target.batch if target.batch is not None else target.step) + 1
    return first, max(first, spike_batch)
