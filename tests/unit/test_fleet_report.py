"""The fleet report against a scripted week with known answers (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainmedic.reports.fleet import Attempt, fleet_markdown, fleet_report

T0 = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def attempt(job, start_h, end_h, state, start_step, end_step, category=None, run="100"):  # type: ignore[no-untyped-def]
    return Attempt(
        job_id=job,
        run=run,
        name="gpt",
        gpus=64,
        submitted_at=at(start_h),
        ended_at=None if end_h is None else at(end_h),
        state=state,
        start_step=start_step,
        end_step=end_step,
        category=category,
    )


# A 64-GPU run: an ECC failure after 10 h (resumed 100 steps back, resubmitted 30 min later),
# an NCCL timeout after 10 more hours (the same), then 10 h to completion.
WEEK = [
    attempt("100", 0, 10, "FAILED", 0, 1000, "ECCError"),
    attempt("101", 10.5, 20.5, "FAILED", 900, 1900, "NCCLTimeout"),
    attempt("102", 21, 31, "COMPLETED", 1800, 2800),
]


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
    assert "| node007 | 3 | 56.0 | yes |" in text and "no runs" in text
