"""The isolation policy: auto-approval of small isolations, blast radius, rate limit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from trainmedic.decisions.guard import (
    IsolationPolicy,
    approved_nodes,
    decide_isolation,
    recent_drains,
)
from trainmedic.state import ActionEntry, ActionKind

NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)
BIG = IsolationPolicy()  # defaults: 1 node auto, 5 %, 4 per hour


def decide(candidates, *, size=200, drained=(), recent=(), policy=BIG):  # type: ignore[no-untyped-def]
    return decide_isolation(
        candidates, cluster_size=size, drained=set(drained), recent=list(recent), policy=policy
    )


def drain_at(node: str, minutes_ago: float) -> ActionEntry:
    at = NOW - timedelta(minutes=minutes_ago)
    return ActionEntry(kind=ActionKind.drain, target=node, at=at, flow_run="r")


def test_one_node_on_a_big_cluster_is_auto_approved() -> None:
    decision = decide(["n1"])
    assert decision.mode == "auto" and decision.nodes == ("n1",) and decision.reasons == ()


def test_two_nodes_need_a_human_even_inside_the_guard() -> None:
    decision = decide(["n1", "n2"])
    assert decision.mode == "approval" and decision.guard == ()
    assert "more than the 1 approved automatically" in decision.reasons[0]


def test_nothing_new_to_drain() -> None:
    decision = decide(["n1"], drained=["n1"])
    assert decision.mode == "none" and decision.nodes == () and decision.already_drained == ("n1",)


def test_blast_radius_counts_nodes_already_drained() -> None:
    # 200 nodes, 5 %: 10 may be drained. 10 are drained already, one more crosses it.
    decision = decide(["n1"], drained=[f"d{i}" for i in range(10)])
    assert decision.mode == "approval"
    assert decision.guard and "blast radius: 11 of 200" in decision.guard[0]


def test_small_cluster_may_always_lose_min_drainable_nodes() -> None:
    # 5% of 8 nodes is 0: without the floor, no node could ever be drained unasked.
    assert decide(["n1"], size=8).mode == "auto"
    assert decide(["n2"], size=8, drained={"n1"}).mode == "approval"
    strict = IsolationPolicy(min_drainable=0)
    assert decide(["n1"], size=8, policy=strict).mode == "approval"
    assert decide(["n1"], size=8, policy=IsolationPolicy(max_share=0.25, min_drainable=0)).mode == (
        "auto"
    )


def test_rate_limit_counts_recent_drains_in_the_window() -> None:
    ledger = [drain_at(f"r{i}", 10 * i) for i in range(4)] + [drain_at("old", 61)]
    recent = recent_drains(ledger, NOW, 3600)
    assert [r.target for r in recent] == ["r3", "r2", "r1", "r0"]  # oldest first, "old" out
    decision = decide(["n1"], recent=recent)
    assert decision.mode == "approval"
    assert any("rate limit: 5 nodes" in g for g in decision.guard)
    assert decide(["n1"], recent=recent[1:]).mode == "auto"


def test_rate_limit_counts_drains_only() -> None:
    stops = [
        ActionEntry(kind=ActionKind.stop_job, target=f"job {i}", at=NOW, flow_run="r")
        for i in range(9)
    ]
    assert recent_drains([*stops, drain_at("n1", 1)], NOW, 3600) == [drain_at("n1", 1)]


def test_redrain_of_a_recent_node_counts_once() -> None:
    recent = recent_drains([drain_at("n1", 5), drain_at("n1", 1)], NOW, 3600)
    assert len(recent) == 1 and recent[0].at == NOW - timedelta(minutes=1)


def test_auto_approve_zero_means_always_ask() -> None:
    assert decide(["n1"], policy=IsolationPolicy(auto_approve_max=0)).mode == "approval"


def test_approval_answers() -> None:
    decision = decide(["n1", "n2", "n3"])
    assert approved_nodes(decision, "approve") == (["n1", "n2", "n3"], [])
    assert approved_nodes(decision, "reject", ["n1"]) == ([], [])
    # An approval narrows an isolation, never widens it.
    assert approved_nodes(decision, "approve_subset", ["n3", "x9", "n1"]) == (["n1", "n3"], ["x9"])
