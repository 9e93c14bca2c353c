"""Pure decisions of the recovery runbooks: where a loss spike began, whether a job hangs,
whether it has slowed down (fail-slow). No I/O beyond parsing what it is handed, no Prefect."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime

from pydantic import BaseModel, Field

from trainmedic.core.errors import InputError
from trainmedic.diagnosis.loss import LossPoint, find_loss_spike


class LossRecord(BaseModel):
    step: int = Field(ge=0)
    batch: int = Field(ge=0)
    loss: float  # NaN allowed: that is what a NaN loss is


def parse_loss_history(lines: Iterable[str], source: str = "loss history") -> list[LossRecord]:
    """``step,batch,loss`` rows (the framework hook's format, also the sim trainer's)."""
    records = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#") or line.startswith("step"):
            continue
        parts = line.split(",")
        if len(parts) != 3:
            raise InputError(f"{source}:{number}", line, "expected step,batch,loss")
        try:
            records.append(
                LossRecord(step=int(parts[0]), batch=int(parts[1]), loss=float(parts[2]))
            )
        except ValueError as exc:
            raise InputError(
                f"{source}:{number}", line, "step,batch must be integers, loss a number"
            ) from exc
    return records


def spike_start(
    history: Sequence[LossRecord], reported_step: int | None = None
) -> LossRecord | None:
    """The first record of the spike (or of the NaNs) the loss curve shows at or before the
    reported step: what the rollback must get before. None when the curve shows none there.

    A report says when the framework *noticed*, the curve when the spike *began*; but only
    the curve proves there was one. A report on a flat curve (a misfiring hook, a replayed
    event) must not stop a healthy job and skip its data: a human decides then.
    """
    if not history:
        raise InputError("loss_history", "empty", "no loss values to locate a spike in")
    seen = [r for r in history if reported_step is None or r.step <= reported_step]
    first_nan = next((r for r in seen if math.isnan(r.loss) or math.isinf(r.loss)), None)
    finite = [r for r in seen if math.isfinite(r.loss)]
    spike = find_loss_spike([LossPoint(r.loss, i) for i, r in enumerate(finite)])
    candidates = [r for r in (first_nan, finite[spike.index] if spike else None) if r]
    return min(candidates, key=lambda r: r.step) if candidates else None


def at_step(history: Sequence[LossRecord], step: int) -> LossRecord | None:
    """The first record at or after ``step`` (where a human says the trouble began)."""
    return next((r for r in history if r.step >= step), None)


def is_hung(
    *,
    heartbeat_age_s: float | None,
    log_age_s: float | None,
    timeout_s: float,
    gpu_utilization: Collection[float] = (),
) -> bool:
    """No heartbeat and no log line for ``timeout_s``, and the GPUs idle (when known).

    A job whose GPUs are still busy is computing a long step, not hanging; a job with no
    heartbeat file yet is judged by its log alone.
    """
    ages = [a for a in (heartbeat_age_s, log_age_s) if a is not None]
    if not ages or min(ages) < timeout_s:
        return False
    return not gpu_utilization or max(gpu_utilization) < 5.0


# Megatron-LM / NeMo: "iteration      120/  100000 | ... | elapsed time per iteration (ms): 51.3"
_MEGATRON_STEP = re.compile(
    r"iteration\s+(?P<step>\d+)\s*/\s*\d+\s*\|.*?"
    r"elapsed time per iteration \(ms\):\s*(?P<ms>\d+(?:\.\d+)?)"
)
# A timestamp at the start of the line ("[2026-12-03 17:43:02,123]" or ISO "2026-12-03T17:43:02").
_STAMP = re.compile(r"^\[?(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)")


class StepTime(BaseModel):
    step: int = Field(ge=0)
    seconds: float = Field(ge=0)
    at: datetime | None = None  # when the line was written, where the line says


class Slowdown(BaseModel):
    """A job whose recent steps take ``ratio`` times its own earlier steps."""

    baseline_s: float
    recent_s: float
    ratio: float
    since_step: int
    since: datetime | None

    def describe(self) -> str:
        return (
            f"step time {self.recent_s * 1000:.0f} ms over the last steps against "
            f"{self.baseline_s * 1000:.0f} ms before (x{self.ratio:.1f}) since step "
            f"{self.since_step}"
        )


def parse_step_times(lines: Iterable[str]) -> list[StepTime]:
    """Per-step times from a training log (Megatron/NeMo's per-iteration lines)."""
    found = []
    for line in lines:
        match = _MEGATRON_STEP.search(line)
        if match is None:
            continue
        stamp = _STAMP.match(line)
        at = None
        if stamp:
            try:
                at = datetime.fromisoformat(stamp[1].replace(" ", "T"))
            except ValueError:
                at = None
        found.append(StepTime(step=int(match["step"]), seconds=float(match["ms"]) / 1000, at=at))
    return found


def slowdown(
    times: Sequence[StepTime],
    *,
    factor: float,
    recent: int = 10,
    baseline_min: int = 20,
    min_duration_s: float = 0.0,
) -> Slowdown | None:
    """The job's recent steps against its own history: slow when the median of the last
    ``recent`` steps is at least ``factor`` times the median of up to 200 steps before them
    (at least ``baseline_min`` of them: a job just started has no history to regress from),
    and the slow steps have lasted ``min_duration_s`` in all (a busy moment is not a fault).

    Medians, not means: one long step (a checkpoint save, an evaluation) is not a slowdown.
    """
    if factor <= 1:
        raise InputError("factor", factor, "must be above 1")
    if len(times) < baseline_min + recent:
        return None
    last, before = times[-recent:], times[-recent - 200 : -recent]
    baseline = statistics.median(t.seconds for t in before)
    current = statistics.median(t.seconds for t in last)
    if baseline <= 0 or current < factor * baseline:
        return None
    # Where it began: the first of the trailing run of slow steps.
    start = len(times) - 1
    while start > 0 and times[start - 1].seconds >= factor * baseline:
        start -= 1
    start = max(start, len(times) - recent - len(before))
    if sum(t.seconds for t in times[start:]) < min_duration_s:
        return None
    first = times[start]
    return Slowdown(
        baseline_s=baseline,
        recent_s=current,
        ratio=current / baseline,
        since_step=first.step,
        since=first.at,
    )
