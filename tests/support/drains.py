"""Nodes drained the way trainmedic drains them, for the node-lifecycle tests."""

from __future__ import annotations

from trainmedic.core.models import NodeInfo, NodeState


def states(scheduler) -> dict[str, NodeInfo]:  # type: ignore[no-untyped-def]
    return {n.name: n for n in scheduler.nodes()}


def isolated(cluster, node: str, scheduler) -> None:  # type: ignore[no-untyped-def]
    """Drained and marked by trainmedic's own isolation step (its drain record included)."""
    from prefect import flow

    from flows.isolate import isolate

    @flow(name="isolate-for-test")
    def isolate_one() -> None:
        isolate(
            {node: "faulty"},
            runbook="locate-faulty-nodes",
            evidence="in pair tests",
            approval_timeout_s=30,
            job_id=None,
            dry_run=False,
        )

    isolate_one()
    assert states(scheduler)[node].state is NodeState.DRAINED
    assert (cluster.nodes_dir / node / "isolated").exists()
