"""The fleet report read from a real triage on the simulated cluster: the failed job and its
resubmission are one training run, the failure's category and the drain are counted, and the
artifact shows the pictures drawn from the jobs' own loss curves and step lines."""

from __future__ import annotations

import base64
import re

import pytest
from support.artifacts import run_artifacts
from support.waits import wait_finished, wait_step

from trainmedic.core.models import JobSpec

pytestmark = pytest.mark.server


def test_the_report_reads_temperatures_and_survives_without_them(
    prefect_server, sim, monkeypatch
) -> None:
    # Before the CLI test: the CLI runs the flow in-process, and Prefect's console log handler
    # keeps that test's captured stdout after it (see test_flow_breaker.py).
    import threading

    from support.ports import free_port

    from flows.report import FleetReportRequest, fleet_report_flow
    from trainmedic.core.settings import get_settings
    from trainmedic.sim.exporter import make_server

    cluster, _ = sim
    # Racks of 4, as the inventory declares them (trainmedic_rack): rack02 is node005..node008.
    cluster.create(8, nodes_per_switch=4, inventory_dir=get_settings().inventory)
    cluster.inject("node006", "overheat", gpu=1)
    server = make_server(cluster, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        monkeypatch.setenv("TRAINMEDIC_TELEMETRY_URL", url)
        get_settings.cache_clear()
        result = fleet_report_flow(FleetReportRequest(since_h=1))
    finally:
        server.shutdown()
    report = result.report
    assert report.temperature_kind == "at report time"
    rack02 = next(r for r in report.racks if r.rack == "rack02")  # node005..node008
    assert rack02.temperature_c == 96 and rack02.temperatures["node006"] == 96
    assert {r.temperature_c for r in report.racks if r.rack != "rack02"} == {44}
    assert "temperature-by-rack.png" in result.plots

    # A Prometheus server that does not answer: the report, without temperatures, says so.
    monkeypatch.setenv("TRAINMEDIC_TELEMETRY_QUERY_URL", f"http://127.0.0.1:{free_port()}")
    get_settings.cache_clear()
    try:
        result = fleet_report_flow(FleetReportRequest(since_h=1))
    finally:
        get_settings.cache_clear()
    assert result.report.temperature_kind == "telemetry unreachable"
    assert all(r.temperature_c is None for r in result.report.racks)
    assert "temperature-by-rack.png" not in result.plots


def test_a_triaged_failure_shows_in_the_fleet_report(prefect_server, sim, capsys, tmp_path) -> None:
    from flows.report import FleetReportRequest, fleet_report_flow
    from flows.triage import TriageRequest, triage
    from trainmedic.cli.main import main

    cluster, scheduler = sim
    # ~95 steps past the last checkpoint (0.05 s each, 8 GPUs): ~0.01 GPU-hour lost whatever
    # the triage takes; 5 steps (and a quick triage) once rounded to a loss of 0.00.
    job = scheduler.submit(JobSpec(name="fleet", nodes=2, steps=100_000, checkpoint_every=100))
    wait_step(job, 195)
    cluster.inject(job.nodes[1], "ecc")
    failed = wait_finished(scheduler, job.job_id)
    result = triage(TriageRequest(job_id=failed.job_id))
    new = scheduler.job(result.new_job_id)
    wait_step(new, result.checkpoint_step + 10)
    scheduler.cancel(new.job_id, "end of the test")

    state = fleet_report_flow(FleetReportRequest(since_h=1), return_state=True)
    result = state.result()
    report = result.report
    (run,) = report.runs
    assert run.run == failed.job_id and run.attempts == 2 and run.restarts == 1
    assert run.steps_lost > 0 and 0 < run.ettr < 1
    (ecc,) = report.categories
    assert ecc.category == "ECCError" and ecc.failures == 1 and ecc.gpu_hours_lost > 0
    assert [(n.node, n.drains) for n in report.nodes] == [(failed.nodes[1], 1)]
    assert sum(r.drains for r in report.racks) == 1 and report.racks[0].rack == "rack01"
    # No telemetry endpoint here: no temperature picture; the incident drawn from the failed
    # job's and its resubmission's own steps (a curve without points draws nothing).
    assert result.plots == ["gpu-hours-by-category.png", f"incident-{failed.job_id}.png"]
    assert result.plot_files == []
    fleet_report = str(run_artifacts(state.state_details.flow_run_id)["fleet-report"])
    images = dict(re.findall(r"!\[([\w.-]+)\]\(data:image/png;base64,([^)]+)\)", fleet_report))
    assert list(images) == result.plots
    assert all(base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n") for data in images.values())

    capsys.readouterr()
    assert main(["report", "--since", "1h"]) == 0
    assert "ECCError | 1 |" in capsys.readouterr().out
    assert main(["report", "--since", "yesterday"]) == 2

    assert main(["report", "--since", "1h", "--plots", str(tmp_path / "plots")]) == 0
    printed = capsys.readouterr().out
    written = sorted((tmp_path / "plots").iterdir())
    assert [p.name for p in written] == sorted(result.plots)
    assert all(str(p) in printed and p.read_bytes()[:4] == b"\x89PNG" for p in written)
    (tmp_path / "file").write_text("")
    assert main(["report", "--plots", str(tmp_path / "file")]) == 2
    assert "plots=" in capsys.readouterr().err
