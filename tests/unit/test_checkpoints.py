import json
from pathlib import Path

import pytest

from trainmedic.adapters import checkpoints
from trainmedic.core.errors import CheckpointError


def make_checkpoint(
    root: Path,
    step: int,
    *,
    batch: int | None = None,
    manifest: bool = True,
    loss: float = 2.0,
    run: str | None = None,
) -> Path:
    path = root / checkpoints.checkpoint_dirname(step)
    path.mkdir(parents=True)
    (path / "model.pt").write_bytes(b"weights-%d" % step * 100)
    if manifest:
        (path / checkpoints.MANIFEST).write_text(
            json.dumps(
                {
                    "step": step,
                    "batch": step if batch is None else batch,
                    "loss": loss,
                    "files": {"model.pt": checkpoints.sha256_file(path / "model.pt")},
                    "sizes": {"model.pt": (path / "model.pt").stat().st_size},
                    **({"run": run} if run else {}),
                }
            )
        )
    return path


def test_newest_valid_skips_partial_and_truncated(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 100)
    make_checkpoint(tmp_path, 150)
    truncated = make_checkpoint(tmp_path, 200)
    (truncated / "model.pt").write_bytes(b"weig")
    make_checkpoint(tmp_path, 250, manifest=False)
    found = checkpoints.scan(tmp_path)
    assert [c.step for c in found] == [100, 150, 200, 250]
    assert [c.valid for c in found] == [True, True, False, False]
    assert "truncated" in found[2].problem  # its size differs from the manifest's
    assert "no manifest" in found[3].problem
    assert checkpoints.newest_valid(found).step == 150


def test_newest_valid_before_step(tmp_path: Path) -> None:
    for step in (50, 100, 150):
        make_checkpoint(tmp_path, step)
    found = checkpoints.scan(tmp_path)
    assert checkpoints.newest_valid(found, before_step=150).step == 100
    assert checkpoints.newest_valid(found, before_step=151).step == 150


def test_no_valid_checkpoint_says_what_was_skipped(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 50, manifest=False)
    with pytest.raises(CheckpointError, match=r"50 \(no manifest"):
        checkpoints.newest_valid(checkpoints.scan(tmp_path))
    with pytest.raises(CheckpointError):
        checkpoints.newest_valid([])


def test_manifest_step_mismatch_is_invalid(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path, 100)
    data = json.loads((path / checkpoints.MANIFEST).read_text())
    data["step"] = 90
    (path / checkpoints.MANIFEST).write_text(json.dumps(data))
    assert not checkpoints.verify(path).valid


def test_rollback_plan_skips_batches_through_the_spike(tmp_path: Path) -> None:
    # An earlier skip moved the data stream: checkpoint 200 had consumed batch 230.
    for step, batch in ((100, 100), (200, 230), (300, 330)):
        make_checkpoint(tmp_path, step, batch=batch)
    found = checkpoints.scan(tmp_path)
    target = checkpoints.newest_valid(found, before_step=270)
    skip = checkpoints.skip_range(target, spike_batch=300)
    assert target.step == 200
    assert skip == (231, 300)


def test_newest_first_stops_at_the_first_valid_and_hashes_each_shard_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in (100, 150, 200):
        make_checkpoint(tmp_path, step)
    corrupt = make_checkpoint(tmp_path, 250)
    (corrupt / "model.pt").write_bytes(b"x" * (corrupt / "model.pt").stat().st_size)
    hashed: list[str] = []
    real = checkpoints.sha256_file
    monkeypatch.setattr(
        checkpoints, "sha256_file", lambda p: hashed.append(p.parent.name) or real(p)
    )
    chosen, skipped = checkpoints.newest_valid_in(tmp_path)
    assert chosen is not None and chosen.step == 200
    assert [c.step for c in skipped] == [250] and "checksum" in (skipped[0].problem or "")
    assert hashed == ["iter_0000250", "iter_0000200"]  # 150 and 100 never read
    checkpoints.newest_valid_in(tmp_path)
    assert hashed == ["iter_0000250", "iter_0000200"]  # cached by (path, size, mtime)


def test_another_training_runs_checkpoint_is_never_chosen(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 100, run="gpt-A")
    make_checkpoint(tmp_path, 800, run="gpt-OLD")  # a stale directory of the same name
    chosen, skipped = checkpoints.newest_valid_in(tmp_path, run_id="gpt-A")
    assert chosen is not None and chosen.step == 100
    assert skipped[0].step == 800 and "another training run" in (skipped[0].problem or "")


def test_polling_checks_sizes_without_hashing(tmp_path: Path, monkeypatch) -> None:
    truncated = make_checkpoint(tmp_path, 100)
    (truncated / "model.pt").write_bytes(b"short")
    monkeypatch.setattr(checkpoints, "sha256_file", lambda p: pytest.fail("hashed while polling"))
    chosen, skipped = checkpoints.newest_valid_in(tmp_path, deep=False)
    assert chosen is None and skipped[0].problem == "model.pt truncated"
