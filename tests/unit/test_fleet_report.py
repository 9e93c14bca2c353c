"""The fleet report against a scripted week with known answers (pure)."""

from __future__ import annotations

import pytest
from support.fleet_week import T0, WEEK, at

from trainmedic.reports.fleet import Attempt, fleet_markdown, fleet_report


def test_ettr_steps_and_gpu_hours_lost_have_the_known_answers() -> None:
    report = fleet_report(WEEK, [], since=T0, until=at(48))
    (run,) = report.runs
    # Productive: 9 h + 9 h + 10 h of 31 h wall.
    assert run.productive_h == pytest.approx(28) and run.wall_h == pytest.approx(31)
    assert run.ettr == pytest.approx(28 / 31, abs=1e-4) and report.ettr == run.ettr
    assert run.steps_lost == 200 and run.restarts == 2
    # Each failure: 1 h of lost steps + 0.5 h until the resubmission, x 64 GPUs = 96 GPU-h.
    assert {c.category: (c.failures, c.gpu_hours_lost) for c in report.categories} == {
        "ECCError": (1, 96.0),
        "NCCLTimeout": (1, 96.0),
    }
    assert run.gpu_hours_lost == pytest.approx(192)


def test_runs_are_weighted_by_their_gpus_and_a_running_one_counts_until_now() -> None:
    small = Attempt(
        job_id="200",
        run="200",
        name="small",
        gpus=8,
        submitted_at=at(0),
        ended_at=None,
        state="RUNNING",
        start_step=0,
        end_step=500,
    )
    report = fleet_report([*WEEK, small], [], since=T0, until=at(40))
    assert [r.ettr for r in report.runs][1] == 1.0
    expected = (28 * 64 + 40 * 8) / (31 * 64 + 40 * 8)
    assert report.ettr == pytest.approx(expected, abs=1e-4)


def test_lemons_and_node_figures_from_drains() -> None:
    drains = [("node007", at(h)) for h in (1, 30, 60)] + [("node003", at(2))]
    report = fleet_report([], drains, since=T0, until=at(168))
    assert report.lemons == ["node007"]
    assert [(n.node, n.drains, n.mtbf_h, n.lemon) for n in report.nodes] == [
        ("node007", 3, 56.0, True),
        ("node003", 1, 168.0, False),
    ]
    text = fleet_markdown(report)
    assert "| node007 | 3 | 56.0 | 0 | yes |" in text and "no runs" in text


def test_repairs_and_nodes_waiting_for_inspection_are_counted() -> None:
    drains = [("node007", at(h)) for h in (1, 30)]
    repairs = [("node007", at(2)), ("node007", at(-5)), ("node002", at(90))]  # one before it
    report = fleet_report(
        [], drains, since=T0, until=at(168), repairs=repairs, inspection=["node007"]
    )
    assert [(n.node, n.drains, n.repairs, n.inspection) for n in report.nodes] == [
        ("node007", 2, 1, True),
        ("node002", 0, 1, False),
    ]
    assert "| node007 | 2 | 84.0 | 1 |  | waiting |" in fleet_markdown(report)
