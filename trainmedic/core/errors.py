"""The one error hierarchy of trainmedic.

    TrainmedicError                 every error this project raises on purpose
    ├── InputError                  bad input from a user, an event, a file (names field and value)
    ├── ConfigError                 settings or inventory that cannot work
    ├── SchedulerError              sbatch/scontrol/sacct or the simulated scheduler refused
    │   └── JobNotFound
    ├── PlaybookError               ansible-runner could not run a playbook, or it failed
    │   └── PlaybookTimeout         cut off at its overall timeout (nothing known of the hosts)
    ├── TelemetryError              the metrics endpoint could not be read or parsed
    ├── CheckpointError             no valid checkpoint to restart from
    ├── PolicyRefused               the safety policy refused a destructive action
    └── ServerError                 the local Prefect server would not start or answer

Foreign errors (httpx, ansible-runner, subprocess, OSError) are mapped at the edge with
``raise ... from exc`` so the CLI can print one clear line and exit 2 instead of a traceback.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "ConfigError",
    "InputError",
    "JobNotFound",
    "PlaybookError",
    "PlaybookTimeout",
    "PolicyRefused",
    "SchedulerError",
    "ServerError",
    "TelemetryError",
    "TrainmedicError",
]


class TrainmedicError(Exception):
    """Base class: every deliberate trainmedic failure."""


class InputError(TrainmedicError, ValueError):
    """Bad input; the message always names the field and the offending value."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={value!r}: {reason}")


class ConfigError(TrainmedicError):
    """Settings, inventory or environment that cannot work."""


class SchedulerError(TrainmedicError):
    """A scheduler call failed."""


class JobNotFound(SchedulerError):
    """The scheduler does not know this job id."""


class PlaybookError(TrainmedicError):
    """A playbook could not be run, or failed on hosts where failure is not tolerated."""


class PlaybookTimeout(PlaybookError):
    """ansible-runner stopped a playbook at its overall timeout: what it did on each host is
    unknown (an overloaded controller looks exactly like this)."""


class TelemetryError(TrainmedicError):
    """The telemetry endpoint could not be reached or returned something unparseable."""


class CheckpointError(TrainmedicError):
    """No complete, valid checkpoint satisfies the request."""


class PolicyRefused(TrainmedicError):
    """A destructive action was refused by the safety policy (circuit breaker open)."""


class ServerError(TrainmedicError):
    """The embedded Prefect server would not start, stop or answer."""
