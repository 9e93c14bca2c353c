"""Every subcommand, with the Prefect server down or given bad input, ends in one line on
stderr naming what and why and a documented exit code: never a traceback. Unknown jobs and
nodes are refused before any run is created."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.ports import free_port
from support.waits import wait_until

from trainmedic.cli.common import EXIT_INPUT, EXIT_SERVER


@pytest.fixture(scope="module")
def down(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], str]:
    """A simulated cluster with one finished job, and a Prefect API URL nobody answers."""
    root = tmp_path_factory.mktemp("down")
    env = {
        **os.environ,
        "TRAINMEDIC_HOME": str(root / "home"),
        "TRAINMEDIC_INVENTORY": str(root / "inventory"),
        "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api",
        "PREFECT_HOME": str(root / "prefect"),
    }
    env.pop("PREFECT_API_AUTH_STRING", None)
    from trainmedic.adapters.scheduler.sim import SimScheduler
    from trainmedic.core.models import JobSpec
    from trainmedic.sim.cluster import SimCluster

    sim_home = root / "home" / "sim"
    SimCluster(sim_home).create(4, inventory_dir=root / "inventory")
    scheduler = SimScheduler(sim_home)
    job = scheduler.submit(JobSpec(name="done", nodes=1, steps=3, checkpoint_every=1))
    wait_until(lambda: scheduler.job(job.job_id).state.finished, 60, "the job ends")
    return env, job.job_id


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    trainmedic = Path(sys.executable).parent / "trainmedic"
    return subprocess.run(
        [str(trainmedic), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("trainmedic: "), proc.stderr
    return lines[0]


SERVER_DOWN = [
    ("triage", "{job}"),
    ("restart", "{job}"),
    ("restore", "node001"),
    ("repair", "node001"),
    ("approve", "brave-otter"),
    ("approve", "brave-otter", "--reject"),
    ("breaker",),
    ("breaker", "--reset"),
    ("notify", "--block", "oncall"),
    ("runs",),
    ("runs", "--limit", "200"),
    ("emit", "loss_spike", "--job", "{job}", "--step", "5"),
    ("locate", "node[001-002]"),
    ("locate", "--isolate", "node[001-002]"),
    ("preflight", "node[001-002]"),
    ("preflight", "--drain", "node[001-002]"),
    ("correct", "{job}", "--category", "StorageError"),
    ("corrections",),
]


@pytest.mark.parametrize("argv", SERVER_DOWN, ids=" ".join)
def test_server_down_is_one_line_and_exit_3(down, argv: tuple[str, ...]) -> None:
    env, job = down
    proc = cli(env, *(a.format(job=job) for a in argv))
    line = one_line(proc)
    assert proc.returncode == EXIT_SERVER, (proc.returncode, line)
    assert "Prefect API" in line or "/api" in line  # names what it could not reach


BAD_INPUT = [
    (("triage", "99999"), "99999"),  # well-formed, unknown: no run is created
    (("restart", "99999"), "99999"),
    (("triage", "12;rm"), "job_id"),
    (("restore", "node999"), "node999"),
    (("repair", "node999"), "node999"),
    (("repair", "node001", "--approval-timeout", "3"), "approval_timeout_s"),
    (("runs", "--limit", "0"), "limit"),
    (("runs", "--limit", "-1"), "limit"),
    (("runs", "--limit", "5000"), "limit"),
    (("runs", "--since", "yesterday"), "since"),
    (("locate", "node[1-"), "nodes"),
    (("preflight", "node999"), "node999"),
    (("correct", "{job}", "--category", "Gremlins"), "category"),
    (("correct", "{job}", "--category", "ECCError", "--host", "bad;host"), "host"),
]


@pytest.mark.parametrize(
    ("argv", "named"), BAD_INPUT, ids=lambda v: " ".join(v) if isinstance(v, tuple) else v
)
def test_bad_input_is_one_line_naming_it_and_exit_2(down, argv, named: str) -> None:  # type: ignore[no-untyped-def]
    env, job = down
    proc = cli(env, *(a.format(job=job) for a in argv))
    line = one_line(proc)
    assert proc.returncode == EXIT_INPUT, (proc.returncode, line)
    assert named in line


def test_status_with_the_server_down_says_so(down) -> None:  # type: ignore[no-untyped-def]
    env, _ = down
    proc = cli(env, "status")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
