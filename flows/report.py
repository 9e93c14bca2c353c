"""Runbook `fleet-report` (scheduled, and `trainmedic report`): the training time the
cluster loses, and where, as a Prefect artifact: ETTR per training run, GPU-hours lost per
failure category, drains per node and the lemons (trainmedic.reports.fleet).

Its inputs are what trainmedic already keeps: the scheduler's jobs and their resubmission
chains, each job's last heartbeat step, triage's diagnoses, and the drains recorded on the
Prefect server (a week of them); per rack (as the inventory or scheduler declares it, else
``nodes_per_rack`` consecutive nodes), the GPU
temperatures (a Prometheus server's peak over the window, else one scrape at report time).
Its pictures (trainmedic.reports.plots) are embedded in the artifact's Markdown as PNG data
URIs, which the Prefect UI shows; step time and loss around each failure come from the
jobs' own ``loss.csv`` and rank 0's step lines.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, ConfigDict, Field

from flows.tasks import _transient, node_topology, read_loss_history, server_state
from flows.verify import heartbeat_step
from flows.watchdog import rank0_log
from trainmedic.adapters.scheduler import get_scheduler
from trainmedic.adapters.telemetry import fetch_gpu_telemetry, fetch_peak_temperatures
from trainmedic.core.errors import InputError, TelemetryError
from trainmedic.core.files import write_bytes_atomic
from trainmedic.core.models import JobInfo
from trainmedic.core.settings import get_settings
from trainmedic.decisions.attempts import resubmission_chain
from trainmedic.decisions.training import parse_step_times
from trainmedic.reports.fleet import (
    FAILED_STATES,
    Attempt,
    FleetReport,
    fleet_markdown,
    fleet_report,
    racks_by_position,
)
from trainmedic.reports.plots import IncidentCurve, StepPoint, fleet_plots
from trainmedic.state import ActionKind, Ledgers


class FleetReportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since_h: float = Field(default=168, gt=0, le=24 * 365, description="hours back from now")
    plots_dir: str | None = Field(
        default=None, max_length=4096, description="also write the PNGs here (on the worker)"
    )


def attempts_of(jobs: list[JobInfo], categories: dict[str, str]) -> list[Attempt]:
    """Every job as an attempt of its training run (the first job of its chain)."""
    found = []
    for job in jobs:
        root = resubmission_chain(job, jobs)[-1]
        found.append(
            Attempt(
                job_id=job.job_id,
                run=root.job_id,
                name=root.name,
                gpus=len(job.nodes) * job.spec.gpus_per_node,
                submitted_at=job.submitted_at,
                ended_at=job.ended_at,
                state=str(job.state),
                start_step=job.spec.resume_from_step or 0,
                end_step=heartbeat_step(Path(job.heartbeat_path)),
                category=categories.get(job.job_id),
            )
        )
    return found


class FleetReportResult(BaseModel):
    report: FleetReport
    plots: list[str]  # the pictures in the artifact, by file name
    plot_files: list[str]  # where they were written, with plots_dir


@task(name="write-plots", cache_policy=NO_CACHE)
def write_plots(plots: dict[str, bytes], directory: str) -> list[str]:
    """Each PNG to ``directory`` (created), written whole or not at all; their paths."""
    written = []
    for name, png in plots.items():
        path = Path(directory) / name
        write_bytes_atomic(path, png)
        written.append(str(path))
    return written


@task(
    name="fetch-temperatures",
    retries=3,
    retry_delay_seconds=[1, 2, 4],
    cache_policy=NO_CACHE,
    retry_condition_fn=_transient((TelemetryError,)),
)
def fetch_temperatures(
    nodes: list[str], since: datetime, until: datetime
) -> tuple[dict[str, float], str]:
    """Each node's hottest GPU and what that reading is: the window's peak from a Prometheus
    server, else one scrape's (at report time); none without a telemetry endpoint."""
    settings = get_settings()
    timeout_s = settings.http_timeout_s
    if settings.telemetry_query_url is not None:
        url = str(settings.telemetry_query_url)
        return fetch_peak_temperatures(url, nodes, since, until, timeout_s=timeout_s), (
            "peak over the window"
        )
    if settings.telemetry_url is None:
        return {}, "no telemetry endpoint"
    hottest: dict[str, float] = {}
    wanted = set(nodes)
    for gpu in fetch_gpu_telemetry(str(settings.telemetry_url), timeout_s=timeout_s):
        if gpu.host in wanted and gpu.temperature_c is not None:
            hottest[gpu.host] = max(hottest.get(gpu.host, gpu.temperature_c), gpu.temperature_c)
    return hottest, "at report time"


def _steps(job: JobInfo, low: int, high: int) -> list[StepPoint]:
    """The job's steps in ``low..high``: loss from loss.csv, time from rank 0's step lines."""
    try:
        history = read_loss_history.fn(job)  # read here: a missing curve is not retried
    except (OSError, InputError):
        history = []
    losses = {r.step: r.loss for r in history if low <= r.step <= high}
    times: dict[int, float] = {}
    log = rank0_log(job)
    if log is not None:
        try:
            with log.open(errors="replace") as handle:
                steps = parse_step_times(handle)
        except OSError:
            steps = []
        times = {t.step: t.seconds for t in steps if low <= t.step <= high}
    return [
        StepPoint(step=step, seconds=times.get(step), loss=losses.get(step))
        for step in sorted(losses.keys() | times.keys())
    ]


@task(name="read-incident-curves", cache_policy=NO_CACHE)
def incident_curves(report_attempts: list[Attempt], jobs: list[JobInfo]) -> list[IncidentCurve]:
    """Step time and loss around each failed attempt in the report (the newest first, at most
    ``report_max_incident_plots``): its last steps and its resubmission's first."""
    settings = get_settings()
    span = settings.report_incident_steps
    by_id = {j.job_id: j for j in jobs}
    chains: dict[str, list[Attempt]] = {}
    for attempt in sorted(report_attempts, key=lambda a: a.submitted_at):
        chains.setdefault(attempt.run, []).append(attempt)
    failed = [
        (attempt, chain[index + 1] if index + 1 < len(chain) else None)
        for chain in chains.values()
        for index, attempt in enumerate(chain)
        if attempt.state in FAILED_STATES and attempt.job_id in by_id
    ]
    failed.sort(key=lambda pair: pair[0].submitted_at, reverse=True)
    curves = []
    for attempt, following in failed[: settings.report_max_incident_plots]:
        end = attempt.end_step if attempt.end_step is not None else attempt.start_step
        after: list[StepPoint] = []
        if following is not None and following.job_id in by_id:
            start = following.start_step
            after = _steps(by_id[following.job_id], start, start + span)
        curves.append(
            IncidentCurve(
                job_id=attempt.job_id,
                category=attempt.category or "undiagnosed",
                failed_step=attempt.end_step,
                resumed_from=following.start_step if following else None,
                before=_steps(by_id[attempt.job_id], max(end - span, 0), end),
                after=after,
            )
        )
    return curves


@flow(name="fleet-report", log_prints=True, persist_result=True, result_serializer="json")
def fleet_report_flow(request: FleetReportRequest) -> FleetReportResult:
    """The report and its pictures, the `fleet-report` artifact showing both, and the PNGs
    in ``plots_dir`` when asked."""
    settings = get_settings()
    until = datetime.now(UTC)
    since = until - timedelta(hours=request.since_h)
    scheduler = get_scheduler()
    jobs = [j for j in scheduler.jobs() if j.nodes]  # never started: no GPU time
    store = server_state()
    drains = [(e.target, e.at) for e in store.actions() if e.kind is ActionKind.drain]
    nodes = [n.name for n in scheduler.nodes()]
    try:
        temperatures, kind = fetch_temperatures(nodes, since, until)
    except TelemetryError as exc:  # the report without temperatures, and saying why
        get_run_logger().warning("fleet: no temperatures: %s", exc)
        temperatures, kind = {}, "telemetry unreachable"
    attempts = attempts_of(jobs, Ledgers(settings.home).diagnoses.categories())
    report = fleet_report(
        attempts,
        drains,
        since=since,
        until=until,
        lemon_drains=settings.lemon_drains,
        lemon_window=timedelta(days=settings.lemon_window_days),
        # The racks the inventory or scheduler declares; by position for the others.
        racks={
            **racks_by_position(nodes, settings.nodes_per_rack),
            **{n: p.rack for n, p in node_topology().items() if p.rack},
        },
        temperatures=temperatures,
        temperature_kind=kind,
        repairs=[(r.node, r.at) for r in store.repairs()],
        inspection=[r.node for r in store.drain_records() if r.inspection],
    )
    shown = {r.run for r in report.runs}
    plots = fleet_plots(report, incident_curves([a for a in attempts if a.run in shown], jobs))
    create_markdown_artifact(
        key="fleet-report", markdown=fleet_markdown(report, plots), description="Fleet report"
    )
    get_run_logger().info(
        "fleet: ETTR %s over %d runs, lemons %s, %d plots",
        report.ettr,
        len(report.runs),
        report.lemons,
        len(plots),
    )
    files = write_plots(plots, request.plots_dir) if request.plots_dir else []
    return FleetReportResult(report=report, plots=list(plots), plot_files=files)
