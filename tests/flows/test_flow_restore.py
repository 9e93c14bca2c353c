"""The restore runbook on a real Prefect server and real ansible-runner: a repaired node
comes back only after a passing pair test; a still-broken or still-slow one stays out."""

from __future__ import annotations

import pytest

from trainmedic.core.errors import InputError
from trainmedic.core.models import NodeInfo, NodeState


def states(scheduler) -> dict[str, NodeInfo]:  # type: ignore[no-untyped-def]
    return {n.name: n for n in scheduler.nodes()}


def isolated(cluster, node: str, scheduler) -> None:  # type: ignore[no-untyped-def]
    scheduler.drain(node, "trainmedic locate-faulty-nodes test: faulty in pair tests")
    (cluster.nodes_dir / node / "isolated").write_text("locate-faulty-nodes test\n")


@pytest.mark.server
def test_repaired_node_passes_and_is_resumed(prefect_server, sim) -> None:
    from flows.restore import RestoreRequest, restore_node

    cluster, scheduler = sim
    cluster.inject("node004", "xid79")
    isolated(cluster, "node004", scheduler)
    cluster.repair("node004")

    result = restore_node(RestoreRequest(node="node004"))
    assert result.restored and result.verdict == "restored"
    assert result.partner == "node001"
    assert result.busbw_gbps and result.reference_gbps  # measured alongside, same run
    assert states(scheduler)["node004"].state is NodeState.IDLE
    assert not (cluster.nodes_dir / "node004" / "isolated").exists()


@pytest.mark.server
@pytest.mark.parametrize(
    ("fault", "verdict", "why"),
    [
        ("ecc", "kept drained: error", "uncorrectable ECC"),
        ("slow", "kept drained: slow", "GB/s <"),
    ],
)
def test_node_that_still_fails_stays_drained(prefect_server, sim, fault, verdict, why) -> None:  # type: ignore[no-untyped-def]
    from flows.restore import RestoreRequest, restore_node

    cluster, scheduler = sim
    cluster.inject("node006", fault)
    isolated(cluster, "node006", scheduler)

    result = restore_node(RestoreRequest(node="node006", partner="node002"))
    assert not result.restored and result.verdict == verdict
    assert why in result.reason and "node002" in result.reason
    node = states(scheduler)["node006"]
    assert node.state is NodeState.DRAINED and "locate-faulty-nodes" in node.reason
    assert (cluster.nodes_dir / "node006" / "isolated").exists()


@pytest.mark.server
def test_node_not_drained_is_left_alone(prefect_server, sim) -> None:
    from flows.restore import RestoreRequest, restore_node

    result = restore_node(RestoreRequest(node="node003"))
    assert not result.restored and result.verdict == "not drained"


def test_partner_must_be_idle_and_not_the_node() -> None:
    from flows.restore import choose_partners

    nodes = [
        NodeInfo(name="a1", state=NodeState.DRAINED, reason="x"),
        NodeInfo(name="a2", state=NodeState.ALLOCATED),
        NodeInfo(name="a3", state=NodeState.IDLE),
        NodeInfo(name="a4", state=NodeState.IDLE),
        NodeInfo(name="a5", state=NodeState.IDLE),
        NodeInfo(name="a6", state=NodeState.DOWN),
    ]
    assert choose_partners("a1", nodes) == ("a3", ("a4", "a5"))
    assert choose_partners("a1", nodes, "a5") == ("a5", ("a3", "a4"))
    with pytest.raises(InputError, match="not IDLE"):
        choose_partners("a1", nodes, "a2")
    with pytest.raises(InputError, match="itself"):
        choose_partners("a1", nodes, "a1")
    with pytest.raises(InputError, match="no IDLE"):
        choose_partners("a1", nodes[:2])
    assert choose_partners("a1", nodes[:4]) == ("a3", None)
