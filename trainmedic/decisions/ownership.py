"""Whose drain is it? trainmedic returns to service only the nodes it drained itself.

A site's operators drain nodes for their own reasons (a fan, a firmware upgrade, a ticket),
and Slurm marks nodes FAIL or DOWN by itself. An automation that resumes those puts broken
hardware back under training jobs, the first way peers of this project lost their users'
trust. So a drain is trainmedic's only when all of these hold:

* the scheduler shows the node drained, and not FAIL (set by an admin or by Slurm itself);
* trainmedic holds a drain record for the node (written when it drained it);
* the scheduler's reason is still exactly the reason trainmedic gave. An admin who drains
  the node again after us (``scontrol update ... State=DRAIN Reason=...``) changes the
  reason, and from then on the node is the admin's.

Pure: the caller reads the node from the scheduler and the record from the server.
"""

from __future__ import annotations

from enum import StrEnum

from trainmedic.core.models import NodeInfo, NodeState, Strict
from trainmedic.state.records import DrainRecord

__all__ = ["DRAIN_REASON_PREFIX", "DrainOwner", "Ownership", "drain_owner", "drain_reason"]

# Every reason trainmedic gives a drain starts so: an operator reading `sinfo -R` sees at once
# which drains are the automation's.
DRAIN_REASON_PREFIX = "trainmedic"


class DrainOwner(StrEnum):
    trainmedic = "trainmedic"  # ours: we may return it (after its checks)
    other = "other"  # an admin's or Slurm's: never returned by trainmedic
    not_drained = "not drained"


class Ownership(Strict):
    owner: DrainOwner
    why: str

    @property
    def ours(self) -> bool:
        return self.owner is DrainOwner.trainmedic


def drain_reason(
    runbook: str, run_name: str, verdict: str, evidence: str, job_id: str | None
) -> str:
    """The reason trainmedic gives the scheduler for a drain."""
    reason = f"{DRAIN_REASON_PREFIX} {runbook} {run_name}: {verdict} {evidence}".strip()
    return f"{reason} (job {job_id})" if job_id else reason


def drain_owner(node: NodeInfo, record: DrainRecord | None) -> Ownership:
    """Who owns ``node``'s drain, and why we think so (one sentence for the report)."""
    flags = {f.rstrip("*~#!%$@^-") for f in node.raw_state.upper().split("+") if f}
    if node.state is NodeState.DOWN:
        return Ownership(
            owner=DrainOwner.other,
            why=f"{node.name} is DOWN ({node.reason or 'no reason given'}): the scheduler's "
            "or an admin's, not a trainmedic drain",
        )
    if node.state is not NodeState.DRAINED:
        return Ownership(owner=DrainOwner.not_drained, why=f"{node.name} is {node.state}")
    if flags & {"FAIL", "FAILING"}:
        return Ownership(
            owner=DrainOwner.other,
            why=f"{node.name} is {node.raw_state} ({node.reason}): FAIL is set by an admin or "
            "by Slurm, never by trainmedic",
        )
    if record is None:
        return Ownership(
            owner=DrainOwner.other,
            why=f"{node.name} was drained by someone else ({node.reason or 'no reason'}): "
            "trainmedic holds no drain record for it",
        )
    if node.reason.strip() != record.reason.strip():
        return Ownership(
            owner=DrainOwner.other,
            why=f"{node.name} was drained again after trainmedic's drain of "
            f"{record.at:%Y-%m-%d %H:%M} UTC: the reason is now {node.reason!r}",
        )
    return Ownership(
        owner=DrainOwner.trainmedic,
        why=f"drained by trainmedic run {record.flow_run or '?'} at "
        f"{record.at:%Y-%m-%d %H:%M} UTC: {record.evidence or record.reason}",
    )
