"""Every subcommand, with the Prefect server down or given bad input, ends in one line on
stderr naming what and why and a documented exit code: never a traceback. Unknown jobs and
nodes are refused before any run is created."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from support.http import serving
from support.ports import free_port
from support.waits import wait_until

from trainmedic.cli.common import EXIT_BROKEN_PIPE, EXIT_INPUT, EXIT_SERVER


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
    ("save-and-stop", "{job}"),
    ("cancel", "brave-otter"),
    ("incidents",),
    ("report",),
    ("report", "--since", "24h", "--json"),
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
    (("runs", "--state", "Exploded"), "state='Exploded'"),
    (("runs", "--limit", "abc"), "--limit"),  # argparse's refusal: one line too
    (("runs", "--limit", "abc"), "'abc'"),
    (("triage",), "job_id"),
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


def test_a_prefect_state_in_any_case_is_accepted(down) -> None:  # type: ignore[no-untyped-def]
    """Checked against Prefect's state names before the server is asked (here: down)."""
    env, _ = down
    for state in ("completed", "FAILED", "late", "awaitingretry"):
        proc = cli(env, "runs", "--state", state)
        assert proc.returncode == EXIT_SERVER, one_line(proc)


# `| head -1`: the reader leaves before the command writes. Without PYTHONUNBUFFERED (a shell
# pipe) stdout is buffered, so the write happens at the last flush.
CLOSED_PIPE = [
    ("sim", "status"),
    ("sim", "status", "--json"),
    ("runs", "--help"),
    ("--help",),
    ("runs",),  # server down: its one line goes to stderr, which is still open
]


@pytest.mark.parametrize("argv", CLOSED_PIPE, ids=" ".join)
def test_output_closed_early_exits_quietly(down, argv: tuple[str, ...]) -> None:
    env, _ = down
    env = {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}
    trainmedic = Path(sys.executable).parent / "trainmedic"
    proc = subprocess.Popen(
        [str(trainmedic), *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    stderr = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert "Exception ignored" not in stderr and "Traceback" not in stderr, stderr
    if argv == ("runs",):
        assert code == EXIT_SERVER, stderr
        assert len(stderr.strip().splitlines()) == 1
    else:
        assert (code, stderr) == (EXIT_BROKEN_PIPE, "")


class Refusing(BaseHTTPRequestHandler):
    """A Prefect API with basic auth on, asked with no or wrong credentials: 401 to everything
    but the health check (Prefect leaves GET /health open, for probes)."""

    def _refuse(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if (
            self.health_open
            and self.command == "GET"
            and self.path.rstrip("/").endswith("/api/health")
        ):
            body = b"true"
            self.send_response(200)
        else:
            body = b'{"exception_message": "Unauthorized"}'
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="prefect"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _refuse

    health_open = True


class RefusingAll(Refusing):
    """A proxy in front of the API that guards the health check too."""

    health_open = False

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def refusing(handler: type[Refusing] = Refusing) -> Iterator[str]:
    """A server on 127.0.0.1 that refuses our credentials; yields its API URL."""
    with serving(handler) as base:
        yield f"{base}/api"


AUTH_REFUSED = [
    ("breaker",),
    ("runs",),
    ("incidents",),
    ("corrections",),
    ("status",),
    ("emit", "loss_spike", "--job", "{job}", "--step", "5"),
]


@pytest.fixture(scope="module")
def refused(down) -> Iterator[tuple[dict[str, str], str, str]]:  # type: ignore[no-untyped-def]
    env, job = down
    with refusing() as url:
        yield {**env, "PREFECT_API_URL": url, "PREFECT_API_AUTH_STRING": "on-call:wrong"}, job, url


def assert_refused(proc: subprocess.CompletedProcess[str], url: str) -> None:
    line = one_line(proc)
    assert proc.returncode == EXIT_SERVER, (proc.returncode, line)
    port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    assert line == (
        f"trainmedic: the Prefect API at 127.0.0.1:{port} refused our credentials (HTTP 401): "
        "check TRAINMEDIC_SERVER_AUTH"
    )


@pytest.mark.parametrize("argv", AUTH_REFUSED, ids=" ".join)
def test_refused_credentials_are_named_in_one_line(refused, argv: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    env, job, url = refused
    assert_refused(cli(env, *(a.format(job=job) for a in argv)), url)


def test_refused_health_check_is_refused_credentials_too(down) -> None:  # type: ignore[no-untyped-def]
    env, _ = down
    with refusing(RefusingAll) as url:
        assert_refused(cli({**env, "PREFECT_API_URL": url}, "breaker"), url)
