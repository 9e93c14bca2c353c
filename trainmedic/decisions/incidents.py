"""Storms: one incident, not fifty runbooks. When a leaf switch dies every job behind it fails
at once, with NCCL timeouts and no origin; run one remediation per job and each starts its
own pair test on its own nodes, the drains race the resubmissions (a job lands on a node
another run is about to drain) and the drain limits stop most of them for a human. So failures
that end close in time and share a node or a leaf switch are **one incident**: one run (the
first to claim it) diagnoses all its jobs, tests the union of their nodes once, takes one
isolation decision and only then resubmits them; every other run for those jobs ends at once.

When the nodes the pair test convicts are every tested node behind one switch (at least two),
the switch is the suspect, not the nodes: they are held out of placement and on-call is paged
with the switch, instead of draining them one by one into the blast-radius guard.

Pure: the caller reads the scheduler, the topology and the incident records (on the Prefect
server, claimed under one lock: two runs cannot both claim a job)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from trainmedic.core.models import JobInfo, JobState, NodePlace
from trainmedic.state.records import Incident

__all__ = [
    "FAILED_STATES",
    "Topology",
    "gather_incident",
    "overlapping",
    "storm_in_progress",
    "suspected_switches",
]

# A job that ended in one of these failed; CANCELLED and COMPLETED did not.
FAILED_STATES = frozenset({JobState.FAILED, JobState.NODE_FAIL, JobState.TIMEOUT})


Topology = Mapping[str, NodePlace]


def _switches(nodes: Iterable[str], topology: Topology) -> set[str]:
    return {s for n in nodes if (s := topology.get(n, NodePlace()).switch)}


def _related(a: JobInfo, b: JobInfo, topology: Topology, window_s: float) -> bool:
    """Ended within ``window_s`` of each other (0: never one incident) on a shared node or
    leaf switch."""
    if a.ended_at is None or b.ended_at is None or window_s <= 0:
        return False
    if abs((a.ended_at - b.ended_at).total_seconds()) > window_s:
        return False
    if set(a.nodes) & set(b.nodes):
        return True
    return bool(_switches(a.nodes, topology) & _switches(b.nodes, topology))


def storm_in_progress(
    seed: JobInfo, candidates: Sequence[JobInfo], topology: Topology, window_s: float
) -> bool:
    """Another failure close to ``seed`` already: wait a moment for the rest of the storm
    before claiming (a single failure is handled at once)."""
    return any(
        c.job_id != seed.job_id and _related(seed, c, topology, window_s) for c in candidates
    )


def gather_incident(
    seed: JobInfo,
    candidates: Sequence[JobInfo],
    topology: Topology,
    window_s: float,
) -> list[JobInfo]:
    """``seed`` and every candidate linked to it, directly or through another (a job that
    shares a switch with one that shares a node with the seed belongs too): the jobs of one
    incident, seed first, then by job id. ``candidates``: failed jobs not yet remediated nor
    claimed by another incident."""
    members = {seed.job_id: seed}
    frontier = [seed]
    pool = {c.job_id: c for c in candidates if c.job_id != seed.job_id}
    while frontier:
        current = frontier.pop()
        for job_id, other in list(pool.items()):
            if _related(current, other, topology, window_s):
                members[job_id] = other
                frontier.append(other)
                del pool[job_id]
    rest = sorted((j for j in members.values() if j is not seed), key=_job_key)
    return [seed, *rest]


def _job_key(job: JobInfo) -> tuple[int, str]:
    head = job.job_id.split("_")[0]
    return (int(head) if head.isdigit() else 0, job.job_id)


def overlapping(job: JobInfo, incidents: Iterable[Incident], topology: Topology) -> list[Incident]:
    """The undecided incidents whose nodes share a node or a switch with ``job``'s: its
    resubmission waits for their decision (it could otherwise land on a node about to be
    drained)."""
    mine = set(job.nodes)
    switches = _switches(job.nodes, topology)
    return [
        i
        for i in incidents
        if not i.decided and (mine & set(i.nodes) or switches & _switches(i.nodes, topology))
    ]


def suspected_switches(
    convicted: Iterable[str],
    tested: Iterable[str],
    topology: Topology,
    *,
    min_nodes: int = 3,
    min_share: float = 0.5,
) -> dict[str, list[str]]:
    """Switch -> its convicted nodes, for each switch behind which every tested node was
    convicted: at least ``min_nodes`` of them and ``min_share`` of the nodes behind it. One
    broken switch explains them better than that many broken nodes at once. A switch with a
    tested node behind it that passed is no suspect, nor one with too few tested nodes (two
    broken GPUs in one rack happen)."""
    convicted = set(convicted)
    size: dict[str, int] = {}
    for place in topology.values():
        if place.switch:
            size[place.switch] = size.get(place.switch, 0) + 1
    behind: dict[str, list[str]] = {}
    for node in sorted(set(tested)):
        switch = topology.get(node, NodePlace()).switch
        if switch:
            behind.setdefault(switch, []).append(node)
    return {
        switch: nodes
        for switch, nodes in sorted(behind.items())
        if len(nodes) >= max(min_nodes, 2)
        and len(nodes) >= min_share * size[switch]
        and all(n in convicted for n in nodes)
    }
