"""Pure decisions of the recovery runbooks: where a loss spike began, whether a job hangs.
No I/O beyond parsing what it is handed, no Prefect."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence

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
