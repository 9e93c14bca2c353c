"""The records trainmedic keeps: plain models, shared by the stores (which keep them) and the
decisions (which read them), so neither depends on the other."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from trainmedic.core.models import NodeName, Strict


class ActionKind(StrEnum):
    drain = "drain"
    stop_job = "stop_job"
    resubmit = "resubmit"
    reset_gpu = "reset_gpu"
    reboot = "reboot"
    breaker_reset = "breaker_reset"  # a human's reset: actions before it no longer count


class ActionEntry(Strict):
    """One destructive action (or a human's breaker reset), as the circuit breaker counts it."""

    kind: ActionKind
    target: str
    at: datetime
    flow_run: str = ""


class DrainRecord(Strict):
    """One drain trainmedic made and still holds: the node, the exact reason it gave the
    scheduler (how a later check tells our drain from an admin's or a re-drain), the run, the
    evidence and the time. Kept until trainmedic returns the node."""

    node: NodeName
    at: datetime
    flow_run: str = ""
    reason: str = ""
    evidence: str = ""
    job_id: str | None = None
    # What convicted it ("ECCError", "faulty", "slow"...): the repair it needs without an Xid.
    verdict: str = ""
    # Why it needs hardware inspection (a repeated fault, a fault no software repair fixes, a
    # lemon); set: never returned automatically, only by a named human with --force.
    inspection: str = ""


class RepairRecord(Strict):
    """One repair trainmedic made (or tried): how a repeat of the same fault is recognised."""

    node: NodeName
    fault: str  # "Xid 48", "faulty": what the repair answered
    kind: str  # reset_gpu | reboot
    at: datetime
    flow_run: str = ""
    outcome: str = ""


class Correction(Strict):
    """A human's verdict on a job's failure, kept as a labelled example: later failures whose
    logs hold the same line templates get the human's category (and origin)."""

    id: str
    job_id: str
    category: str  # a taxonomy label (checked where the human gives it)
    # Digit-masked, lowercased templates of the failure's telling lines (its fingerprint).
    templates: tuple[str, ...]
    # The template whose log names the origin host (the human's --host), if one was given.
    host_template: str | None = None
    host: str | None = None
    examples: tuple[str, ...] = ()  # the lines of the templates, as they were written
    by: str
    reason: str = ""
    at: datetime


class Incident(Strict):
    """One storm's record: the jobs and nodes one run handles, and how far it got."""

    incident_id: str = Field(pattern=r"^[a-z0-9-]{1,64}$")
    leader: str = Field(description="the flow run (id) that handles it")
    jobs: tuple[str, ...]
    nodes: tuple[str, ...]
    opened_at: datetime
    # Set once the isolation decision is taken: from then the nodes are drained, held or
    # cleared, and resubmissions (this incident's or anyone's) may be placed.
    decided_at: datetime | None = None
    closed_at: datetime | None = None
    suspected_switches: tuple[str, ...] = ()

    @property
    def decided(self) -> bool:
        return self.decided_at is not None
