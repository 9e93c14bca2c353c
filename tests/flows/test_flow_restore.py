"""The restore runbook on a real Prefect server and real ansible-runner: a repaired node
comes back only after a passing pair test, and only when trainmedic drained it; a still-broken
or still-slow one stays out, and an admin's drain is never touched."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from support.drains import isolated, states

from trainmedic.core.errors import InputError
from trainmedic.core.models import JobState, NodeInfo, NodeState


@pytest.mark.server
@pytest.mark.parametrize(
    ("level", "burn_in"),
    [
        (2, "Deployment                | Pass"),
        # A site without DCGM: the pair test alone, and the report says so.
        (0, "no DCGM diagnostic: TRAINMEDIC_BURN_IN_DCGM_LEVEL=0"),
    ],
)
def test_repaired_node_passes_and_is_resumed(prefect_server, sim, policy, level, burn_in) -> None:  # type: ignore[no-untyped-def]
    from flows.restore import RestoreRequest, restore_node

    policy(burn_in_dcgm_level=level)
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
    assert any(burn_in in line for line in result.burn_in), result.burn_in
    diagnosed = "dcgmi diag -r 2 and " if level else ""
    assert result.reason == f"{diagnosed}the pair test with node001 passed"


@pytest.mark.server
@pytest.mark.parametrize(
    ("fault", "verdict", "why"),
    [
        # The burn-in's DCGM diagnostic finds it before any pair test.
        ("ecc", "kept drained: burn-in failed", "Memory: Fail - GPU: 0"),
        # DCGM passes (the GPUs are fine); the pair test does not.
        ("link", "kept drained: error", "NET/IB : Got completion from peer with error 12"),
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
    assert why in result.reason
    assert ("node002" in result.reason) is (fault != "ecc")  # no pair test after a failed diag
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


@pytest.mark.server
@pytest.mark.parametrize("how", ["admin drain", "admin re-drain after ours", "FAIL"])
def test_a_drain_that_is_not_ours_is_never_returned(prefect_server, sim, how) -> None:  # type: ignore[no-untyped-def]
    from flows.restore import RestoreRequest, restore_node

    cluster, scheduler = sim
    if how == "admin drain":
        scheduler.admin_drain("node005", "fan replacement ticket 881")
    elif how == "admin re-drain after ours":
        cluster.inject("node005", "xid79")
        isolated(cluster, "node005", scheduler)
        cluster.repair("node005")
        scheduler.admin_drain("node005", "keep out: firmware upgrade")
    else:
        scheduler.admin_drain("node005", "bad PSU", fail=True)
    before = states(scheduler)["node005"]

    result = restore_node(RestoreRequest(node="node005"))
    assert not result.restored and result.verdict == "refused: not trainmedic's drain"
    assert "--force" in result.reason
    after = states(scheduler)["node005"]
    assert after.state is NodeState.DRAINED and after.reason == before.reason
    assert result.partner is None  # refused before any test ran


@pytest.mark.server
def test_force_needs_a_named_human_and_a_reason_and_is_recorded(prefect_server, sim) -> None:
    from prefect.client.orchestration import get_client

    from flows.restore import RestoreRequest, restore_node

    _, scheduler = sim
    with pytest.raises(ValidationError, match="forced_by"):
        RestoreRequest(node="node005", force=True, force_reason="checked it")
    with pytest.raises(ValidationError, match="force_reason"):
        RestoreRequest(node="node005", force=True, forced_by="alice")
    scheduler.admin_drain("node005", "fan replacement ticket 881")

    result = restore_node(
        RestoreRequest(node="node005", force=True, forced_by="alice", force_reason="fan replaced")
    )
    assert result.restored
    assert "forced by alice: fan replaced" in result.owner
    with get_client(sync_client=True) as client:
        report = client.read_latest_artifacts()
    text = next(str(a.data) for a in report if a.key == result.report_key)
    assert "forced by alice: fan replaced" in text and "ticket 881" in text


@pytest.mark.server
def test_marker_is_removed_before_the_node_is_resumed(prefect_server, sim, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from flows.restore import RestoreRequest, restore_node
    from flows.tasks import server_state

    cluster, scheduler = sim
    cluster.inject("node004", "xid79")
    isolated(cluster, "node004", scheduler)
    assert server_state().drain_record("node004") is not None
    cluster.repair("node004")
    marked_at_resume: list[bool] = []
    original = type(scheduler).resume

    def resume(self, node: str) -> bool:  # type: ignore[no-untyped-def]
        marked_at_resume.append((cluster.nodes_dir / node / "isolated").exists())
        return original(self, node)

    monkeypatch.setattr(type(scheduler), "resume", resume)
    assert restore_node(RestoreRequest(node="node004")).restored
    assert marked_at_resume == [False]
    assert server_state().drain_record("node004") is None  # ours no more


@pytest.mark.server
def test_a_node_whose_marker_cannot_be_removed_stays_drained(
    prefect_server, sim, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """The node passes its checks, then drops off the network as the marker is removed: it
    is not resumed (a marked node back in service, or one the site's health check fails),
    and stays drained and ours."""
    import flows.restore as restore_module
    from flows.restore import RestoreRequest, restore_node
    from flows.tasks import server_state

    cluster, scheduler = sim
    cluster.inject("node004", "xid79")
    isolated(cluster, "node004", scheduler)
    cluster.repair("node004")
    real = restore_module.run_playbook

    def unreachable_when_unmarking(playbook, targets, extravars=None, **kwargs):  # type: ignore[no-untyped-def]
        if (extravars or {}).get("trainmedic_isolation_state") == "absent":
            cluster.inject("node004", "down")
        return real(playbook, targets, extravars, **kwargs)

    monkeypatch.setattr(restore_module, "run_playbook", unreachable_when_unmarking)
    result = restore_node(RestoreRequest(node="node004"))
    assert not result.restored
    assert result.verdict == "kept drained: isolation marker not removed"
    assert {n.name: n.state for n in scheduler.nodes()}["node004"] is NodeState.DRAINED
    assert server_state().drain_record("node004") is not None  # still ours


@pytest.mark.server
def test_the_partners_are_held_while_they_test_the_node(prefect_server, sim, monkeypatch) -> None:
    """A job submitted while the node is tested never lands on its partner or the reference
    pair (they are held), and the hold ends with the test."""
    import flows.restore as restore_module
    from flows.restore import RestoreRequest, restore_node
    from trainmedic.core.models import JobSpec

    cluster, scheduler = sim
    cluster.inject("node004", "xid79")
    isolated(cluster, "node004", scheduler)
    cluster.repair("node004")
    real = restore_module.run_pair_tests
    placed: list[tuple[list[str], tuple[str, ...]]] = []

    def submit_during_the_test(groups, *args, **kwargs):  # type: ignore[no-untyped-def]
        job = scheduler.submit(JobSpec(name="squeeze", nodes=1, steps=100_000))
        placed.append(([n for g in groups for n in g], scheduler.job(job.job_id).nodes))
        return real(groups, *args, **kwargs)

    monkeypatch.setattr(restore_module, "run_pair_tests", submit_during_the_test)
    assert restore_node(RestoreRequest(node="node004")).restored
    ((tested, landed_on),) = placed
    assert landed_on and not set(landed_on) & set(tested), placed
    # The hold ended with the test: every other node can take a job again.
    rest = scheduler.submit(JobSpec(name="rest", nodes=7, steps=100_000))
    assert scheduler.job(rest.job_id).state is JobState.RUNNING


@pytest.mark.server
def test_a_lemon_is_not_returned_until_a_human_forces_it(prefect_server, sim, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Drained 3 times in a week (the limit here: 2): its third return is refused whatever
    its pair test would say; a named human with a reason can still return it."""
    from flows.restore import RestoreRequest, restore_node
    from trainmedic.core.settings import get_settings

    monkeypatch.setenv("TRAINMEDIC_LEMON_DRAINS", "2")
    get_settings.cache_clear()
    cluster, scheduler = sim
    cluster.inject("node004", "xid79")
    isolated(cluster, "node004", scheduler)
    cluster.repair("node004")
    assert restore_node(RestoreRequest(node="node004")).restored  # once: fine

    cluster.inject("node004", "ecc")
    isolated(cluster, "node004", scheduler)
    cluster.repair("node004")
    refused = restore_node(RestoreRequest(node="node004"))
    assert not refused.restored and refused.verdict == "refused: a lemon"
    assert "drained 2 times in 7 days" in refused.reason
    assert states(scheduler)["node004"].state is NodeState.DRAINED

    forced = restore_node(
        RestoreRequest(node="node004", force=True, forced_by="carol", force_reason="GPU swapped")
    )
    assert forced.restored
