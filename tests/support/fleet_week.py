"""A scripted week of failures with known answers, for the fleet report's tests and
bench/fleet_week.py: the attempts of two training runs, trainmedic's drains, each node's
hottest GPU and the steps around each failure, drawn from the simulator's own models (its
loss curve, its GPU temperatures, its 4x slower steps on a hot GPU)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from trainmedic.reports.fleet import FAILED_STATES, Attempt
from trainmedic.reports.plots import IncidentCurve, StepPoint
from trainmedic.sim.hardware import gpu_temperature
from trainmedic.sim.job import SLOW_FACTOR, loss_at

T0 = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
UNTIL = T0 + timedelta(days=7)
NODES = [f"node{i:03d}" for i in range(1, 17)]
GPUS_PER_NODE = 4
HOT_NODE = "node011"  # overheated on Thursday: its GPU throttled, run 200 slowed and hung


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def attempt(  # type: ignore[no-untyped-def]
    job, start_h, end_h, state, start_step, end_step, category=None, run="100", gpus=64, name="gpt"
):
    return Attempt(
        job_id=job,
        run=run,
        name=name,
        gpus=gpus,
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

# A 32-GPU run over the rest of the week: a GPU fallen off the bus after 12 h (resumed 100
# steps back 15 min later); then the hot node's GPU throttles (its last 30 steps 4x slower, as
# the simulator's do) and the job hangs until its time limit after 48 h (resumed 40 steps back
# 30 min later); still training at the week's end.
LLAMA = [
    attempt("200", 40, 52, "FAILED", 0, 1200, "GPUFallenOff", run="200", gpus=32, name="llama"),
    attempt("201", 52.25, 100, "TIMEOUT", 1100, 5300, "Hang", run="200", gpus=32, name="llama"),
    attempt("202", 100.5, None, "RUNNING", 5260, 11900, run="200", gpus=32, name="llama"),
]

FLEET_WEEK = WEEK + LLAMA

# trainmedic's drains: node007 three times (a lemon), node003 and the hot node once.
DRAINS = [
    ("node007", at(10)),
    ("node003", at(20.5)),
    ("node007", at(52)),
    ("node011", at(100)),
    ("node007", at(130)),
]

# repair-node's repairs: node007's ECC error reset (back after burn-in), its lost GPU
# rebooted, node003 rebooted after a failed pair test. Kept out for a technician: node007 (a
# lemon after its third drain) and the hot node (cooling is not a software repair).
REPAIRS = [("node007", at(10.5)), ("node003", at(21)), ("node007", at(52.5))]
INSPECTION = ["node007", "node011"]


def hottest_gpus() -> dict[str, float]:
    """Each node's hottest GPU as the simulated nodes report it: the hot node at 96 C."""
    return {
        node: float(max(gpu_temperature(g, hot=node == HOT_NODE) for g in range(GPUS_PER_NODE)))
        for node in NODES
    }


def _points(item: Attempt, low: int, high: int, slow_from: int | None = None) -> list[StepPoint]:
    """The attempt's steps in ``low..high``: its mean step time (the simulator's 4x on a hot
    GPU from ``slow_from``) and the simulator's loss at each step."""
    end = item.ended_at or UNTIL
    reached = item.end_step if item.end_step is not None else item.start_step
    steps = max(reached - item.start_step, 1)
    slow_steps = 0 if slow_from is None else max(reached - slow_from, 0)
    # wall = fast * (steps - slow) + SLOW_FACTOR * fast * slow
    fast = (end - item.submitted_at).total_seconds() / (steps + (SLOW_FACTOR - 1) * slow_steps)
    slow = slow_from if slow_from is not None else reached + 1
    return [
        StepPoint(
            step=step,
            seconds=round(fast * (SLOW_FACTOR if step >= slow else 1), 3),
            loss=round(loss_at(step, None), 6),
        )
        for step in range(max(low, item.start_step + 1), min(high, reached) + 1)
    ]


def incident_curves(attempts: list[Attempt], span: int = 60) -> list[IncidentCurve]:
    """Around each failed attempt: its last ``span`` steps and its resubmission's first."""
    curves = []
    for index, item in enumerate(attempts):
        if item.state not in FAILED_STATES or item.end_step is None:
            continue
        following = attempts[index + 1] if index + 1 < len(attempts) else None
        if following is not None and following.run != item.run:
            following = None
        slow_from = item.end_step - 30 if item.category == "Hang" else None
        after = []
        if following is not None:
            after = _points(following, following.start_step, following.start_step + span)
        curves.append(
            IncidentCurve(
                job_id=item.job_id,
                category=item.category or "undiagnosed",
                failed_step=item.end_step,
                resumed_from=following.start_step if following else None,
                before=_points(item, item.end_step - span, item.end_step, slow_from),
                after=after,
            )
        )
    return curves
