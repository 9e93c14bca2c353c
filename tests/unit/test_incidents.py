"""trainmedic.decisions.incidents: which failures are one storm, and when a switch is the
suspect rather than its nodes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from trainmedic.core.models import JobInfo, JobSpec, JobState, NodePlace
from trainmedic.decisions.incidents import (
    gather_incident,
    overlapping,
    storm_in_progress,
    suspected_switches,
)
from trainmedic.state.records import Incident

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
# 16 nodes, 4 per leaf switch: node01-04 leaf1, node05-08 leaf2, ...
TOPOLOGY = {
    f"node{i:02d}": NodePlace(rack=f"rack{(i - 1) // 4 + 1}", switch=f"leaf{(i - 1) // 4 + 1}")
    for i in range(1, 17)
}


def job(job_id: str, nodes: list[str], ended_s: float | None = 0.0) -> JobInfo:
    return JobInfo(
        job_id=job_id,
        name=f"j{job_id}",
        state=JobState.FAILED if ended_s is not None else JobState.RUNNING,
        nodes=tuple(nodes),
        spec=JobSpec(name=f"j{job_id}", nodes=len(nodes)),
        submitted_at=T0 - timedelta(hours=1),
        ended_at=None if ended_s is None else T0 + timedelta(seconds=ended_s),
        log_dir="/tmp/logs",
        checkpoint_dir="/tmp/ckpt",
        heartbeat_path="/tmp/hb",
    )


def test_jobs_behind_one_switch_failing_together_are_one_incident() -> None:
    seed = job("10", ["node01", "node05"])
    others = [
        job("11", ["node02", "node09"], 4),  # leaf1 with the seed
        job("12", ["node10", "node13"], 8),  # leaf3 via job 11: linked through it
        job("13", ["node14"], 9),  # leaf4 via job 12
        job("14", ["node07"], 400),  # same switch as the seed, but minutes later
        job("15", ["node16"], 2),  # no shared node or switch with any member... leaf4!
    ]
    group = gather_incident(seed, others, TOPOLOGY, window_s=120)
    assert [j.job_id for j in group] == ["10", "11", "12", "13", "15"]


def test_unrelated_failures_stay_apart() -> None:
    seed = job("10", ["node01"])
    others = [job("11", ["node05"], 1), job("12", ["node09", "node10"], 2)]
    assert [j.job_id for j in gather_incident(seed, others, TOPOLOGY, 120)] == ["10"]
    assert not storm_in_progress(seed, others, TOPOLOGY, 120)
    assert storm_in_progress(seed, [*others, job("13", ["node02"], 3)], TOPOLOGY, 120)


def test_without_topology_only_shared_nodes_link_failures() -> None:
    seed = job("10", ["node01", "node02"])
    others = [job("11", ["node02", "node03"], 1), job("12", ["node04"], 1)]
    assert [j.job_id for j in gather_incident(seed, others, {}, 120)] == ["10", "11"]


def test_a_running_job_is_never_gathered() -> None:
    seed = job("10", ["node01"])
    assert [j.job_id for j in gather_incident(seed, [job("11", ["node01"], None)], {}, 120)] == [
        "10"
    ]


def incident(nodes: list[str], decided: bool) -> Incident:
    return Incident(
        incident_id="10-abc",
        leader="run",
        jobs=("10",),
        nodes=tuple(nodes),
        opened_at=T0,
        decided_at=T0 if decided else None,
    )


def test_a_resubmission_waits_for_an_undecided_incident_on_its_switch() -> None:
    mine = job("20", ["node03"])
    assert overlapping(mine, [incident(["node01"], decided=False)], TOPOLOGY)
    assert not overlapping(mine, [incident(["node01"], decided=True)], TOPOLOGY)
    assert not overlapping(mine, [incident(["node09"], decided=False)], TOPOLOGY)


def test_every_tested_node_behind_a_switch_convicted_makes_it_the_suspect() -> None:
    tested = ["node01", "node02", "node03", "node05", "node06"]
    convicted = ["node01", "node02", "node03"]
    assert suspected_switches(convicted, tested, TOPOLOGY) == {
        "leaf1": ["node01", "node02", "node03"]
    }


def test_a_passing_node_or_too_few_nodes_clear_the_switch() -> None:
    # A node behind leaf1 passed: the switch works; these are node faults.
    assert (
        suspected_switches(
            ["node01", "node02", "node03"], ["node01", "node02", "node03", "node04"], TOPOLOGY
        )
        == {}
    )
    # Two broken nodes in one rack happen: no switch verdict on two.
    assert suspected_switches(["node01", "node02"], ["node01", "node02"], TOPOLOGY) == {}
    # Three tested of a 16-node switch is too small a share to blame it.
    big = {f"n{i:02d}": NodePlace(switch="leafA") for i in range(16)}
    assert suspected_switches(["n00", "n01", "n02"], ["n00", "n01", "n02"], big) == {}
    assert suspected_switches(["n00", "n01"], ["n00", "n01"], big, min_nodes=2, min_share=0.1)
