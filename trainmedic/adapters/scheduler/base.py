"""The scheduler interface every runbook talks to.

Implementations must make drain/resume idempotent: draining a drained node with the same
reason is a no-op that returns False (nothing changed), so a replayed runbook is harmless.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from datetime import UTC, datetime

from trainmedic.core.models import JobInfo, JobSpec, NodeInfo, NodePlace


def with_run_id(spec: JobSpec) -> JobSpec:
    """A first submission starts a training run: it gets the run's identity (resubmissions
    keep theirs)."""
    if spec.run_id is not None:
        return spec
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return spec.model_copy(update={"run_id": f"{spec.name}-{stamp}-{secrets.token_hex(3)}"})


class Scheduler(ABC):
    name: str

    @abstractmethod
    def submit(self, spec: JobSpec, *, resubmission_of: str | None = None) -> JobInfo:
        """Submit a job; returns at once with its id (state PENDING or RUNNING)."""

    @abstractmethod
    def job(self, job_id: str) -> JobInfo:
        """Current state of one job. Raises JobNotFound."""

    @abstractmethod
    def jobs(self) -> list[JobInfo]:
        """All jobs the scheduler still knows, oldest first."""

    @abstractmethod
    def cancel(self, job_id: str, reason: str) -> bool:
        """Stop a job. Returns False if it had already finished."""

    @abstractmethod
    def nodes(self) -> list[NodeInfo]:
        """Every node with its state."""

    @abstractmethod
    def drain(self, node: str, reason: str) -> bool:
        """Drain a node (no new jobs). Returns False if it was already drained."""

    @abstractmethod
    def resume(self, node: str) -> bool:
        """Return a drained node to service. Returns False if it was not drained."""

    @abstractmethod
    def hold(self, name: str, nodes: list[str], duration_s: int) -> list[str]:
        """Keep new jobs off idle ``nodes`` for up to ``duration_s`` (a pair test is about to
        run there) under the hold ``name``. Returns the nodes held: a node that is running
        a job, or takes one meanwhile, is left out, never taken from its job."""

    @abstractmethod
    def release(self, name: str) -> bool:
        """End the hold ``name``. Returns False if there was none (idempotent)."""

    @abstractmethod
    def cancel_steps_on(self, job_id: str, node: str, reason: str) -> list[str]:
        """Stop what ``job_id`` still runs on ``node`` (a node being isolated), and nothing
        else: never another job, never the job's work elsewhere where the scheduler can tell
        them apart. Returns what was cancelled (empty when nothing ran there)."""

    @abstractmethod
    def request_checkpoint(self, job_id: str) -> bool:
        """Ask a running job to save a checkpoint now (the framework's save signal).
        Returns False if the job is not running."""

    def topology(self) -> dict[str, NodePlace]:
        """Node -> its rack and leaf switch, where the scheduler knows them (Slurm's
        topology/tree plugin knows switches); empty where it does not. The inventory's
        declared topology completes it (flows.tasks.node_topology)."""
        return {}

    def resubmit(self, job_id: str, **changes: object) -> JobInfo:
        """Resubmit ``job_id`` with its spec updated by ``changes`` (resume step, excludes...)."""
        previous = self.job(job_id)
        spec = previous.spec.model_copy(
            update={"checkpoint_dir": previous.checkpoint_dir, **changes}
        )
        return self.submit(JobSpec.model_validate(spec.model_dump()), resubmission_of=job_id)
