"""The embedded stack for a test module or a benchmark, in a temporary home: a real Prefect
server (SQLite, or a fresh PostgreSQL database), optionally the deployments and a process
worker, and a simulated cluster. Everything it changes in the environment is put back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from support.ports import free_port
from support.prefect_queues import drain_prefect_workers
from trainmedic.adapters.scheduler.sim import SimScheduler
from trainmedic.core.settings import Settings, get_settings
from trainmedic.sim.cluster import SimCluster
from trainmedic.stack import Stack

# `scripts/postgres.sh up` prints it; scripts/test.sh exports it when it could start PostgreSQL.
DATABASE_URL_ENV = "TRAINMEDIC_TEST_DATABASE_URL"
# Never inherited from outside: each stack decides its own API, UI, database and telemetry.
CLEARED = (
    "PREFECT_API_URL",
    "PREFECT_UI_URL",
    "TRAINMEDIC_DATABASE_URL",
    "TRAINMEDIC_TELEMETRY_URL",
)


def _pg(dsn: str, sql: str) -> None:
    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


@contextlib.contextmanager
def fresh_database(url: str, prefix: str = "prefect_test") -> Iterator[str]:
    """A new database on the PostgreSQL server of ``url``, dropped afterwards: a shared one
    would carry deployments, automations and concurrency slots over from earlier runs, whose
    simulated job ids repeat."""
    from sqlalchemy.engine import make_url

    base = make_url(url)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    dsn = base.set(drivername="postgresql").render_as_string(hide_password=False)
    _pg(dsn, f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        _pg(dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def patched_environ(overrides: Mapping[str, str], cleared: tuple[str, ...] = ()) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in [*overrides, *cleared]}
    for key in cleared:
        os.environ.pop(key, None)
    os.environ.update(overrides)
    get_settings.cache_clear()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        get_settings.cache_clear()


@contextlib.contextmanager
def embedded_stack(
    root: Path,
    *,
    worker: bool,
    nodes: int = 8,
    gpus_per_node: int = 4,
    database_url: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[tuple[Settings, Stack]]:
    """A stack under ``root``. ``worker=True``: server + deployments + worker + exporter (what
    `trainmedic up` starts; event triggers run the runbooks). ``worker=False``: the server
    alone, for runbooks called in the test's own process."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    overrides = {
        "TRAINMEDIC_HOME": str(root / "home"),
        "TRAINMEDIC_INVENTORY": str(root / "inventory"),
        "TRAINMEDIC_SERVER_PORT": str(free_port()),
        "TRAINMEDIC_SIM_EXPORTER_PORT": str(free_port()),
        **(env or {}),
    }
    if database_url:
        overrides["TRAINMEDIC_DATABASE_URL"] = database_url
    with patched_environ(overrides, CLEARED):
        settings = get_settings()
        SimCluster(settings.sim_home).create(
            nodes, gpus_per_node=gpus_per_node, inventory_dir=settings.inventory
        )
        stack = Stack(settings)
        try:
            if worker:
                stack.up(with_intake=False)  # each scenario sends its own events
            else:
                stack.start_server()
            with temporary_settings({PREFECT_API_URL: stack.api_url}):
                yield settings, stack
        finally:
            scheduler = SimScheduler(settings.sim_home)
            for job in scheduler.jobs():
                if not job.state.finished:
                    scheduler.cancel(job.job_id, "test teardown")
            drain_prefect_workers()
            stack.down()


@contextlib.contextmanager
def server_only(settings: Settings, *, client: bool = True) -> Iterator[Stack]:
    """A Prefect server of the test's own for ``settings`` (it may stop and restart it),
    never another server named by the environment. ``client``: this thread's Prefect client
    talks to it while the block runs."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    stack = Stack(settings)
    stack.env["PREFECT_API_URL"] = settings.api_url
    try:
        stack.start_server()
        if client:
            with temporary_settings({PREFECT_API_URL: stack.api_url}):
                yield stack
        else:
            yield stack
    finally:
        drain_prefect_workers()
        stack.down()
