"""The stack's worker: Prefect's process worker on the ``trainmedic`` pool, whose flow runs start
warm (issue 14.3: no process start per remediation).

Prefect's process worker starts each flow run as ``python -m prefect.engine`` (behind a
workspace supervisor), so every remediation pays ``import prefect`` and the runbooks' imports
again; ``prefect.serve`` is no better in 3.9 (``run_flow_in_subprocess`` uses a *spawn*
context) and would take the deployments off the work pool. Here a multiprocessing *forkserver*
imports Prefect and every runbook once, and each flow run is a ``fork()`` of it running what
``prefect.engine``'s ``__main__`` runs. A run is still its own process, so everything the
worker does with one is unchanged: the pool, deployments, triggers and schedules as the UI
shows them, cancellation (the control channel and SIGTERM to the run's pid), pause/resume
(a paused run waits in its own process, others go on) and crash isolation (a run that dies
is reported Crashed by the worker, which keeps polling). If the worker itself dies, its runs
go on in their processes and report their own end (a restarted worker can still cancel them,
by pid); `trainmedic down` (SIGTERM to the group) ends a run in flight as Crashed. Runs killed
with the whole group at once (SIGKILL, a reboot) stay Running or Paused: nothing marks them yet.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import anyio
import anyio.abc
import httpx
from prefect.flows import load_flow_from_flow_run
from prefect.runner._flow_run_executor import FlowRunExecutorContext
from prefect.runner._process_manager import ProcessHandle
from prefect.settings import get_current_settings
from prefect.utilities.processutils import sanitize_subprocess_env
from prefect.workers.process import ProcessWorker, ProcessWorkerResult

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun
    from prefect.runner._control_channel import ControlChannel
    from prefect.workers.process import ProcessJobConfiguration

# Imported once in the forkserver; each flow run forks from it with these already loaded.
PRELOAD = [
    "prefect.engine",
    "prefect.flow_engine",
    "prefect.deployments.steps",
    "flows.incident",
    "flows.isolate",
    "flows.locate",
    "flows.preflight",
    "flows.report",
    "flows.restart",
    "flows.repair",
    "flows.restore",
    "flows.rollback",
    "flows.save_and_stop",
    "flows.slow",
    "flows.tasks",
    "flows.triage",
    "flows.verify",
    "flows.watchdog",
]

# The first line of each warm run's log (the tests read it): its pid and the forkserver's.
WARM_START = "started in pid %d, forked from the warm interpreter (pid %d)"


def warm_context() -> multiprocessing.context.ForkServerContext:
    """The forkserver context the flow runs start from (its server starts on first use)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _report_cold(queue: Any, names: list[str]) -> None:
    import sys

    queue.put([name for name in names if name not in sys.modules])


def cold_modules(ctx: multiprocessing.context.ForkServerContext) -> list[str]:
    """The PRELOAD modules a fresh fork does not have (the forkserver skips one that fails to
    import, silently): each one's imports are paid again by every run."""
    queue = ctx.SimpleQueue()
    probe = ctx.Process(target=_report_cold, args=(queue, PRELOAD), name="warm-probe")
    probe.start()
    cold: list[str] = queue.get()
    probe.join()
    return cold


def run_engine(flow_run_id: str, env: dict[str, str], remove: list[str], cwd: str) -> None:
    """A flow run in a forked child: what ``python -m prefect.engine`` does after its imports."""
    for key in remove:
        os.environ.pop(key, None)
    os.environ.update(env)
    os.chdir(cwd)
    from prefect._internal.control_listener import configure_from_env
    from prefect._internal.metrics import RunMetrics
    from prefect.context import SettingsContext, get_settings_context
    from prefect.engine import _drive_run_flow_result, handle_engine_signals
    from prefect.flow_engine import flow_run_logger, load_flow, load_flow_run, run_flow
    from prefect.settings import Settings

    run_id = UUID(flow_run_id)
    configure_from_env()
    # The forkserver read its settings when it started; this run's come from its environment.
    settings = SettingsContext(profile=get_settings_context().profile, settings=Settings())
    with settings, handle_engine_signals(run_id):
        flow_run = load_flow_run(flow_run_id=run_id)
        run_logger = flow_run_logger(flow_run=flow_run)
        run_logger.info(WARM_START, os.getpid(), os.getppid())
        try:
            flow = load_flow(flow_run)
        except Exception:
            run_logger.error("Unexpected exception when loading the flow", exc_info=True)
            raise
        with RunMetrics(flow_run, flow):
            result = run_flow(flow, flow_run=flow_run, error_logger=run_logger)
            _drive_run_flow_result(flow, result)


# A CA bundle of one self-signed certificate whose key was thrown away: it trusts nothing.
TRUSTS_NOTHING = Path(__file__).with_name("data") / "trusts-nothing.pem"


def plain_http_tls(env: Mapping[str, str | None]) -> dict[str, str]:
    """For an API on plain HTTP, the CA bundle the run's Prefect clients load: one that
    trusts nothing, in place of certifi's 117 certificates. Every Prefect client a run makes
    (about a dozen: its engine, log and event workers, deployment steps, suspension observer)
    builds a TLS context from the bundle even when it never opens a TLS connection, ~30 ms of
    CPU each with certifi's, a third of a short run's CPU (py-spy, bench/burst.py); 0.4 ms
    with this one. Nothing changes where TLS is used: an https API, or a bundle the site set."""
    url = env.get("PREFECT_API_URL") or ""
    if not url.startswith("http://") or env.get("PREFECT_API_SSL_CERT_FILE"):
        return {}
    return {"PREFECT_API_SSL_CERT_FILE": str(TRUSTS_NOTHING)}


class WarmForkStarter:
    """Prefect's ``ProcessStarter`` protocol: a flow run as a fork of the warm forkserver."""

    def __init__(
        self,
        *,
        ctx: multiprocessing.context.ForkServerContext,
        cwd: Path,
        env: dict[str, str | None],
        control_channel: ControlChannel | None,
    ) -> None:
        self._ctx = ctx
        self._cwd = cwd
        self._env = env
        self._control_channel = control_channel

    def run_env(self, flow_run: FlowRun) -> dict[str, str | None]:
        """The run's environment, built as EngineCommandStarter builds it for the engine."""
        env: dict[str, str | None] = {**os.environ, **self._env}
        env.update(get_current_settings().to_environment_variables(exclude_unset=True))
        env["PREFECT__FLOW_RUN_ID"] = str(flow_run.id)
        env.update(plain_http_tls(env))
        env["PREFECT__ENABLE_CANCELLATION_AND_CRASHED_HOOKS"] = "false"
        if self._control_channel is not None:
            try:
                port, token = self._control_channel.register(flow_run.id)
            except RuntimeError:
                pass  # no loopback listener: cancellation falls back to the kill
            else:
                env["PREFECT__CONTROL_PORT"] = str(port)
                env["PREFECT__CONTROL_TOKEN"] = token
        return env

    async def start(
        self,
        flow_run: FlowRun,
        task_status: anyio.abc.TaskStatus[ProcessHandle] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        env = self.run_env(flow_run)
        clean = {k: v for k, v in sanitize_subprocess_env(env).items() if v is not None}
        remove = [k for k in os.environ if k not in clean]
        process = self._ctx.Process(
            target=run_engine,
            args=(str(flow_run.id), clean, remove, str(self._cwd)),
            name=f"flow-run-{flow_run.id}",
        )
        try:
            await anyio.to_thread.run_sync(process.start)
        except BaseException:
            if self._control_channel is not None and "PREFECT__CONTROL_PORT" in env:
                self._control_channel.unregister(flow_run.id)
            raise
        task_status.started(ProcessHandle(process))
        await anyio.to_thread.run_sync(process.join)


class WarmProcessWorker(ProcessWorker):
    """The ``process`` worker type (the pool is unchanged), its runs forked warm."""

    type = "process"

    @classmethod
    def __dispatch_key__(cls) -> str:
        # Registered under a key of its own: importing this module leaves Prefect's
        # "process" worker class what `prefect worker start --type process` gets.
        return "trainmedic-warm-process"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._warm = warm_context()
        self._labelling: set[asyncio.Task[None]] = set()

    async def _give_worker_labels_to_flow_run(self, flow_run_id: UUID) -> None:
        """Which worker ran it is a label for the UI, not part of running it, so it is set in
        the background. Prefect's worker awaits it before it submits the run: under a storm
        SQLite refuses it with 503 (103 of 150 runs of bench/burst.py) and the client's back-off
        (2 s, 4 s, ...) delayed each of those remediations; a label refused after every retry
        crashed the run before it started (one of 150, measured). The run goes ahead either
        way; a label never set is a warning in the worker's log."""
        labelling = asyncio.create_task(self._label(flow_run_id))
        self._labelling.add(labelling)  # a reference until done: asyncio keeps only weak ones
        labelling.add_done_callback(self._labelling.discard)

    async def _label(self, flow_run_id: UUID) -> None:
        try:
            await super()._give_worker_labels_to_flow_run(flow_run_id)
        except httpx.HTTPError as exc:  # PrefectHTTPStatusError (a 503) is one
            self._logger.warning(
                "flow run %s: worker labels not set (%s); the run goes ahead",
                flow_run_id,
                str(exc).splitlines()[0][:200],
            )

    async def run(
        self,
        flow_run: FlowRun,
        configuration: ProcessJobConfiguration,
        task_status: anyio.abc.TaskStatus[int] | None = None,
    ) -> ProcessWorkerResult:
        if configuration._command_configured:
            # A deployment that names its own command gets it, as Prefect's worker runs it.
            return await super().run(flow_run, configuration, task_status)
        status = task_status if task_status is not None else anyio.TASK_STATUS_IGNORED
        cwd = Path(configuration.working_dir or os.getcwd()).resolve()
        async with FlowRunExecutorContext() as ctx:
            starter = WarmForkStarter(
                ctx=self._warm, cwd=cwd, env=configuration.env, control_channel=ctx.control_channel
            )
            executor = ctx.create_executor(
                flow_run, starter, resolve_flow=load_flow_from_flow_run, propose_submitting=False
            )
            execution = None

            async def execute(
                *, task_status: anyio.abc.TaskStatus[ProcessHandle] = anyio.TASK_STATUS_IGNORED
            ) -> None:
                nonlocal execution
                execution = await executor.submit(task_status=task_status)

            async with anyio.create_task_group() as group:
                handle = await group.start(execute)
                if handle.pid is None:
                    raise RuntimeError("Flow run process has no PID")
                status.started(handle.pid)
        if execution is None or execution.status_code is None:
            raise RuntimeError("Failed to start flow run process.")
        return ProcessWorkerResult(
            status_code=execution.status_code, identifier=str(execution.handle.pid)
        )


def main() -> None:
    """``python -m trainmedic.adapters.warm_worker POOL NAME``: the stack's worker service."""
    import sys

    pool, name = sys.argv[1], sys.argv[2]
    import logging

    # The forkserver's imports are paid now, with the worker, not by the first run.
    cold = cold_modules(warm_context())
    if cold:
        logging.getLogger("trainmedic.warm_worker").warning(
            "not preloaded, each run imports them again: %s", ", ".join(cold)
        )

    async def serve() -> None:
        async with WarmProcessWorker(work_pool_name=pool, name=name) as worker:
            await worker.start()

    anyio.run(serve)


if __name__ == "__main__":
    main()
