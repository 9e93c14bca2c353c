"""Scheduler adapters: the simulated one (default) and Slurm (production)."""

from __future__ import annotations

from trainmedic.adapters.scheduler.base import Scheduler
from trainmedic.core.errors import ConfigError
from trainmedic.core.settings import Settings, get_settings

__all__ = ["Scheduler", "get_scheduler"]


def get_scheduler(settings: Settings | None = None) -> Scheduler:
    settings = settings or get_settings()
    if settings.scheduler == "sim":
        from trainmedic.adapters.scheduler.sim import SimScheduler

        return SimScheduler(settings.sim_home)
    if settings.scheduler == "slurm":
        from trainmedic.adapters.scheduler.slurm import SlurmScheduler

        return SlurmScheduler.from_settings(settings)
    raise ConfigError(f"scheduler={settings.scheduler!r}: unknown scheduler")
