"""The embedded stack: a local Prefect server (SQLite under ``home`` unless a database URL is
set), a process worker for the deployments in prefect.yaml (its runs forked from a warm
interpreter: adapters/warm_worker.py), the intake (`trainmedic watch`:
the scheduler's failures as events, the triggers' input) and, on the simulated cluster, its
DCGM exporter. Each runs detached with a pid file and a log file under ``<home>/run``, so
``trainmedic up`` / ``down`` can be called again safely."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from trainmedic.core.errors import ServerError
from trainmedic.core.settings import REPO_ROOT, Settings

WORK_POOL = "trainmedic"
WORKER_NAME = "trainmedic-local"


def prefect_env(settings: Settings) -> dict[str, str]:
    """Environment for every Prefect client and child process of the embedded stack.

    A PREFECT_API_URL already in the environment wins: that is how production points the
    runbooks at a remote server.
    """
    env = {
        "PREFECT_HOME": str(settings.prefect_home),
        "PREFECT_API_URL": os.environ.get("PREFECT_API_URL", settings.api_url),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_API_HOST": settings.server_host,
        "PREFECT_SERVER_API_PORT": str(settings.server_port),
        # A remediation is seconds of work: the worker asks for new runs every second (one
        # cheap query), so a run waits half a second on average, not a whole poll period.
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        # The server writes every task-run state as its own transaction (batch size 1) and
        # events 20 at a time; under a storm on SQLite those writes queue on its one lock in
        # front of the runs being created. Batched, a state reaches the UI within a second.
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "50",
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
        "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "200",
        "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "2",
        "PREFECT_UI_URL": os.environ.get("PREFECT_UI_URL", settings.api_url.removesuffix("/api")),
        "TRAINMEDIC_ROOT": str(REPO_ROOT),
        "TRAINMEDIC_HOME": str(settings.home),
    }
    if settings.database_url:
        env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = settings.database_url
    if settings.server_auth is not None:
        # The server demands it, every client (worker, flow runs, CLI, intake) sends it.
        auth = settings.server_auth.get_secret_value()
        env["PREFECT_SERVER_API_AUTH_STRING"] = auth
        env["PREFECT_API_AUTH_STRING"] = auth
    return env


def apply_prefect_env(settings: Settings) -> None:
    """Point this process's Prefect client at the stack (call before importing prefect)."""
    for key, value in prefect_env(settings).items():
        os.environ.setdefault(key, value)


@dataclass
class Service:
    name: str
    argv: list[str]
    run_dir: Path

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid

    def start(self, env: dict[str, str]) -> bool:
        """Start unless already running; returns True if it started now."""
        if self.pid() is not None:
            return False
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            child = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env},
                cwd=REPO_ROOT,
                start_new_session=True,
            )
        self.pid_file.write_text(f"{child.pid}\n")
        return True

    def stop(self, timeout_s: float = 20.0) -> bool:
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return True

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with contextlib.suppress(OSError):
            os.waitpid(pid, os.WNOHANG)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ChildProcessError):
        return False
    return state != "Z"


class Stack:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.env = prefect_env(settings)
        if settings.scheduler == "sim" and settings.telemetry_url is None:
            # The runbooks read the simulated cluster's exporter unless told otherwise.
            self.env["TRAINMEDIC_TELEMETRY_URL"] = (
                f"http://127.0.0.1:{settings.sim_exporter_port}/metrics"
            )
        run_dir = settings.home / "run"
        prefect = str(Path(sys.executable).parent / "prefect")
        self.server = Service(
            "server",
            [
                prefect,
                "server",
                "start",
                "--host",
                settings.server_host,
                "--port",
                str(settings.server_port),
                "--analytics-off",
            ],
            run_dir,
        )
        process_worker = ["--pool", WORK_POOL, "--type", "process", "--name", WORKER_NAME]
        worker_argv = (
            [sys.executable, "-m", "trainmedic.adapters.warm_worker", WORK_POOL, WORKER_NAME]
            if settings.warm_worker
            else [prefect, "worker", "start", *process_worker]
        )
        self.worker = Service("worker", worker_argv, run_dir)
        self.intake = Service(
            "intake",
            [
                sys.executable,
                "-m",
                "trainmedic.cli.main",
                "watch",
                "--interval",
                str(settings.intake_interval_s),
            ],
            run_dir,
        )
        self.exporter = Service(
            "exporter",
            [
                sys.executable,
                "-m",
                "trainmedic.sim.exporter",
                "--sim-home",
                str(settings.sim_home),
                "--port",
                str(settings.sim_exporter_port),
            ],
            run_dir,
        )

    @property
    def api_url(self) -> str:
        return self.env["PREFECT_API_URL"]

    @property
    def ui_url(self) -> str:
        return self.env["PREFECT_UI_URL"]

    def healthy(self) -> bool:
        auth = self.env.get("PREFECT_API_AUTH_STRING")
        credentials = tuple(auth.split(":", 1)) if auth and ":" in auth else None
        try:
            response = httpx.get(f"{self.api_url}/health", timeout=2, auth=credentials)
            return response.status_code == 200
        except httpx.HTTPError:
            return False

    def start_server(self, timeout_s: float = 120.0) -> None:
        if self.healthy():
            return
        self.settings.prefect_home.mkdir(parents=True, exist_ok=True)
        self.server.start(self.env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.healthy():
                return
            if self.server.pid() is None:
                raise ServerError(f"Prefect server exited:\n{self.server.log_tail()}")
            time.sleep(0.5)
        raise ServerError(
            f"Prefect server not healthy at {self.api_url} after {timeout_s:.0f} s:\n"
            f"{self.server.log_tail()}"
        )

    def deploy(self) -> None:
        """Create the work pool and apply every deployment in prefect.yaml."""
        prefect = str(Path(sys.executable).parent / "prefect")
        env = {**os.environ, **self.env}
        steps = [
            [
                prefect,
                "--no-prompt",
                "work-pool",
                "create",
                WORK_POOL,
                "--type",
                "process",
                "--overwrite",
            ],
            [prefect, "--no-prompt", "deploy", "--all"],
        ]
        for argv in steps:
            done = subprocess.run(
                argv,
                cwd=REPO_ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if done.returncode != 0:
                raise ServerError(
                    f"{' '.join(argv[1:])} failed (rc={done.returncode}):\n"
                    f"{(done.stdout + done.stderr)[-3000:]}"
                )

    def up(self, *, with_exporter: bool = True, with_intake: bool = True) -> None:
        """Start what is not running. ``with_intake=False`` for a caller that sends the
        events itself (the tests drive each scenario's events)."""
        self.start_server()
        self.deploy()
        self.worker.start(self.env)
        if with_exporter and self.settings.scheduler == "sim":
            self.exporter.start(self.env)
        if with_intake:
            self.intake.start(self.env)

    @property
    def services(self) -> tuple[Service, ...]:
        return (self.server, self.worker, self.intake, self.exporter)

    def down(self) -> list[str]:
        stopped = []
        # The intake first: nothing is reported to a server that is going away.
        for service in (self.intake, self.worker, self.exporter, self.server):
            if service.stop():
                stopped.append(service.name)
        return stopped

    def status(self) -> dict[str, object]:
        return {
            "api_url": self.api_url,
            "healthy": self.healthy(),
            **{s.name: s.pid() for s in self.services},
            "worker_kind": "warm" if self.settings.warm_worker else "process",
        }
