"""Runbook `triage`: a job failed — find out why and where, act, and restart it.

load job → admitted? (not a replay, stale, foreign) → claim the incident (this job and every
failure linked to it in a storm; a job another run has ends here) → fetch every rank's logs,
node diagnostics (one playbook over all the incident's nodes) and telemetry → classify and
plan each job → one isolation decision: drain the proven origins, pair-test the rest (a dead
leaf switch is held and paged, not drained) → restart each from the newest valid checkpoint
→ verify it trains again → Markdown reports
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait
from prefect.runtime import flow_run
from pydantic import BaseModel, ConfigDict, Field

from flows.incident import (
    claim_incident,
    close_incident,
    decide_incident,
    handled_elsewhere,
    locate_incident,
    wait_for_decisions,
)
from flows.isolate import PendingIsolation, start_isolation
from flows.locate import pair_test_job_nodes
from flows.rollback import RollbackRequest, roll_back
from flows.slow import remediate_slow
from flows.tasks import (
    Resubmission,
    admit_event,
    choose_checkpoint,
    collect_node_diagnostics,
    fetch_job_logs,
    fetch_telemetry,
    job_lock,
    llm_config,
    load_job,
    resubmit_jobs,
    resubmit_record,
    server_state,
    stop_job,
    tell_human,
    verify_restart,
)
from trainmedic.adapters.scheduler import get_scheduler
from trainmedic.core.models import (
    ActionRecord,
    Checkpoint,
    Diagnosis,
    GpuTelemetry,
    JobId,
    JobInfo,
    PlaybookResult,
)
from trainmedic.core.settings import get_settings
from trainmedic.core.taxonomy import Action
from trainmedic.decisions.admission import Admission
from trainmedic.decisions.attempts import attempts_so_far, failure_categories, failure_streak
from trainmedic.decisions.corrections import apply_corrections
from trainmedic.decisions.remediation import Plan, plan_remediation
from trainmedic.diagnosis import LogSource, diagnose, site_catalogue
from trainmedic.diagnosis.freshness import split_kernel_lines
from trainmedic.reports.triage import incident_report, triage_report
from trainmedic.state import Ledgers
from trainmedic.state.records import Incident


class TriageRequest(BaseModel):
    """Parameters of a triage run (from an event, the UI form or `trainmedic triage`)."""

    model_config = ConfigDict(extra="forbid")

    job_id: JobId = Field(description="scheduler job id of the failed job")
    event: str = Field(
        default="manual",
        pattern=r"^[a-z_.]{1,40}$",
        description="what started this run, e.g. job.failed",
    )
    dry_run: bool = Field(default=False, description="diagnose and plan, change nothing")
    restart: bool = Field(default=True, description="resubmit the job when the plan says so")
    occurred: datetime | None = Field(
        default=None, description="when the event happened (a stale one starts nothing)"
    )


class TriageResult(BaseModel):
    job_id: str
    category: str
    root_cause_host: str | None
    drained: list[str]
    checkpoint_step: int | None
    new_job_id: str | None
    report_key: str
    report_id: str
    # Set when the event started no remediation: duplicate, stale or foreign, and why.
    not_handled: str | None = None
    # Set when the run left the decision to a human (paged, owner told, guard refused...).
    human_needed: str | None = None
    # Set when the job failed in a storm with others: the incident this run handled them in.
    incident_id: str | None = None
    incident_jobs: list[str] = []


@task(name="classify-failure", cache_policy=NO_CACHE)
def classify_failure(
    job: JobInfo,
    log_files: list[str],
    diagnostics: PlaybookResult | None,
    telemetry: list[GpuTelemetry],
    *,
    heartbeat_age_s: float | None,
    hang_after_s: float,
) -> Diagnosis:
    """Rank the evidence of every rank's logs, the nodes' kernel logs and the telemetry."""
    sources = [LogSource.from_path(path) for path in log_files]
    if diagnostics is not None:
        for host, facts in diagnostics.facts.items():
            found = facts.get("trainmedic_diagnostics") or {}
            # Kernel lines from before the job started are history (a node repaired since
            # keeps its old Xid lines until it reboots): context, never a cause.
            xid_lines = found.get("xid_lines", [])  # type: ignore[union-attr]
            kernel = split_kernel_lines(xid_lines, job.window_start)
            if kernel.stale:
                get_run_logger().info(
                    "%s: %d kernel line(s) from before the job started, history not a cause: %s",
                    host,
                    len(kernel.stale),
                    kernel.stale[-1][:200],
                )
            lines = [*kernel.fresh, *found.get("nvidia_smi", [])]  # type: ignore[union-attr]
            if lines:
                sources.append(LogSource.from_lines(f"{host}:kernel", lines, host=host))
    diagnosis = diagnose(
        sources,
        telemetry=telemetry,
        exit_code=job.exit_code,
        heartbeat_age_s=heartbeat_age_s,
        hang_after_s=hang_after_s,
        llm=llm_config(),
    )
    # A human corrected this failure before (the same line templates): their verdict wins.
    diagnosis = apply_corrections(
        diagnosis, sources, server_state().corrections(), site_catalogue()
    )
    get_run_logger().info(
        "diagnosis: %s on %s (confidence %.2f)",
        diagnosis.category,
        diagnosis.root_cause_host or "unknown host",
        diagnosis.confidence,
    )
    return diagnosis


def _roll_back(
    job: JobInfo, dry_run: bool
) -> tuple[ActionRecord, Checkpoint | None, JobInfo | None]:
    """The rollback runbook's steps, under this run's job lock: what it did, the checkpoint
    it resumed from and the new job (None, None when it did not act)."""
    rolled = roll_back(RollbackRequest(job_id=job.job_id, event="triage", dry_run=dry_run))
    record = ActionRecord(
        what="rollback",
        target=f"job {job.job_id}",
        changed=rolled.acted,
        outcome=(
            f"from step {rolled.checkpoint_step}, batches {rolled.skip_batches} skipped"
            if rolled.acted
            else "not rolled back (see the rollback report)"
        ),
    )
    checkpoint = None
    if rolled.acted and rolled.checkpoint_step is not None and rolled.checkpoint_path:
        checkpoint = Checkpoint(
            step=rolled.checkpoint_step, path=rolled.checkpoint_path, valid=True
        )
    new_job = get_scheduler().job(rolled.new_job_id) if rolled.new_job_id else None
    return record, checkpoint, new_job


def _tell_humans(job: JobInfo, diagnosis: Diagnosis, plan: Plan) -> list[ActionRecord]:
    """The owner's notice and on-call's page the plan asks for, as events the notification
    automation delivers."""
    evidence = "; ".join(e.text for e in diagnosis.evidence[:3])
    why = "; ".join(plan.reasons[-2:])
    told = []
    if plan.notify_owner:
        told.append(
            tell_human(
                "owner.notify",
                job_id=job.job_id,
                category=str(diagnosis.category),
                summary=f"job {job.job_id} ({job.spec.owner}) failed: {diagnosis.category}, "
                f"not retried: {why}",
                evidence=evidence,
                answer=f"fix the script, then resubmit; `trainmedic runs --job {job.job_id}`",
            )
        )
    if plan.page_oncall:
        told.append(
            tell_human(
                "page",
                job_id=job.job_id,
                category=str(diagnosis.category),
                summary=f"job {job.job_id}: {diagnosis.category} needs a human: {why}",
                evidence=evidence,
                answer=f"`trainmedic triage {job.job_id}` after checking, or "
                f"`trainmedic restart {job.job_id}`",
            )
        )
    return told


def _handled_by(job_id: str, incident: Incident) -> Admission:
    return Admission(
        admitted=False,
        kind="duplicate",
        why=f"job {job_id} is in incident {incident.incident_id}, handled by run {incident.leader}",
    )


def _not_handled(job: JobInfo, admission: Admission) -> TriageResult:
    """The event starts nothing: recorded, with why, in the run's log, report and result."""
    get_run_logger().warning("job %s: %s: %s", job.job_id, admission.kind, admission.why)
    key = f"triage-{job.job_id}"
    report_id = create_markdown_artifact(
        key=key,
        markdown=f"# Triage of job {job.job_id}: not handled ({admission.kind})\n\n"
        f"{admission.why}\n\nNothing was diagnosed, drained, stopped or resubmitted.\n",
        description=f"Triage of job {job.job_id}: {admission.kind}, nothing done",
    )
    return TriageResult(
        job_id=job.job_id,
        category="",
        root_cause_host=None,
        drained=[],
        checkpoint_step=None,
        new_job_id=None,
        report_key=key,
        report_id=str(report_id),
        not_handled=f"{admission.kind}: {admission.why}",
    )


def _fail_slow(job: JobInfo, request: TriageRequest) -> TriageResult:
    """A job that trains, slowly: no error to diagnose, the pair test finds the node."""
    outcome = remediate_slow(job, request.dry_run)
    key = f"triage-{job.job_id}"
    if outcome.not_handled:
        get_run_logger().warning("job %s: %s", job.job_id, outcome.not_handled)
    report_id = create_markdown_artifact(
        key=key,
        markdown=outcome.report
        or f"# Triage of job {job.job_id}: not handled\n\n{outcome.not_handled}\n",
        description=f"Fail-slow triage of job {job.job_id}",
    )
    return TriageResult(
        job_id=job.job_id,
        category="fail-slow",
        root_cause_host=outcome.drained[0] if len(outcome.drained) == 1 else None,
        drained=outcome.drained,
        checkpoint_step=outcome.checkpoint_step,
        new_job_id=outcome.new_job_id,
        report_key=key,
        report_id=str(report_id),
        not_handled=outcome.not_handled,
        human_needed=outcome.human_needed,
    )


def _heartbeat_age(job: JobInfo) -> float | None:
    """Seconds since the job last showed progress; None for a job that has ended."""
    if job.state.finished:
        return None
    try:
        return max(time.time() - Path(job.heartbeat_path).stat().st_mtime, 0.0)
    except OSError:
        return None


@flow(name="triage", log_prints=True, persist_result=True, result_serializer="json")
def triage(request: TriageRequest) -> TriageResult:
    # Another run already has this job in its incident: a duplicate, done at once (a human's
    # `trainmedic triage` always goes on).
    incident = None if request.event == "manual" else handled_elsewhere(request.job_id)
    if incident is not None:
        return _not_handled(load_job(request.job_id), _handled_by(request.job_id, incident))
    # Two events for one job never remediate it twice at once; the second run waits, then
    # finds the drain and the resubmission already done.
    with job_lock(request.job_id):
        return _triage(request)


def _triage(request: TriageRequest) -> TriageResult:
    job = load_job(request.job_id)
    admission = admit_event(job, request.event, request.occurred)
    if not admission.admitted:
        return _not_handled(job, admission)
    if request.event == "job.slow":
        return _fail_slow(job, request)
    # In a storm, the first run claims every failure linked to this one; the others end here.
    claim = claim_incident(job, manual=request.event == "manual", dry_run=request.dry_run)
    if claim.handled_by is not None:
        return _not_handled(job, _handled_by(job.job_id, claim.handled_by))
    assert claim.incident is not None
    results = _remediate(claim.jobs, claim.incident, request)
    return results[0]


class _Case(BaseModel):
    """One job of the incident: what it was diagnosed as and the plan for it."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    job: JobInfo
    diagnosis: Diagnosis
    plan: Plan
    diagnostics: PlaybookResult | None = None  # its own nodes' part of the incident's
    actions: list[ActionRecord] = []
    checkpoint: Checkpoint | None = None
    new_job: JobInfo | None = None


def _diagnose(
    job: JobInfo, diagnostics: PlaybookResult | None, telemetry: list[GpuTelemetry], dry_run: bool
) -> _Case:
    """Classify one job from its logs and its own nodes' evidence, and plan its remediation."""
    settings = get_settings()
    own = set(job.nodes)
    if diagnostics is not None:
        diagnostics = diagnostics.model_copy(
            update={
                "hosts": {h: o for h, o in diagnostics.hosts.items() if h in own},
                "facts": {h: f for h, f in diagnostics.facts.items() if h in own},
            }
        )
    diagnosis = classify_failure(
        job,
        fetch_job_logs(job),
        diagnostics,
        [t for t in telemetry if t.host in own],
        heartbeat_age_s=_heartbeat_age(job),
        hang_after_s=settings.hang_timeout_s,
    )
    scheduler = get_scheduler()
    history = scheduler.jobs()
    ledger = Ledgers(settings.home).diagnoses
    if not dry_run:
        ledger.record(job.job_id, str(diagnosis.category))
    categories = {**ledger.categories(), job.job_id: str(diagnosis.category)}
    plan = plan_remediation(
        diagnosis,
        job,
        attempts=attempts_so_far(job, history),
        retry_budget=settings.retry_budget,
        drained=[n.name for n in scheduler.nodes() if n.state == "DRAINED"],
        failure_streak=failure_streak(job, history),
        crash_loop_after=settings.crash_loop_after,
        streak_categories=failure_categories(job, history, categories),
        confidence_floor=settings.confidence_floor,
    )
    return _Case(job=job, diagnosis=diagnosis, plan=plan, diagnostics=diagnostics)


def _remediate(
    jobs: list[JobInfo], incident: Incident, request: TriageRequest
) -> list[TriageResult]:
    """The runbook over the incident's jobs (usually one): one node-diagnostics playbook over
    all their nodes, a diagnosis and plan per job, one isolation decision, then each job
    resubmitted. Results in the order of ``jobs``."""
    settings = get_settings()
    logger = get_run_logger()
    dry_run = request.dry_run
    seed = jobs[0]
    logger.info(
        "triage of job %s (%s): %s on %s",
        seed.job_id,
        request.event,
        seed.state,
        ",".join(seed.nodes),
    )
    nodes = sorted({n for j in jobs for n in j.nodes})
    diagnostics = collect_node_diagnostics(nodes, dry_run) if nodes else None
    # Counters as their increase since the job started: a lifetime total is history.
    telemetry = fetch_telemetry(nodes, since=min(j.window_start for j in jobs))
    cases = _at_once(lambda job: _diagnose(job, diagnostics, telemetry, dry_run), jobs)

    run_name = flow_run.get_name() or "local"
    shared: list[ActionRecord] = []
    for case in cases:
        if _restarting(case, request) and not _rolling_back(case) and not case.job.state.finished:
            # A hung job still holds its nodes: stop it before they are tested or reused.
            case.actions.append(
                stop_job(
                    case.job, f"trainmedic triage {run_name}: {case.diagnosis.category}", dry_run
                )
            )
    # One isolation decision for every proven origin of the incident.
    drains = {n: str(c.diagnosis.category) for c in cases for n in c.plan.drain}
    isolation: PendingIsolation | None = None
    if drains:
        # The scheduler holds the drained nodes out from here on: the isolation marker and
        # its evidence are collected while the jobs are resubmitted, not before.
        isolation = start_isolation(
            drains,
            runbook="triage",
            evidence="in the job logs",
            approval_timeout_s=settings.approval_timeout_s,
            job_id=seed.job_id if len(jobs) == 1 else None,
            dry_run=dry_run,
        )
        shared.extend(isolation.outcome.actions)
    exclude = sorted({n for c in cases for n in c.plan.exclude})
    to_locate = [c for c in cases if c.plan.locate]
    switches: list[str] = []
    if len(jobs) == 1 and to_locate:
        located, tested = pair_test_job_nodes(seed, dry_run=dry_run)
        shared.extend(tested)
        # Excluded from the resubmission even when a human declined the drain.
        exclude = sorted({*exclude, *located.faulty, *located.slow})
    elif to_locate:
        # No origin proven for these jobs: one pair test over all their nodes.
        found = locate_incident(
            incident,
            sorted({n for c in to_locate for n in c.job.nodes}),
            exclude=set(drains),
            dry_run=dry_run,
        )
        shared.extend(found.actions)
        switches = sorted(found.switches)
        exclude = sorted({*exclude, *found.faulty, *found.held})
    incident = decide_incident(incident, switches, dry_run)

    _at_once(lambda case: _prepare_restart(case, incident, request), cases)
    _resubmit_together(cases, exclude, request)
    if not dry_run:
        _verify_restarts(cases)
        for case in cases:
            case.actions.extend(_tell_humans(case.job, case.diagnosis, case.plan))
    if isolation is not None:
        isolation.finish()  # the marker is set (or its failure fails this run) before reporting
    if len(jobs) > 1:
        create_markdown_artifact(
            key=f"incident-{incident.incident_id}",
            markdown=incident_report(
                incident=incident,
                cases=[(c.job, c.diagnosis, c.new_job) for c in cases],
                actions=shared,
                dry_run=dry_run,
            ),
            description=f"Incident {incident.incident_id}: {len(jobs)} jobs",
        )
    close_incident(incident, dry_run)
    return [_report(case, shared, incident, request) for case in cases]


_Item = TypeVar("_Item")
_Result = TypeVar("_Result")
# An incident's jobs at once: each step waits mostly on its logs, the scheduler and the
# Prefect API (every task a few requests), and an incident of eight jobs in a row took ~2.5 s
# a job to resubmit under a burst.
MAX_AT_ONCE = 8


def _at_once(work: Callable[[_Item], _Result], items: Sequence[_Item]) -> list[_Result]:
    """``work`` on every item in threads (this run's Prefect context in each), results in
    order. Once all have ended, the first error (in item order) fails the run, as in a loop;
    unlike a loop, one job's failed restart does not leave the others unrestarted."""
    if len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(MAX_AT_ONCE, len(items))) as pool:
        futures = [pool.submit(contextvars.copy_context().run, work, item) for item in items]
        return [future.result() for future in futures]


def _restarting(case: _Case, request: TriageRequest) -> bool:
    return case.plan.restart and request.restart


def _rolling_back(case: _Case) -> bool:
    # A loss spike or NaN goes down the rollback path: an earlier checkpoint and the batches
    # through the spike skipped, once the curve shows it (the rollback stops the job itself).
    return case.plan.action is Action.rollback


def _prepare_restart(case: _Case, incident: Incident, request: TriageRequest) -> None:
    """Ready one job's restart: wait for any other incident deciding on its nodes, then roll
    it back (its own runbook path) or choose the checkpoint it restarts from."""
    if not _restarting(case, request):
        return
    if not request.dry_run:
        # A node shared with another undecided incident may be about to be drained.
        wait_for_decisions(case.job, incident)
    if _rolling_back(case):
        rolled_back, case.checkpoint, case.new_job = _roll_back(case.job, request.dry_run)
        case.actions.append(rolled_back)
        return
    case.checkpoint = choose_checkpoint(case.job)


def _resubmit_together(cases: list[_Case], exclude: list[str], request: TriageRequest) -> None:
    """The incident's jobs that restart from a checkpoint, resubmitted under one hold of the
    guard (verified afterwards, together: :func:`_verify_restarts`)."""
    restarting = [c for c in cases if _restarting(c, request) and not _rolling_back(c)]
    if not restarting:
        return
    resubmitted = resubmit_jobs(
        [
            Resubmission(job=c.job, checkpoint=c.checkpoint, changes=dict(c.plan.spec_changes))
            for c in restarting
        ],
        exclude,
        request.dry_run,
    )
    for case, done in zip(restarting, resubmitted, strict=True):
        if done is not None:
            case.new_job = done.job
            from_step = case.checkpoint.step if case.checkpoint else 0
            case.actions.append(
                resubmit_record(case.job, done, from_step, dict(case.plan.spec_changes))
            )


def _verify_restarts(cases: list[_Case]) -> None:
    """Every resubmitted job trains again. The jobs are all resubmitted first, then watched
    at once: each check waits on its own job's heartbeat (seconds, no CPU), and an incident's
    eight jobs took eight of these waits in a row. A rolled-back job is its runbook's to check."""
    watched = [c for c in cases if c.new_job is not None and not _rolling_back(c)]
    futures = [
        verify_restart.submit(c.new_job, c.checkpoint.step if c.checkpoint else 0) for c in watched
    ]
    wait(futures)
    for case, future in zip(watched, futures, strict=True):
        case.new_job, verified = future.result()  # a job that did not train again fails the run
        case.actions.append(verified)


def _report(
    case: _Case,
    shared: list[ActionRecord],
    incident: Incident,
    request: TriageRequest,
) -> TriageResult:
    job = case.job
    actions = (
        [*case.actions[:1], *shared, *case.actions[1:]]
        if _stopped(case)
        else [
            *shared,
            *case.actions,
        ]
    )
    key = f"triage-{job.job_id}"
    report_id = create_markdown_artifact(
        key=key,
        markdown=triage_report(
            job=job,
            diagnosis=case.diagnosis,
            plan=case.plan,
            actions=actions,
            checkpoint=case.checkpoint,
            new_job=case.new_job,
            diagnostics=case.diagnostics,
            dry_run=request.dry_run,
            incident=incident if len(incident.jobs) > 1 else None,
        ),
        description=f"Triage of job {job.job_id}: {case.diagnosis.category}",
    )
    return TriageResult(
        job_id=job.job_id,
        category=str(case.diagnosis.category),
        root_cause_host=case.diagnosis.root_cause_host,
        drained=[a.target for a in actions if a.what == "drain" and a.changed],
        checkpoint_step=case.checkpoint.step if case.checkpoint else None,
        new_job_id=case.new_job.job_id if case.new_job else None,
        report_key=key,
        report_id=str(report_id),
        human_needed=_human_needed(case.plan, case.new_job is not None, request),
        incident_id=incident.incident_id if len(incident.jobs) > 1 else None,
        incident_jobs=list(incident.jobs) if len(incident.jobs) > 1 else [],
    )


def _stopped(case: _Case) -> bool:
    return bool(case.actions) and case.actions[0].what == "stop job"


def _human_needed(plan: Plan, resubmitted: bool, request: TriageRequest) -> str | None:
    if request.dry_run:
        return None
    if plan.page_oncall or plan.notify_owner:
        return plan.reasons[-1] if plan.reasons else "a human decides"
    if plan.restart and request.restart and not resubmitted:
        return "the plan was to resubmit, but the job was not resubmitted"
    return None
