"""Shared fixtures: an isolated trainmedic home with a simulated cluster, and one real Prefect
server for the whole session (prefect_test_harness: a real server process on SQLite).

Every test is marked with its tier, the folder it lives in (tests/<tier>/): `pytest -m unit`
runs the pure tier alone. See ARCHITECTURE.md for what each tier needs."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trainmedic.core.settings import Settings, get_settings

os.environ.setdefault("TRAINMEDIC_SIM_STEP_SECONDS", "0.02")
os.environ.setdefault("TRAINMEDIC_SIM_TEST_SECONDS", "0.2")


@pytest.fixture
def tm_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """Settings pointing at a fresh home and inventory under tmp_path."""
    monkeypatch.setenv("TRAINMEDIC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAINMEDIC_INVENTORY", str(tmp_path / "inventory"))
    monkeypatch.delenv("TRAINMEDIC_TELEMETRY_URL", raising=False)
    # The guard's lock and records live on the (session-wide) Prefect server, per cluster:
    # each test is its own cluster there, as each has its own home.
    monkeypatch.setenv("TRAINMEDIC_CLUSTER", f"test-{uuid.uuid4().hex[:12]}")
    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()


POLICY_ENV = {
    "auto_approve_max": "TRAINMEDIC_DRAIN_AUTO_APPROVE_MAX",
    "max_share": "TRAINMEDIC_DRAIN_MAX_SHARE",
    "max_per_window": "TRAINMEDIC_DRAIN_MAX_PER_HOUR",
    "min_drainable": "TRAINMEDIC_DRAIN_MIN_DRAINABLE",
    "breaker_limit": "TRAINMEDIC_BREAKER_LIMIT",
    "crash_loop_after": "TRAINMEDIC_CRASH_LOOP_AFTER",
    "repair_approval": "TRAINMEDIC_REPAIR_APPROVAL",
    "lemon_drains": "TRAINMEDIC_LEMON_DRAINS",
    "burn_in_dcgm_level": "TRAINMEDIC_BURN_IN_DCGM_LEVEL",
}


@pytest.fixture
def policy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Set the isolation policy the way an operator does, in the installation's settings (it
    is never a run's parameter): ``policy(max_share=0.25, max_per_window=4)``."""

    def set_policy(**values: float) -> None:
        for key, value in values.items():
            monkeypatch.setenv(POLICY_ENV[key], str(value))
        get_settings.cache_clear()

    yield set_policy
    get_settings.cache_clear()


@pytest.fixture
def sim(tm_home: Settings) -> Iterator[tuple[Settings, object]]:
    """A 8-node simulated cluster (4 GPUs each) and its scheduler; jobs stopped afterwards."""
    from trainmedic.adapters.scheduler.sim import SimScheduler
    from trainmedic.sim.cluster import SimCluster

    cluster = SimCluster(tm_home.sim_home)
    cluster.create(8, inventory_dir=tm_home.inventory)
    scheduler = SimScheduler(tm_home.sim_home)
    yield cluster, scheduler
    for job in scheduler.jobs():
        if not job.state.finished:
            scheduler.cancel(job.job_id, "test teardown")


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """One real Prefect server (temporary SQLite database) for every flow test."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


TIERS = ("unit", "adapters", "flows", "e2e", "slurm", "ui", "integration")
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = item.path.resolve().relative_to(TESTS).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in a tier folder {TIERS}")
        item.add_marker(getattr(pytest.mark, tier))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Flush what can still be sent, then drop what was queued for test servers that are
    gone, so the process exits instead of retrying them for hours."""
    from support.prefect_queues import discard_undeliverable_prefect_items, drain_prefect_workers

    drain_prefect_workers(timeout=5)
    discard_undeliverable_prefect_items()
