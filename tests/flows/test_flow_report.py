"""The fleet report read from a real triage on the simulated cluster: the failed job and its
resubmission are one training run, the failure's category and the drain are counted."""

from __future__ import annotations

import pytest
from support.waits import wait_finished, wait_step

from trainmedic.core.models import JobSpec

pytestmark = pytest.mark.server


def test_a_triaged_failure_shows_in_the_fleet_report(prefect_server, sim, capsys) -> None:
    from flows.report import FleetReportRequest, fleet_report_flow
    from flows.triage import TriageRequest, triage
    from trainmedic.cli.main import main

    cluster, scheduler = sim
    job = scheduler.submit(JobSpec(name="fleet", nodes=2, steps=100_000, checkpoint_every=20))
    wait_step(job, 45)
    cluster.inject(job.nodes[1], "ecc")
    failed = wait_finished(scheduler, job.job_id)
    result = triage(TriageRequest(job_id=failed.job_id))
    new = scheduler.job(result.new_job_id)
    wait_step(new, result.checkpoint_step + 10)
    scheduler.cancel(new.job_id, "end of the test")

    report = fleet_report_flow(FleetReportRequest(since_h=1))
    (run,) = report.runs
    assert run.run == failed.job_id and run.attempts == 2 and run.restarts == 1
    assert run.steps_lost > 0 and 0 < run.ettr < 1
    (ecc,) = report.categories
    assert ecc.category == "ECCError" and ecc.failures == 1 and ecc.gpu_hours_lost > 0
    assert [(n.node, n.drains) for n in report.nodes] == [(failed.nodes[1], 1)]

    capsys.readouterr()
    assert main(["report", "--since", "1h"]) == 0
    assert "ECCError | 1 |" in capsys.readouterr().out
    assert main(["report", "--since", "yesterday"]) == 2
