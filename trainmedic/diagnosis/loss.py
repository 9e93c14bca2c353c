"""Loss curves: pull loss values out of training lines and find spikes that do not recover."""

from __future__ import annotations

import bisect
import re
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = ["LossPoint", "LossSpike", "extract_losses", "find_loss_spike"]

# Megatron "lm loss: 6.4E+00", HF "{'loss': 3.55", tqdm "loss=2.31", "train_loss: 1.2".
# "loss scale:", "lm loss value:" (validation) and "lm loss PPL:" do not match: the value
# must follow ":" or "=" directly.
_LOSS_RE = re.compile(rb"loss['\"]?\s*[:=]\s*['\"]?(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")
_HELD_OUT_PREFIXES = (b"eval_", b"val_", b"valid_", b"validation ", b"test_", b"eval ", b"val ")

SPIKE_RATIO = 1.5  # a spike is at least 1.5x the running median...
SPIKE_MIN_ABS = 0.3  # ...and at least 0.3 nats above it (tiny losses jitter by large ratios)
RECOVERED_MARGIN = 0.05  # back within 5% of the pre-spike median = recovered
WINDOW = 50
SETTLE_POINTS = 5


@dataclass(frozen=True)
class LossPoint:
    value: float
    line: int


@dataclass(frozen=True)
class LossSpike:
    index: int
    line: int
    baseline: float
    peak: float
    settled: float

    def describe(self) -> str:
        return (
            f"loss jumped from a running median of {self.baseline:.4g} to {self.peak:.4g} "
            f"(x{self.peak / self.baseline:.1f}) and stayed near {self.settled:.4g}"
        )


def extract_losses(data: bytes, first_line: int, limit: int | None = None) -> Iterator[LossPoint]:
    """Training-loss values in ``data`` (whole lines), with 1-based line numbers."""
    line = first_line
    position = 0
    found = 0
    for match in _LOSS_RE.finditer(data):
        start = match.start()
        prefix = data[max(0, start - 11) : start].lower()
        if prefix.endswith(_HELD_OUT_PREFIXES):
            continue
        line += data.count(b"\n", position, start)
        position = start
        try:
            value = float(match.group(1))
        except ValueError:
            continue
        yield LossPoint(value, line)
        found += 1
        if limit is not None and found >= limit:
            return


def find_loss_spike(points: Sequence[LossPoint]) -> LossSpike | None:
    """The first jump far above the running median that is still elevated at the end."""
    if len(points) < 2:
        return None
    window: deque[float] = deque()
    ordered: list[float] = []
    values = [p.value for p in points]
    for index, value in enumerate(values):
        if ordered:
            baseline = _median(ordered)
            if (
                baseline > 0
                and value >= baseline * SPIKE_RATIO
                and value - baseline >= SPIKE_MIN_ABS
            ):
                after = values[index + 1 :]
                level = _median(sorted(after[-SETTLE_POINTS:])) if after else value
                if level > baseline * (1 + RECOVERED_MARGIN):
                    return LossSpike(index, points[index].line, baseline, value, level)
        window.append(value)
        bisect.insort(ordered, value)
        if len(window) > WINDOW:
            old = window.popleft()
            del ordered[bisect.bisect_left(ordered, old)]
    return None


def _median(ordered: Sequence[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
