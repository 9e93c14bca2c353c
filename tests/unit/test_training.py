"""Where a loss spike began, whether the curve shows one at all, and whether a job has
slowed down against its own history (pure)."""

from __future__ import annotations

import math
from datetime import datetime

import pytest

from trainmedic.core.errors import InputError
from trainmedic.decisions.training import (
    LossRecord,
    StepTime,
    at_step,
    parse_step_times,
    slowdown,
    spike_start,
)


def curve(losses: list[float]) -> list[LossRecord]:
    return [LossRecord(step=i * 10, batch=i * 10, loss=v) for i, v in enumerate(losses)]


FLAT = curve([2.0 - 0.001 * i for i in range(40)])
SPIKED = curve([2.0] * 20 + [9.0] * 10 + [8.5] * 10)  # jumps at step 200 and stays up


def test_a_report_on_a_flat_curve_is_not_a_spike() -> None:
    assert spike_start(FLAT, reported_step=150) is None
    assert spike_start(FLAT) is None


def test_the_spike_in_the_curve_at_or_before_the_report_is_found() -> None:
    start = spike_start(SPIKED, reported_step=290)
    assert start is not None and start.step == 200
    # A report before the curve shows anything is not proof of a spike.
    assert spike_start(SPIKED, reported_step=150) is None


def test_nan_counts_from_its_first_appearance() -> None:
    history = curve([2.0] * 10 + [math.nan] * 5)
    start = spike_start(history, reported_step=140)
    assert start is not None and start.step == 100


def test_at_step_is_the_first_record_from_that_step() -> None:
    assert at_step(FLAT, 155) == FLAT[16]
    assert at_step(FLAT, 10_000) is None


def _megatron(step: int, ms: float, second: int) -> str:
    return (
        f"[2026-12-03 17:{second // 60:02d}:{second % 60:02d},000] iteration {step:8d}/  100000 | "
        f"consumed samples: {step * 32:10d} | lm loss: 2.1E+00 | grad norm: 0.800 | "
        f"elapsed time per iteration (ms): {ms:.1f}"
    )


def test_step_times_are_read_from_megatron_lines_with_their_time() -> None:
    lines = [_megatron(7, 51.3, 5), "saved checkpoint at iteration 7", "loss scale: 1.0"]
    (only,) = parse_step_times(lines)
    assert only.step == 7 and only.seconds == pytest.approx(0.0513)
    assert only.at == datetime(2026, 12, 3, 17, 0, 5)


def test_a_job_four_times_slower_than_its_own_history_is_slow_from_where_it_began() -> None:
    times = [StepTime(step=s, seconds=0.05) for s in range(1, 101)]
    times += [StepTime(step=s, seconds=0.2) for s in range(101, 116)]
    found = slowdown(times, factor=1.5)
    assert found is not None and found.ratio == pytest.approx(4.0)
    assert found.since_step == 101 and "x4.0" in found.describe()
    # 15 slow steps of 0.2 s are 3 s of slowness: not yet the minute asked for.
    assert slowdown(times, factor=1.5, min_duration_s=60) is None
    assert slowdown(times, factor=1.5, min_duration_s=3) is not None


def test_jitter_a_long_save_or_a_short_history_is_not_a_slowdown() -> None:
    steady = [StepTime(step=s, seconds=0.05 + 0.01 * (s % 3)) for s in range(1, 101)]
    assert slowdown(steady, factor=1.5) is None
    save = [*steady[:-10], *steady[-10:-1], StepTime(step=100, seconds=30.0)]
    assert slowdown(save, factor=1.5) is None  # one long step: the median does not move
    young = [StepTime(step=s, seconds=0.05) for s in range(1, 11)]
    young += [StepTime(step=s, seconds=0.5) for s in range(11, 21)]
    assert slowdown(young, factor=1.5) is None  # no history to regress from yet
    with pytest.raises(InputError):
        slowdown(steady, factor=1.0)
