"""The repair runbook on a real Prefect server, real ansible-runner and simulated nodes whose
reset and reboot fix what they fix on real hardware: fault → drain → repair → burn-in →
back in service; the same fault again → hardware inspection, never returned; a fault no
repair fixes → inspection at once; nothing happens without ownership or approval."""

from __future__ import annotations

import pytest
from support.drains import isolated, states
from support.waits import run_in_thread, unique_run_name, wait_paused

from trainmedic.core.models import NodeState
from trainmedic.sim.hardware import NodeFault


def drain_record(node: str):  # type: ignore[no-untyped-def]
    from flows.tasks import server_state

    return server_state().drain_record(node)


@pytest.mark.server
def test_fault_drain_repair_burn_in_return_then_the_same_fault_again_is_kept_out(
    prefect_server, sim, policy
) -> None:
    from flows.repair import RepairRequest, repair_node
    from flows.restore import RestoreRequest, restore_node
    from flows.tasks import server_state

    policy(repair_approval="false")
    cluster, scheduler = sim
    cluster.inject("node004", "xid79", gpu=1)
    isolated(cluster, "node004", scheduler)

    first = repair_node(RepairRequest(node="node004"))

    assert (first.repair, first.fault) == ("reboot", "Xid 79")
    assert first.decided_by == "policy (repairs approved automatically)"
    assert first.repaired and first.restored and first.restore is not None
    assert "dcgmi diag -r 2 and the pair test" in first.restore.reason
    assert any(": 79," in line for line in first.evidence)
    assert cluster.status("node004").fault is NodeFault.healthy
    assert states(scheduler)["node004"].state is NodeState.IDLE
    assert drain_record("node004") is None
    (repair,) = server_state().repairs("node004")
    assert (repair.fault, repair.kind, repair.outcome) == ("Xid 79", "reboot", "done")
    assert [a.kind for a in server_state().actions() if a.target == "node004"] == [
        "drain",
        "reboot",
    ]

    # The same fault comes back: the reboot did not fix it. Hardware inspection, not a repair.
    cluster.inject("node004", "xid79", gpu=1)
    isolated(cluster, "node004", scheduler)
    second = repair_node(RepairRequest(node="node004"))

    assert second.inspection and second.escalated and not second.repaired
    assert "Xid 79 again after 1 repair(s)" in second.why
    assert "needs hardware inspection" in second.outcome and second.human_needed
    assert "hardware inspection" in (drain_record("node004").inspection or "") or (
        "again after" in drain_record("node004").inspection
    )
    assert len(server_state().repairs("node004")) == 1  # nothing repaired this time
    # Never returned automatically: repair and restore both refuse it.
    cluster.repair("node004")  # even once the hardware is in fact fine
    assert "waiting for hardware inspection" in repair_node(RepairRequest(node="node004")).outcome
    refused = restore_node(RestoreRequest(node="node004"))
    assert refused.verdict == "refused: needs hardware inspection" and not refused.restored
    assert states(scheduler)["node004"].state is NodeState.DRAINED
    # A named human returns it after the inspection (burn-in still runs).
    forced = restore_node(
        RestoreRequest(
            node="node004", force=True, forced_by="alice", force_reason="GPU 1 reseated, RMA 77"
        )
    )
    assert forced.restored and states(scheduler)["node004"].state is NodeState.IDLE


@pytest.mark.server
def test_a_failed_row_remap_goes_to_inspection_without_a_repair(
    prefect_server, sim, policy
) -> None:
    from flows.repair import RepairRequest, repair_node
    from flows.tasks import server_state

    policy(repair_approval="false")
    cluster, scheduler = sim
    cluster.inject("node003", "rowremap", gpu=2)
    isolated(cluster, "node003", scheduler)

    result = repair_node(RepairRequest(node="node003"))

    assert (result.repair, result.fault) == ("inspect", "Xid 64")
    assert result.inspection and not result.repaired and not result.restored
    assert "RMA" in result.why
    assert server_state().repairs("node003") == []
    assert states(scheduler)["node003"].state is NodeState.DRAINED
    assert drain_record("node003").inspection


@pytest.mark.server
def test_a_reset_waits_for_approval_and_no_answer_repairs_nothing(prefect_server, sim) -> None:
    from prefect.flow_runs import resume_flow_run

    from flows.repair import RepairRequest, repair_node

    cluster, scheduler = sim
    cluster.inject("node005", "ecc", gpu=3)
    isolated(cluster, "node005", scheduler)

    timed_out = repair_node(RepairRequest(node="node005", approval_timeout_s=10))
    assert timed_out.repair == "reset_gpu" and not timed_out.repaired
    assert timed_out.outcome == "not repaired: no answer within 10 s: nothing done"
    assert cluster.status("node005").fault is NodeFault.ecc

    name = unique_run_name("repair")
    thread, box = run_in_thread(repair_node, RepairRequest(node="node005"), name)
    run_id = wait_paused(name, box=box)
    resume_flow_run(run_id, run_input={"approve": True, "by": "bob", "note": "go"})
    thread.join(timeout=180)
    approved = box["result"]
    assert approved.decided_by == "approved by bob: go"
    assert approved.repaired and approved.restored
    assert cluster.status("node005").fault is NodeFault.healthy


@pytest.mark.server
def test_a_drain_that_is_not_ours_is_not_repaired(prefect_server, sim, policy) -> None:
    from flows.repair import RepairRequest, repair_node

    policy(repair_approval="false")
    cluster, scheduler = sim
    cluster.inject("node006", "xid79")
    scheduler.admin_drain("node006", "fan replacement ticket 881")

    result = repair_node(RepairRequest(node="node006"))

    assert result.outcome.startswith("refused: not trainmedic's drain")
    assert cluster.status("node006").fault is NodeFault.xid79  # no reboot
    assert states(scheduler)["node006"].reason == "fan replacement ticket 881"


@pytest.mark.server
def test_dry_run_plans_and_changes_nothing(prefect_server, sim, policy) -> None:
    from flows.repair import RepairRequest, repair_node
    from flows.tasks import server_state

    policy(repair_approval="false")
    cluster, scheduler = sim
    cluster.inject("node007", "nvlink")
    isolated(cluster, "node007", scheduler)

    result = repair_node(RepairRequest(node="node007", dry_run=True))

    assert (result.repair, result.fault) == ("reset_gpu", "Xid 74")
    assert result.outcome == "dry run: would reset_gpu and burn in"
    assert cluster.status("node007").fault is NodeFault.nvlink
    assert server_state().repairs("node007") == []
    assert states(scheduler)["node007"].state is NodeState.DRAINED
