"""A storm on a real Prefect server, real ansible-runner and the simulated cluster: a leaf
switch dies under four jobs, their events (and replays) start eight triage runs at once. One
run handles them as one incident; every job is resubmitted exactly once, none on a node behind
the dead switch; the switch's nodes are held and on-call paged, not drained one by one."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.waits import server_events, wait_finished, wait_step, wait_until

from trainmedic.core.models import JobSpec, JobState, NodeState

pytestmark = pytest.mark.server


@pytest.fixture
def fabric(tm_home) -> Iterator[tuple[object, object]]:  # type: ignore[no-untyped-def]
    """16 one-GPU nodes, 4 behind each leaf switch (leaf01: node001-004, ...)."""
    from trainmedic.adapters.scheduler.sim import SimScheduler
    from trainmedic.sim.cluster import SimCluster

    cluster = SimCluster(tm_home.sim_home)
    cluster.create(16, gpus_per_node=1, nodes_per_switch=4, inventory_dir=tm_home.inventory)
    scheduler = SimScheduler(tm_home.sim_home)
    yield cluster, scheduler
    for job in scheduler.jobs():
        if not job.state.finished:
            scheduler.cancel(job.job_id, "test teardown")


def test_a_dead_leaf_switch_is_one_incident_held_and_paged(prefect_server, fabric) -> None:
    from flows.triage import TriageRequest, triage
    from trainmedic.adapters.server_state import ServerState
    from trainmedic.core.settings import get_settings

    cluster, scheduler = fabric
    everything = [n.name for n in scheduler.nodes()]
    # Each job spans leaf02 and leaf03: (node005, node009), (node006, node010), ...
    jobs = []
    for i in range(4):
        pair = {f"node{5 + i:03d}", f"node{9 + i:03d}"}
        spec = JobSpec(
            name=f"storm{i}",
            nodes=2,
            gpus_per_node=1,
            steps=100_000,
            checkpoint_every=10,
            exclude=tuple(sorted(set(everything) - pair)),
        )
        jobs.append(scheduler.submit(spec))
    assert all(set(j.nodes) & set(cluster.behind("leaf02")) for j in jobs)
    for job in jobs:
        wait_step(job, 12)
    dead = cluster.fail_switch("leaf02")
    failed = [wait_finished(scheduler, j.job_id) for j in jobs]
    assert all(j.state is JobState.FAILED for j in failed)

    # Two events per job (the scheduler's and a re-detection), all at once.
    requests = [TriageRequest(job_id=j.job_id, event="job.failed") for j in failed] * 2
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        results = list(pool.map(triage, requests))

    leaders = [r for r in results if r.incident_jobs]
    assert len(leaders) == 1, [r.not_handled for r in results]
    assert sorted(leaders[0].incident_jobs) == sorted(j.job_id for j in failed)
    others = [r for r in results if r is not leaders[0]]
    assert all(r.not_handled and r.new_job_id is None and r.drained == [] for r in others)

    resubmitted = [j for j in scheduler.jobs() if j.resubmission_of]
    by_origin = {
        j.job_id: [r for r in resubmitted if r.resubmission_of == j.job_id] for j in failed
    }
    assert all(len(copies) == 1 for copies in by_origin.values()), by_origin
    placed = {n for r in resubmitted for n in r.nodes}
    assert not placed & set(dead), "a resubmission was placed behind the dead switch"

    # The switch is the suspect: its nodes held (not drained), on-call paged with its name.
    states = {n.name: n.state for n in scheduler.nodes()}
    assert not [n for n in dead if states[n] is NodeState.DRAINED]
    (incident,) = [i for i in ServerState(get_settings().cluster).incidents() if len(i.jobs) > 1]
    assert incident.suspected_switches == ("leaf02",) and incident.closed_at is not None
    pages = wait_until(
        lambda: [
            e
            for e in server_events("trainmedic.run.*")
            if e["event"] == "trainmedic.page" and incident.incident_id in e["payload"]["summary"]
        ],
        30,
        "the page about the suspected switch",
    )
    assert "leaf switch leaf02 suspected" in pages[-1]["payload"]["summary"]
    assert "trainmedic release trainmedic-switch-leaf02" in pages[-1]["payload"]["answer"]
    # A new job is not placed behind the dead switch either (the hold).
    later = scheduler.submit(JobSpec(name="later", nodes=4, gpus_per_node=1, steps=10))
    assert not set(later.nodes) & set(dead)


def test_a_claim_is_taken_up_by_its_own_retry_and_refused_to_another_run(
    prefect_server, fabric
) -> None:
    """A claim the server cut short is retried: the retry finds the run's own record and takes
    it up (not 'handled by another run', which would leave the job's only event unanswered);
    another run finds the job taken."""
    from prefect import flow

    from flows.incident import claim_incident

    _, scheduler = fabric
    job = scheduler.submit(JobSpec(name="claimed", nodes=1, gpus_per_node=1, steps=100_000))

    @flow
    def claim_elsewhere():  # type: ignore[no-untyped-def]
        return claim_incident.fn(job, manual=False, dry_run=False)

    @flow
    def claim_twice() -> tuple:
        first = claim_incident.fn(job, manual=False, dry_run=False)
        retried = claim_incident.fn(job, manual=False, dry_run=False)
        # Another run (a subflow: its own run id) while this one is still live.
        return first, retried, claim_elsewhere()

    first, retried, other = claim_twice()
    assert first.incident is not None and first.handled_by is None
    assert retried.incident == first.incident and [j.job_id for j in retried.jobs] == [job.job_id]
    assert other.incident is None and other.handled_by == first.incident
    # Once the run has ended without closing its incident, the job is free to claim again.
    assert claim_elsewhere().incident is not None


def test_a_duplicate_of_a_job_another_run_has_ends_without_waiting_for_its_lock(
    prefect_server, fabric
) -> None:
    """The first run holds the job's lock for its whole remediation; a duplicate event's run
    used to wait for it, holding a worker slot (in a burst, most slots). Finding the job in
    the live run's incident, it ends at once as a duplicate, naming that run."""
    import contextvars
    import threading

    from prefect import flow

    from flows.incident import claim_incident
    from flows.tasks import job_lock
    from flows.triage import TriageRequest, TriageResult, triage

    _, scheduler = fabric
    job = scheduler.submit(JobSpec(name="dup", nodes=1, gpus_per_node=1, steps=100_000))

    @flow
    def first_run() -> tuple[str, TriageResult | None]:
        claim = claim_incident.fn(job, manual=False, dry_run=False)
        box: dict[str, TriageResult] = {}
        with job_lock(job.job_id):  # remediating
            context = contextvars.copy_context()
            request = TriageRequest(job_id=job.job_id, event="job.failed")
            duplicate = threading.Thread(
                target=lambda: box.update(result=context.run(triage, request)), daemon=True
            )
            duplicate.start()
            duplicate.join(timeout=90)
        assert claim.incident is not None
        return claim.incident.leader, box.get("result")

    leader, result = first_run()
    assert result is not None, "the duplicate waited for the job's lock"
    assert result.not_handled is not None and result.not_handled.startswith("duplicate")
    assert f"handled by run {leader}" in result.not_handled
    assert result.new_job_id is None and not result.drained


def _crash_dataloaders(scheduler, count: int) -> list:  # type: ignore[no-untyped-def]
    """``count`` one-node jobs behind leaf01 whose dataloader workers are killed: an incident
    whose only destructive actions are its resubmissions (num_workers=0, no drain)."""
    leaf01 = ("node001", "node002", "node003", "node004")
    everything = [n.name for n in scheduler.nodes()]
    jobs = [
        scheduler.submit(
            JobSpec(
                name=f"loader{i}",
                nodes=1,
                gpus_per_node=1,
                steps=100_000,
                checkpoint_every=5,
                num_workers=2,
                exclude=tuple(n for n in everything if n not in leaf01),
            )
        )
        for i in range(count)
    ]
    for job in jobs:
        wait_step(job, 7)
    for job in jobs:
        scheduler.inject_job_fault(job.job_id, "dataloader")
    return [wait_finished(scheduler, j.job_id) for j in jobs]


@pytest.fixture
def guard_holds(monkeypatch) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """What happened under the cluster's guard lock, in order: ("hold", ""), each recorded
    action ("record", kind) and ("release", ""). The real lock and records, only watched."""
    import contextlib

    from trainmedic.adapters.server_state import ServerState

    seen: list[tuple[str, str]] = []
    real_lock, real_record = ServerState.lock, ServerState.record_action

    @contextlib.contextmanager
    def lock(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        with real_lock(self, *args, **kwargs):
            seen.append(("hold", ""))
            try:
                yield
            finally:
                seen.append(("release", ""))

    def record_action(self, entry) -> None:  # type: ignore[no-untyped-def]
        real_record(self, entry)
        seen.append(("record", str(entry.kind)))

    monkeypatch.setattr(ServerState, "lock", lock)
    monkeypatch.setattr(ServerState, "record_action", record_action)
    return seen


def test_an_incidents_jobs_are_resubmitted_under_one_hold_of_the_guard(
    prefect_server, fabric, guard_holds
) -> None:
    """A storm's resubmissions used to queue on the cluster's guard lock one by one (~0.6 s
    each on a busy server): an incident's are checked against the breaker and recorded under
    one hold."""
    from flows.triage import TriageRequest, triage

    _, scheduler = fabric
    failed = _crash_dataloaders(scheduler, 3)
    result = triage(TriageRequest(job_id=failed[0].job_id, event="job.failed"))
    assert sorted(result.incident_jobs) == sorted(j.job_id for j in failed)
    copies = [j for j in scheduler.jobs() if j.resubmission_of]
    assert sorted(j.resubmission_of for j in copies) == sorted(j.job_id for j in failed)
    holds = " ".join(what if what != "record" else kind for what, kind in guard_holds)
    assert "hold resubmit resubmit resubmit release" in holds, holds


def test_the_breaker_lets_an_incident_resubmit_as_many_as_it_has_room_for(
    prefect_server, fabric, monkeypatch
) -> None:
    """Room for two destructive actions, an incident of three jobs: two resubmitted and
    recorded, the third refused, on-call paged, the run failed with why."""
    from flows.tasks import breaker_status
    from flows.triage import TriageRequest, triage
    from trainmedic.core.errors import PolicyRefused
    from trainmedic.core.settings import get_settings

    monkeypatch.setenv("TRAINMEDIC_BREAKER_LIMIT", "2")
    get_settings.cache_clear()
    _, scheduler = fabric
    failed = _crash_dataloaders(scheduler, 3)
    with pytest.raises(PolicyRefused, match="circuit breaker OPEN"):
        triage(TriageRequest(job_id=failed[0].job_id, event="job.failed"))
    resubmitted = sorted(j.resubmission_of for j in scheduler.jobs() if j.resubmission_of)
    assert len(resubmitted) == 2
    state = breaker_status()
    assert state.open and state.count == 2
    (refused,) = {j.job_id for j in failed} - set(resubmitted)
    # (The server is shared with earlier tests: their pages are there too.)
    wait_until(
        lambda: [
            e
            for e in server_events("trainmedic.run.*")
            if e["event"] == "trainmedic.page"
            and e["payload"]["category"] == "circuit breaker open"
            and f"resubmit job {refused} refused" in e["payload"]["summary"]
        ],
        30,
        "the page about the refused resubmission",
    )
