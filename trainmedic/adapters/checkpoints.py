"""Checkpoints: validate them and choose the one to restart from.

Layout (Megatron-style): ``<dir>/iter_0000150/`` holding shard files and a ``manifest.json``
written last, with the sha256 of every shard, the step and the last data batch consumed. A
checkpoint without a manifest (the job died while saving) or with a shard whose checksum
does not match (truncated, corrupted) is invalid and never chosen.
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


def verify(path: Path) -> Checkpoint:
    """Check one checkpoint directory against its manifest."""
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
    for name, expected in sorted(manifest.get("files", {}).items()):
        shard = path / name
        if not shard.is_file():
            return Checkpoint(step=step, path=str(path), valid=False, problem=f"{name} missing")
        if sha256_file(shard) != expected:
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


def scan(checkpoint_dir: Path) -> list[Checkpoint]:
    """Every checkpoint under ``checkpoint_dir``, oldest first (valid or not)."""
    if not checkpoint_dir.is_dir():
        return []
    found = [verify(p) for p in checkpoint_dir.iterdir() if p.is_dir() and _DIR_RE.match(p.name)]
    return sorted(found, key=lambda c: c.step)


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


def rollback_plan(
    checkpoints: Sequence[Checkpoint], *, spike_step: int, spike_batch: int
) -> tuple[Checkpoint, tuple[int, int]]:
    """Where to resume after a loss spike that began at ``spike_step``.

    The newest valid checkpoint strictly before the spike, and the inclusive range of data
    batches to skip: from the first batch after that checkpoint through the spike's batch, so
    the batches that drove the model off course are not replayed.
    """
    target = newest_valid(checkpoints, before_step=spike_step)
    first = (target.batch if target.batch is not None else target.step) + 1
    return target, (first, max(first, spike_batch))
