"""The Slurm PrologSlurmctld script: unfit nodes fail the prolog (Slurm requeues the job);
a slow or absent trainmedic never stops a job from starting."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm" / "prolog_slurmctld.sh"


def prolog(tmp_path: Path, body: str, **env: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "trainmedic"
    fake.write_text(f'#!/usr/bin/env bash\necho "$@" > {tmp_path}/argv\n{body}\n')
    fake.chmod(0o755)
    return subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "TRAINMEDIC_BIN": str(fake), "SLURM_JOB_ID": "77", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    ("body", "rc", "said"),
    [
        ("exit 0", 0, ""),
        ("exit 4", 1, "unfit nodes"),
        ("exit 3", 0, "check failed (exit 3); starting"),
        ("sleep 20", 0, "over its 1 s budget; starting"),
    ],
)
def test_the_prolog_fails_only_for_unfit_nodes(tmp_path: Path, body: str, rc: int, said: str):
    done = prolog(
        tmp_path, body, SLURM_JOB_NODELIST="node[001-004]", TRAINMEDIC_PREFLIGHT_BUDGET_S="1"
    )
    assert done.returncode == rc, done.stderr
    assert said in done.stderr
    if body == "exit 0":
        assert (tmp_path / "argv").read_text().split() == ["preflight", "--drain", "node[001-004]"]


def test_no_nodelist_checks_nothing(tmp_path: Path) -> None:
    done = prolog(tmp_path, "exit 4")
    assert done.returncode == 0 and not (tmp_path / "argv").exists()
