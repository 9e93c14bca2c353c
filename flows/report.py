"""Runbook `fleet-report` (scheduled, and `trainmedic report`): the training time the
cluster loses, and where, as a Prefect artifact: ETTR per training run, GPU-hours lost per
failure category, drains per node and the lemons (trainmedic.reports.fleet).

Its inputs are what trainmedic already keeps: the scheduler's jobs and their resubmission
chains, each job's last heartbeat step, triage's diagnoses, and the drains recorded on the
Prefect server (a week of them).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel, ConfigDict, Field

from flows.tasks import server_state
from flows.verify import heartbeat_step
from trainmedic.adapters.scheduler import get_scheduler
from trainmedic.core.models import JobInfo
from trainmedic.core.settings import get_settings
from trainmedic.decisions.attempts import resubmission_chain
from trainmedic.reports.fleet import Attempt, FleetReport, fleet_markdown, fleet_report
from trainmedic.state import ActionKind, Ledgers


class FleetReportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since_h: float = Field(default=168, gt=0, le=24 * 365, description="hours back from now")


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


@flow(name="fleet-report", log_prints=True, persist_result=True, result_serializer="json")
def fleet_report_flow(request: FleetReportRequest) -> FleetReport:
    settings = get_settings()
    until = datetime.now(UTC)
    since = until - timedelta(hours=request.since_h)
    jobs = [j for j in get_scheduler().jobs() if j.nodes]  # never started: no GPU time
    drains = [(e.target, e.at) for e in server_state().actions() if e.kind is ActionKind.drain]
    report = fleet_report(
        attempts_of(jobs, Ledgers(settings.home).diagnoses.categories()),
        drains,
        since=since,
        until=until,
        lemon_drains=settings.lemon_drains,
        lemon_window=timedelta(days=settings.lemon_window_days),
    )
    create_markdown_artifact(
        key="fleet-report", markdown=fleet_markdown(report), description="Fleet report"
    )
    get_run_logger().info(
        "fleet: ETTR %s over %d runs, lemons %s", report.ettr, len(report.runs), report.lemons
    )
    return report
