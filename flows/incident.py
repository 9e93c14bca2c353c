"""Triage's storm steps: which jobs this run handles (the incident it claims), holding their
nodes until the isolation decision, and the incident's one locate, which tells a dead leaf
switch from broken nodes.

    claim (under the cluster's incident lock, on the Prefect server): a job already in an
    incident another live run handles → this run ends at once; else this run takes the job and
    every failure linked to it (close in time, a shared node or leaf switch;
    trainmedic.decisions.incidents) → hold their idle nodes → ... diagnosis, isolation ...
    → record the decision, release the hold → resubmit → close.
"""

from __future__ import annotations

import re
import secrets
import time
from datetime import UTC, datetime
from uuid import UUID

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run
from pydantic import BaseModel, ConfigDict

from flows.isolate import isolate
from flows.locate import LocateRequest, locate_faulty_nodes
from flows.tasks import RETRY_WHILE_SERVER_BUSY, node_topology, server_state, tell_human
from trainmedic.adapters.scheduler import get_scheduler
from trainmedic.adapters.server_state import ACTION_RETENTION
from trainmedic.core import validate
from trainmedic.core.models import ActionRecord, JobInfo, NodePlace, NodeState
from trainmedic.core.settings import get_settings
from trainmedic.decisions.admission import event_scope
from trainmedic.decisions.incidents import (
    FAILED_STATES,
    Topology,
    gather_incident,
    overlapping,
    storm_in_progress,
    suspected_switches,
)
from trainmedic.state.records import Incident

__all__ = [
    "Claim",
    "IncidentIsolation",
    "claim_incident",
    "close_incident",
    "decide_incident",
    "locate_incident",
    "wait_for_decisions",
]

# How long the hold on an incident's nodes outlives a crashed run at most.
INCIDENT_HOLD_S = 1800
ENDED = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


class Claim(BaseModel):
    """What a triage run handles: ``jobs`` (its own first) under ``incident``; or nothing,
    when ``handled_by`` (another live run's incident) has its job already."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    incident: Incident | None = None
    jobs: list[JobInfo] = []
    handled_by: Incident | None = None


def _leader_ended(incident: Incident) -> bool:
    """Its run ended without closing it (crashed, cancelled, failed): its jobs are free."""
    if incident.closed_at is not None:
        return False
    try:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(UUID(incident.leader))
    except ValueError:  # not a flow run's id: nothing can tell it ended
        return False
    except ObjectNotFound:  # its run was deleted
        return True
    return run.state is not None and run.state.type.value in ENDED


def _candidates(jobs: list[JobInfo], incidents: list[Incident], taken: set[str]) -> list[JobInfo]:
    """Failed jobs trainmedic manages that no incident has and nobody resubmitted."""
    scope = event_scope(get_settings())
    resubmitted = {j.resubmission_of for j in jobs if j.resubmission_of}
    return [
        j
        for j in jobs
        if j.state in FAILED_STATES
        and j.ended_at is not None
        and j.managed
        and (not scope.owners or j.spec.owner in scope.owners)
        and j.job_id not in taken
        and j.job_id not in resubmitted
    ]


def handled_elsewhere(job_id: str) -> Incident | None:
    """The open incident of another live run that has this job, read without any lock: a
    duplicate event ends on it at once instead of holding a worker slot while that run works
    under the job's lock. Read-only: a stale answer only means the run waits for the lock and
    asks :func:`claim_incident` as before. (A closed incident's lock is free: the run takes
    it and finds, with the job's resubmission, why it has nothing to do.)"""
    me = str(flow_run.get_id() or "local")
    since = datetime.now(UTC) - ACTION_RETENTION
    for incident in server_state().incidents(since=since):
        if (
            job_id in incident.jobs
            and incident.leader != me
            and incident.closed_at is None
            and not _leader_ended(incident)
        ):
            return incident
    return None


@task(name="claim-incident", cache_policy=NO_CACHE, **RETRY_WHILE_SERVER_BUSY)
def claim_incident(job: JobInfo, *, manual: bool, dry_run: bool) -> Claim:
    """The jobs this run remediates. A job in an incident that another live run handles
    (or handled: a closed one, unless a human asks again) is not this run's. Idempotent: a
    retry after the server refused for a moment finds this run's own claim and takes it up
    (a run that failed on a busy server would leave its only event unanswered)."""
    settings = get_settings()
    logger = get_run_logger()
    state = server_state()
    scheduler = get_scheduler()
    topology = node_topology.fn()
    window = settings.incident_window_s
    since = datetime.now(UTC) - ACTION_RETENTION

    def live(incidents: list[Incident]) -> list[Incident]:
        return [i for i in incidents if not _leader_ended(i)]

    # A storm is arriving: give the rest of it a moment to fail before taking the lot.
    if job.ended_at is not None and settings.incident_settle_s > 0:
        others = _candidates(scheduler.jobs(), [], {job.job_id})
        if storm_in_progress(job, others, topology, window):
            logger.info(
                "other failures near job %s: waiting %.0f s for the rest of the storm",
                job.job_id,
                settings.incident_settle_s,
            )
            time.sleep(settings.incident_settle_s)
            # The run that took the storm may have taken this job meanwhile: a duplicate
            # ends here instead of queueing for the cluster's incident lock behind it.
            held = None if manual else handled_elsewhere(job.job_id)
            if held is not None:
                return Claim(handled_by=held)

    with state.incident_lock():
        incidents = live(state.incidents(since=since))
        me = str(flow_run.get_id() or "local")
        mine = [
            i for i in incidents if i.leader == me and i.closed_at is None and job.job_id in i.jobs
        ]
        others = [i for i in incidents if job.job_id in i.jobs and i not in mine]
        for incident in others if not mine else []:
            if not (manual and incident.closed_at is not None):
                return Claim(handled_by=incident)
        if mine:  # this run's own claim, from a try the server cut short
            incident = mine[0]
            group = [scheduler.job(j) for j in incident.jobs]
        else:
            # Jobs of another live or finished incident are not gathered again (a job left
            # to its owner would be told twice); only a human's triage takes one up again.
            taken = {j for i in incidents for j in i.jobs}
            group = [job]
            if job.ended_at is not None and job.state in FAILED_STATES:
                group = gather_incident(
                    job, _candidates(scheduler.jobs(), incidents, taken), topology, window
                )
            incident = Incident(
                incident_id=f"{job.job_id.replace('_', '-')}-{secrets.token_hex(3)}",
                leader=me,
                jobs=tuple(j.job_id for j in group),
                nodes=tuple(sorted({n for j in group for n in j.nodes})),
                opened_at=datetime.now(UTC),
            )
            if not dry_run:
                state.put_incident(incident)
    if len(group) > 1:
        logger.warning(
            "incident %s: %d jobs failed together (%s) on %s: one diagnosis, one isolation",
            incident.incident_id,
            len(group),
            ", ".join(incident.jobs),
            validate.compress_nodelist(incident.nodes),
        )
        if not dry_run:
            # Until the isolation decision, no job (anyone's) is placed on these nodes.
            scheduler.hold(hold_name(incident), list(incident.nodes), INCIDENT_HOLD_S)
    return Claim(incident=incident, jobs=group)


def hold_name(incident: Incident) -> str:
    return validate.hold_name(f"trainmedic-incident-{incident.incident_id}")


def switch_hold_name(switch: str) -> str:
    return validate.hold_name("trainmedic-switch-" + re.sub(r"[^a-z0-9-]", "-", switch.lower()))


class IncidentIsolation(BaseModel):
    """What the incident's locate found and what was done about it."""

    faulty: list[str] = []
    switches: dict[str, list[str]] = {}
    held: list[str] = []
    actions: list[ActionRecord] = []


def _partners(nodes: list[str], topology: Topology, count: int = 2) -> list[str]:
    """Idle nodes behind other switches than the incident's: known-good partners for the
    second round when every tested node failed the first one."""
    switches = {topology[n].switch for n in nodes if n in topology}
    idle = [
        n.name for n in get_scheduler().nodes() if n.state is NodeState.IDLE and n.name not in nodes
    ]
    picked: list[str] = []
    seen: set[str | None] = set()
    for name in idle:
        switch = topology.get(name, NodePlace()).switch
        if switch in switches or switch in seen:
            continue
        picked.append(name)
        seen.add(switch)
        if len(picked) == count:
            break
    return picked


def locate_incident(
    incident: Incident, nodes: list[str], *, exclude: set[str], dry_run: bool
) -> IncidentIsolation:
    """One pair test over the nodes of the incident's jobs that no proven origin explains,
    then one decision: every tested node behind a switch convicted → the switch is the
    suspect (its nodes held, on-call paged); the other convicted nodes are isolated."""
    settings = get_settings()
    logger = get_run_logger()
    topology = node_topology.fn()
    tested_nodes = sorted(set(nodes) - exclude)
    partners = _partners(tested_nodes, topology)
    located = locate_faulty_nodes(
        LocateRequest(
            nodes=[*tested_nodes, *partners],
            isolate=False,
            approval_timeout_s=settings.approval_timeout_s,
            dry_run=dry_run,
        )
    )
    convicted = [*located.faulty, *located.slow]
    result = IncidentIsolation(faulty=sorted(convicted))
    result.actions.append(
        ActionRecord(
            what="pair test",
            target=validate.compress_nodelist([*tested_nodes, *partners]),
            outcome=f"faulty {located.faulty or 'none'}, slow {located.slow or 'none'} "
            f"({located.rounds} rounds, {located.tests_run} tests"
            + (f"; partners {', '.join(partners)}" if partners else "")
            + ")",
        )
    )
    tested = [n for n in located.nodes if n not in located.undetermined]
    result.switches = suspected_switches(
        convicted,
        tested,
        topology,
        min_nodes=settings.switch_suspect_min_nodes,
        min_share=settings.switch_suspect_share,
    )
    behind = {n for n, p in topology.items() if p.switch in result.switches}
    for switch, found in result.switches.items():
        all_behind = sorted(n for n, p in topology.items() if p.switch == switch)
        held = (
            all_behind
            if dry_run
            else get_scheduler().hold(switch_hold_name(switch), all_behind, settings.switch_hold_s)
        )
        result.held += held
        busy = sorted(set(all_behind) - set(held))
        logger.warning(
            "switch %s suspected: every tested node behind it failed (%s); held %s",
            switch,
            ", ".join(found),
            ", ".join(held) or "none",
        )
        result.actions.append(
            ActionRecord(
                what="hold",
                target=f"switch {switch}",
                changed=bool(held) and not dry_run,
                outcome=("dry run: would hold " if dry_run else "held out of placement: ")
                + (validate.compress_nodelist(held) or "none")
                + (f" (still running jobs, not held: {', '.join(busy)})" if busy else ""),
            )
        )
        if not dry_run:
            result.actions.append(
                tell_human(
                    "page",
                    job_id=None,
                    category="NetworkError",
                    summary=f"incident {incident.incident_id}: leaf switch {switch} suspected: "
                    f"every tested node behind it failed its pair tests "
                    f"({', '.join(found)}); {len(held)} nodes held out of placement, none "
                    "drained",
                    evidence=result.actions[0].outcome,
                    answer=f"check {switch}; after the repair `trainmedic release "
                    f"{switch_hold_name(switch)}`",
                )
            )
    nodes_out = {n: "faulty in pair tests" for n in located.faulty if n not in behind}
    nodes_out |= {n: "slow in pair tests" for n in located.slow if n not in behind}
    if nodes_out:
        outcome = isolate(
            nodes_out,
            runbook="triage",
            evidence=f"in pair tests of incident {incident.incident_id}",
            approval_timeout_s=settings.approval_timeout_s,
            job_id=None,
            dry_run=dry_run,
        )
        result.actions.extend(outcome.actions)
    return result


# Idempotent (a record written again, a hold released again): retried while a storm keeps the
# server busy, as one refused write once failed the run that held an incident's jobs.
@task(name="decide-incident", cache_policy=NO_CACHE, **RETRY_WHILE_SERVER_BUSY)
def decide_incident(incident: Incident, switches: list[str], dry_run: bool) -> Incident:
    """The isolation decision is taken: record it and let placement use the nodes again."""
    decided = incident.model_copy(
        update={"decided_at": datetime.now(UTC), "suspected_switches": tuple(switches)}
    )
    # One job: no hold to release, and its record is written once more, closed (one write
    # fewer per remediation on a server that a storm keeps busy).
    if not dry_run and len(incident.jobs) > 1:
        server_state().put_incident(decided)
        get_scheduler().release(hold_name(incident))
    return decided


@task(name="close-incident", cache_policy=NO_CACHE, **RETRY_WHILE_SERVER_BUSY)
def close_incident(incident: Incident, dry_run: bool) -> Incident:
    closed = incident.model_copy(update={"closed_at": datetime.now(UTC)})
    if not dry_run:
        server_state().put_incident(closed)
    return closed


@task(name="wait-for-decisions", cache_policy=NO_CACHE)
def wait_for_decisions(job: JobInfo, own: Incident) -> list[str]:
    """Before ``job`` is resubmitted: wait for the undecided incidents that share its nodes or
    switch (a node there may be about to be drained). Returns the incidents waited for."""
    settings = get_settings()
    topology = node_topology.fn()
    state = server_state()
    deadline = time.monotonic() + settings.incident_wait_s
    waited: list[str] = []
    while True:
        pending = [
            i
            for i in overlapping(job, state.incidents(), topology)
            if i.incident_id != own.incident_id and not _leader_ended(i)
        ]
        if not pending:
            return waited
        waited = sorted({*waited, *(i.incident_id for i in pending)})
        if time.monotonic() > deadline:
            get_run_logger().warning(
                "job %s: incidents %s still undecided after %.0f s: resubmitting anyway "
                "(drained and held nodes are still avoided)",
                job.job_id,
                ", ".join(waited),
                settings.incident_wait_s,
            )
            return waited
        time.sleep(1.0)
