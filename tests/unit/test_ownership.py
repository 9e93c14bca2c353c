"""Whose drain is it: trainmedic returns only nodes it drained itself, with the reason it gave
still on them; an admin's drain, a re-drain after ours, Slurm FAIL and DOWN are not ours."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from trainmedic.core.models import NodeInfo, NodeState
from trainmedic.decisions.ownership import DrainOwner, drain_owner, drain_reason
from trainmedic.state import DrainRecord

AT = datetime(2026, 12, 3, 4, 0, tzinfo=UTC)
OURS = drain_reason("triage", "brave-fox", "ECCError", "in the job logs", "1042")
RECORD = DrainRecord(node="node007", at=AT, flow_run="brave-fox", reason=OURS, evidence="ECC")


def node(state: NodeState, reason: str = OURS, raw: str = "IDLE+DRAIN") -> NodeInfo:
    return NodeInfo(name="node007", state=state, reason=reason, raw_state=raw)


def test_reason_is_tagged_and_names_run_evidence_and_job() -> None:
    assert OURS == "trainmedic triage brave-fox: ECCError in the job logs (job 1042)"


def test_our_drain_with_our_reason_is_ours() -> None:
    ownership = drain_owner(node(NodeState.DRAINED), RECORD)
    assert ownership.ours and "brave-fox" in ownership.why


@pytest.mark.parametrize(
    ("info", "record", "why"),
    [
        (node(NodeState.DRAINED, "fan replacement"), None, "no drain record"),
        (node(NodeState.DRAINED, "keep out: firmware"), RECORD, "drained again"),
        (node(NodeState.DRAINED, raw="IDLE+DRAIN+FAIL"), RECORD, "FAIL"),
        (node(NodeState.DOWN, "Not responding", "DOWN*"), RECORD, "DOWN"),
        # A drain with our prefix but no record (another installation, a hand-copied reason).
        (node(NodeState.DRAINED), None, "no drain record"),
    ],
)
def test_anything_else_is_not_ours(info: NodeInfo, record: DrainRecord | None, why: str) -> None:
    ownership = drain_owner(info, record)
    assert ownership.owner is DrainOwner.other and why in ownership.why


def test_a_node_in_service_is_not_drained() -> None:
    ownership = drain_owner(node(NodeState.IDLE, "", "IDLE"), RECORD)
    assert ownership.owner is DrainOwner.not_drained and not ownership.ours
