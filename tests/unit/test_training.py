"""Where a loss spike began, and whether the curve shows one at all (pure)."""

from __future__ import annotations

import math

from trainmedic.decisions.training import LossRecord, at_step, spike_start


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
