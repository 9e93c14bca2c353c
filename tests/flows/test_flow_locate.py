"""The locate runbook end to end: a real Prefect server, real ansible-runner running
playbooks/nccl_pair_test.yml and isolate_node.yml against the simulated cluster (8 nodes)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.artifacts import run_artifacts
from support.waits import run_in_thread, unique_run_name, wait_paused, wait_until

from trainmedic.core.models import NodeState

ALL = "node[001-008]"
HALF = "node[001-004]"  # enough where only the isolation step is under test


def drained(scheduler) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {n.name: n.reason for n in scheduler.nodes() if n.state is NodeState.DRAINED}


@pytest.mark.server
def test_finds_faulty_and_slow_in_two_rounds_and_drains_the_approved_subset(
    prefect_server, sim, policy
) -> None:
    policy(max_share=0.25, max_per_window=4)  # 8 nodes: 5 % is 0
    from prefect.flow_runs import resume_flow_run

    from flows.locate import LocateRequest, locate_faulty_nodes

    cluster, scheduler = sim
    cluster.inject("node003", "xid79")
    cluster.inject("node006", "slow")
    request = LocateRequest(nodes=ALL, isolate=True, approval_timeout_s=120)
    run_name = unique_run_name("locate-subset")
    thread, box = run_in_thread(locate_faulty_nodes, request, run_name)

    run_id = wait_paused(run_name, box=box)
    assert drained(scheduler) == {}  # nothing before the human answers
    # node001 is not a candidate: an approval narrows an isolation, never widens it.
    resume_flow_run(
        run_id,
        run_input={
            "decision": "approve_subset",
            "nodes": ["node003", "node001"],
            "note": "ticket 42",
        },
    )
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert "error" not in box, box.get("error")
    result = box["result"]

    assert result.faulty == ["node003"]
    assert result.slow == ["node006"]
    assert result.rounds == 2
    assert result.tests_run >= 6  # 4 screening pairs + 2 verifications
    assert result.undetermined == []
    assert result.isolation.mode == "approval"
    assert result.isolation.approved == ["node003"]
    assert result.isolation.ignored == ["node001"]
    assert result.isolation.drained == ["node003"]
    reasons = drained(scheduler)
    assert list(reasons) == ["node003"]
    assert "locate-faulty-nodes" in reasons["node003"] and "faulty" in reasons["node003"]

    found = run_artifacts(result.flow_run_id)
    assert {"locate-round-1", "locate-round-2", "locate-summary"} <= set(found)
    summary = str(found["locate-summary"])
    assert "**node003**" in summary and "**node006**" in summary
    assert "human: approve_subset: ticket 42" in summary
    assert "79, pid=" in summary  # the Xid line collected by isolate_node.yml
    assert "node003" in str(found["locate-round-2"])  # verified with a healthy partner


@pytest.mark.server
def test_down_node_fails_its_tests_instead_of_hanging_the_flow(prefect_server, sim) -> None:
    from flows.locate import LocateRequest, locate_faulty_nodes
    from trainmedic.locate import plan_round_one

    cluster, scheduler = sim
    cluster.inject("node005", "down")
    names = [f"node{i:03d}" for i in range(1, 9)]
    # A seed that puts node005 second in its screening pair: its partner's test hangs
    # waiting for it and must be killed at the timeout (as leader it is just unreachable).
    seed = next(s for s in range(100) if any(g[1] == "node005" for g in plan_round_one(names, s)))
    started = time.monotonic()
    result = locate_faulty_nodes(LocateRequest(nodes=ALL, seed=seed, test_timeout_s=5))
    assert result.faulty == ["node005"]
    assert result.slow == [] and result.undetermined == []
    assert time.monotonic() - started < 90
    found = run_artifacts(result.flow_run_id)
    assert "timed out after 5 s" in str(found["locate-round-1"])
    assert "node005 unreachable" in str(found["locate-round-2"])
    assert drained(scheduler) == {}  # isolate=False
    # The hung test was killed, not left behind.
    leftovers = [
        p
        for p in Path("/proc").glob("[0-9]*")
        if str(cluster.nodes_dir) in _cmdline(p) and "all_gather_perf" in _cmdline(p)
    ]
    assert leftovers == []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.server
def test_auto_approved_isolation_drains_exactly_the_faulty_node(
    prefect_server, sim, policy
) -> None:
    policy(max_share=0.25, max_per_window=4)  # 8 nodes: 5 % is 0
    from flows.locate import LocateRequest, locate_faulty_nodes

    cluster, scheduler = sim
    cluster.inject("node002", "ecc")
    marker = Path(cluster.nodes_dir / "node002" / "isolated")
    # Dry run first: same tests and decision, check-mode isolation, no scheduler write.
    dry = locate_faulty_nodes(LocateRequest(nodes=HALF, isolate=True, dry_run=True))
    assert dry.faulty == ["node002"] and dry.isolation.approved == ["node002"]
    assert dry.isolation.drained == [] and drained(scheduler) == {} and not marker.exists()
    assert "DRY RUN" in str(run_artifacts(dry.flow_run_id)["locate-summary"])

    result = locate_faulty_nodes(LocateRequest(nodes=HALF, isolate=True, job_id="1234"))
    assert result.faulty == ["node002"] and result.slow == []
    assert result.isolation.decided_by == "policy (auto-approved)"
    reasons = drained(scheduler)
    assert list(reasons) == ["node002"]
    assert "job 1234" in reasons["node002"]
    # isolate_node.yml ran: the marker, and the evidence in the report.
    assert "locate-faulty-nodes" in marker.read_text()
    evidence = result.isolation.evidence["node002"]
    assert any(": 48," in line for line in evidence["xid_lines"])
    # The quick diagnostic (-r 1: deployment checks; memory is burn-in's -r 2) ran.
    assert any("Deployment" in line for line in evidence["dcgmi"])
    summary = str(run_artifacts(result.flow_run_id)["locate-summary"])
    assert "dcgmi diag -r 1" in summary

    # Replayed: idempotent, nothing drained twice.
    again = locate_faulty_nodes(LocateRequest(nodes=HALF, isolate=True))
    assert again.isolation.mode == "none" and again.isolation.drained == []
    assert again.isolation.already_drained == ["node002"]


@pytest.mark.server
def test_isolation_stops_the_failed_job_on_the_node_after_the_drain(
    prefect_server, sim, policy
) -> None:
    policy(max_share=0.25, max_per_window=4)  # 8 nodes: 5 % is 0
    """The job named by the run, still running on the isolated node, is stopped there after
    the node's drain is recorded; a job the run is not about is left alone."""
    from flows.locate import LocateRequest, locate_faulty_nodes
    from trainmedic.core.models import JobSpec, JobState

    cluster, scheduler = sim
    failing = scheduler.submit(JobSpec(name="failing", nodes=2, steps=100_000))
    bystander = scheduler.submit(JobSpec(name="bystander", nodes=2, steps=100_000))
    wait_until(lambda: scheduler.job(bystander.job_id).state is JobState.RUNNING, 30, "running")
    victim = scheduler.job(failing.job_id).nodes[1]
    cluster.inject(victim, "slow")  # the job crawls on, still running there
    result = locate_faulty_nodes(LocateRequest(nodes=ALL, isolate=True, job_id=failing.job_id))
    assert result.slow == [victim]
    # The failed job's own nodes are tested; the bystander's are not (never under its job).
    assert set(result.not_tested) == set(scheduler.job(bystander.job_id).nodes)
    kinds = [(a.what, a.changed) for a in result.isolation.actions]
    assert kinds == [("drain", True), ("stop job on node", True)]
    assert scheduler.job(failing.job_id).state is JobState.CANCELLED
    assert scheduler.job(bystander.job_id).state is JobState.RUNNING


@pytest.mark.server
def test_blast_radius_guard_blocks_without_approval(prefect_server, sim) -> None:
    from flows.locate import LocateRequest, locate_faulty_nodes

    cluster, scheduler = sim
    cluster.inject("node004", "xid79")
    # Default policy: 5 % of 8 nodes rounds to none, so only the floor of one drained node is
    # allowed unasked, and one node is drained already. Nobody answers the approval.
    scheduler.drain("node008", "maintenance")
    result = locate_faulty_nodes(LocateRequest(nodes=HALF, isolate=True, approval_timeout_s=10))
    assert result.faulty == ["node004"]
    assert result.isolation.mode == "approval"
    assert any("blast radius" in r for r in result.isolation.reasons)
    assert "timed out" in result.isolation.decided_by
    assert result.isolation.drained == [] and drained(scheduler) == {"node008": "maintenance"}
    assert "nothing drained" in str(run_artifacts(result.flow_run_id)["locate-summary"])


@pytest.mark.server
def test_rejected_isolation_drains_nothing(prefect_server, sim, policy) -> None:
    from prefect.flow_runs import resume_flow_run

    from flows.locate import LocateRequest, locate_faulty_nodes

    cluster, scheduler = sim
    cluster.inject("node003", "nvlink")
    policy(auto_approve_max=0, max_share=0.5)
    run_name = unique_run_name("locate-reject")
    thread, box = run_in_thread(
        locate_faulty_nodes,
        LocateRequest(nodes=HALF, isolate=True, approval_timeout_s=120),
        run_name,
    )
    resume_flow_run(wait_paused(run_name, box=box), run_input={"decision": "reject"})
    thread.join(timeout=60)
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert result.faulty == ["node003"]
    assert result.isolation.decided_by == "human: reject"
    assert drained(scheduler) == {}


@pytest.mark.server
def test_bad_nodes_are_refused_before_any_test(prefect_server, sim) -> None:
    from pydantic import ValidationError

    from flows.locate import LocateRequest, locate_faulty_nodes
    from trainmedic.core.errors import InputError

    with pytest.raises(ValidationError):
        LocateRequest(nodes="node[001-003;reboot]")
    with pytest.raises(InputError, match="inventory"):
        locate_faulty_nodes(LocateRequest(nodes="node[007-009]"))


def test_batches_bound_the_tests_running_at_once() -> None:
    from flows.locate import plan_batches

    groups = [(f"n{i}a", f"n{i}b") for i in range(10)]
    assert plan_batches(groups, 64, 32) == [[groups]]  # one run for the whole round
    waves = plan_batches(groups, 4, 2)  # 2 runs of 2 tests at once
    assert [[len(b) for b in w] for w in waves] == [[2, 2], [2, 2], [2]]
    assert [g for w in waves for b in w for g in b] == groups
    assert [[len(b) for b in w] for w in plan_batches(groups, 3, 32)] == [[3], [3], [3], [1]]


@pytest.mark.parametrize(
    ("tests", "cores", "concurrency", "sizes"),
    [
        (128, 2, 256, [[32, 32, 32, 32]]),  # 256 nodes: one wave, two runs per core
        (128, 8, 256, [[16] * 8]),  # more cores, more runs, never under 16 tests
        (10, 2, 256, [[10]]),  # a small round: one run, not four runs of three
        (512, 2, 256, [[64] * 4, [64] * 4]),  # 1024 nodes: two waves of 256
        (2, 4, 256, [[2]]),
    ],
)
def test_batches_are_sized_to_the_controller_by_default(tests, cores, concurrency, sizes) -> None:
    from flows.locate import plan_batches

    groups = [(f"n{i}a", f"n{i}b") for i in range(tests)]
    waves = plan_batches(groups, concurrency, None, cores)
    assert [[len(b) for b in w] for w in waves] == sizes
    assert [g for w in waves for b in w for g in b] == groups  # each test once, in order


def _played(facts: dict[str, object] | None, outcome: str = "ok"):  # type: ignore[no-untyped-def]
    from trainmedic.core.models import PlaybookResult

    return PlaybookResult(
        playbook="nccl_pair_test.yml",
        status="successful",
        rc=0,
        hosts={"a1": outcome},
        facts={"a1": {"trainmedic_nccl_result": facts}} if facts else {},
        private_data_dir="/x",
    )


def test_pair_result_reads_the_playbook_facts() -> None:
    from flows.locate import pair_result

    group = ("a1", "a2")
    ok = pair_result(group, _played({"rc": 0, "busbw_gbps": "46.2760", "errors": []}), None)
    assert ok.ok and ok.busbw_gbps == 46.276
    broken = pair_result(
        group, _played({"rc": 1, "busbw_gbps": "", "errors": ["a2: Test NCCL failure x"]}), None
    )
    assert not broken.ok and broken.error == "rc=1: a2: Test NCCL failure x"
    hung = pair_result(group, _played({"rc": 124, "timed_out": True, "busbw_gbps": ""}), 30)
    assert not hung.ok and "timed out after 30 s" in hung.error
    mute = pair_result(group, _played({"rc": 0, "busbw_gbps": "", "errors": []}), None)
    assert not mute.ok and "bus bandwidth" in mute.error
    assert pair_result(group, _played(None, "unreachable"), None).error == "a1 unreachable"
    never = pair_result(group, _played(None, "failed"), None)
    assert "no test result" in never.error and never.undetermined and not never.ok
    assert not hung.undetermined and not broken.undetermined  # those are findings


@pytest.mark.server
def test_a_node_running_someone_elses_job_is_never_pair_tested(prefect_server, sim) -> None:
    from flows.locate import LocateRequest, locate_faulty_nodes
    from trainmedic.core.models import JobSpec

    _, scheduler = sim
    other = scheduler.submit(JobSpec(name="someone-else", nodes=2, steps=100_000))
    busy = set(other.nodes)
    wait_until(lambda: scheduler.job(other.job_id).state == "RUNNING", 30, "the job runs")

    result = locate_faulty_nodes(LocateRequest(nodes=ALL, isolate=False))
    assert set(result.not_tested) == busy and busy <= set(result.undetermined)
    assert not busy & set(result.faulty)
    table = run_artifacts(result.flow_run_id)["locate-round-1"]
    rows = json.loads(table) if isinstance(table, str) else table
    tested = {n for row in rows for n in row["pair"].split(",")}
    assert not busy & tested and tested  # the others were tested
    assert scheduler.job(other.job_id).state == "RUNNING"  # untouched
    assert not scheduler.release(f"trainmedic-locate-{result.flow_run_id[:8]}")  # released


@pytest.mark.server
def test_pair_tests_cut_off_by_an_overloaded_controller_are_retried_never_convicted(
    prefect_server, sim, monkeypatch
) -> None:
    """The first playbook run of the locate is cut off at Ansible's overall timeout (what an
    overloaded controller does: the adapter raises PlaybookTimeout, tests/flows/
    test_reliability.py shows it for real). Its nodes are undetermined and tested again: only
    the faulty node is convicted, the flow does not fail."""
    import flows.locate as locate_module
    from flows.locate import LocateRequest, locate_faulty_nodes
    from trainmedic.core.errors import PlaybookTimeout

    cluster, scheduler = sim
    cluster.inject("node003", "link")
    real = locate_module.run_playbook
    calls: list[list[str]] = []

    def overloaded_once(playbook, targets, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(list(targets))
        if len(calls) == 1:
            raise PlaybookTimeout(f"{playbook}: timed out after 130 s")
        return real(playbook, targets, *args, **kwargs)

    monkeypatch.setattr(locate_module, "run_playbook", overloaded_once)
    result = locate_faulty_nodes(LocateRequest(nodes=HALF, seed=1, tests_per_run=1))
    assert result.faulty == ["node003"]
    assert result.undetermined == [] and result.slow == []
    assert len(calls) > 2  # the cut-off batch was run again
    assert drained(scheduler) == {}
