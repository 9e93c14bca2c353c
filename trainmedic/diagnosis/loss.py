"""Loss curves: pull loss values out of training lines and find spikes that do not recover;
and the fp16 loss scale, whose collapse (halved overflow after overflow) is a divergence too."""

from __future__ import annotations

import bisect
import re
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = [
    "GradNormSpike",
    "LossPoint",
    "LossSpike",
    "ScaleCollapse",
    "extract_grad_norms",
    "extract_loss_scales",
    "extract_losses",
    "find_grad_norm_spike",
    "find_loss_spike",
    "find_scale_collapse",
    "find_spikes",
]

# Megatron "lm loss: 6.4E+00", HF "{'loss': 3.55", tqdm "loss=2.31", "train_loss: 1.2", and
# lit-gpt / XLNet "loss 1.7019" (a space then a decimal: "loss 2 times" is no value); "Loss"
# capitalised as a word of its own, as many training loops print it ("| Loss 0.3169(0.3169) |";
# not "IDLoss=", another series: skipped after the match, so the regex keeps a one-character
# first set that re scans for fast).
# "loss scale:", "lm loss value:" (validation) and "lm loss PPL:" do not match: the value
# must follow ":" or "=" directly.
_LOSS_RE = re.compile(
    rb"[Ll]oss(?:['\"]?\s*[:=]\s*['\"]?| (?=-?\d+\.\d))"
    rb"(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)"
)
_CAPITAL_L = ord("L")
_HELD_OUT_PREFIXES = (b"eval_", b"val_", b"valid_", b"validation ", b"test_", b"eval ", b"val ")

# The dynamic loss scale as frameworks print it: DeepSpeed "Attempted loss scale: 64, reducing
# to 32", apex "reducing loss scale to 32768.0", fairseq "setting loss scale to: 0.25" and
# "loss_scale 0.500", Megatron "loss scale: 8192.0", DLLogger "PARAMETER loss_scale : 524288",
# PaddleNLP "optimizer not run, scale_before: 0.25, scale_after: 0.125", Paddle's AMP "Found inf
# or nan, current scale is: 0.0019, decrease to: 0.0019*0.5".
# The last value of a line is the scale in force after it ("loss scaler 0" is apex's index).
_SCALE_RE = re.compile(
    rb"(?:loss[ _-]?scale(?!r)|reducing to|scale_(?:before|after)|current scale is)['\"]?\s*(?:to)?"
    rb"\s*[:=]?\s*['\"]?"
    rb"(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)"
)
COLLAPSE_HALVINGS = 4  # overflow after overflow: the scale fell at least 2^4-fold...
COLLAPSE_FLOOR = 1e-3  # ...or to where fp16 gradients overflow even scaled down 1000-fold
SCALE_SETTLE_POINTS = 3  # a collapse followed by this many steady readings has recovered
FALLING_HALVINGS = 2  # a shallower fall the log ends in: a suspicion (ScaleCollapse.deep False)

# The gradient norm as trainers print it: HF "'grad_norm': 237.6", Megatron "grad norm: 0.321",
# fairseq "gnorm 0.904" / "gnorm=0.9", "gradient_norm: 1.2" (a clip threshold, "max_grad_norm",
# is a setting, not a reading: no value follows a "max_" prefix here).
_GRAD_NORM_RE = re.compile(
    rb"(?<![A-Za-z_])(?:grad(?:ient)?[ _]norm|gnorm)['\"]?\s*[:= ]\s*['\"]?"
    rb"(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)"
)
# A blow-up of the gradient norm: at least 20x its running median over at least 5 readings.
# Gradients jitter several-fold from step to step; a 20-fold jump is the instability that
# precedes a loss spike (the loss may not have moved yet where the log ends).
GRAD_SPIKE_RATIO = 20.0
GRAD_SPIKE_MIN_POINTS = 5

SPIKE_RATIO = 1.5  # a spike is at least 1.5x the running median...
SPIKE_MIN_ABS = 0.3  # ...and at least 0.3 nats above it (tiny losses jitter by large ratios)
RECOVERED_MARGIN = 0.05  # back within 5% of the pre-spike median = recovered
PASSING_SPIKE_RATIO = 2.5  # a spike that recovered is worth naming only if it was this large
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

    @property
    def recovered(self) -> bool:
        return self.settled <= self.baseline * (1 + RECOVERED_MARGIN)

    def describe(self) -> str:
        after = "came back to" if self.recovered else "stayed near"
        return (
            f"loss jumped from a running median of {self.baseline:.4g} to {self.peak:.4g} "
            f"(x{self.peak / self.baseline:.1f}) and {after} {self.settled:.4g}"
        )


def extract_losses(data: bytes, first_line: int, limit: int | None = None) -> Iterator[LossPoint]:
    """Training-loss values in ``data`` (whole lines), with 1-based line numbers: the first
    of each line (a step's line that also prints its parts, "regular_loss: 0.25, total-loss
    0.59", is one point of the curve, not a jump between two series)."""
    line = first_line
    position = 0
    found = 0
    last_line = 0
    for match in _LOSS_RE.finditer(data):
        start = match.start()
        prefix = data[max(0, start - 11) : start].lower()
        if prefix.endswith(_HELD_OUT_PREFIXES):
            continue
        if data[start] == _CAPITAL_L and start and data[start - 1 : start].isalpha():
            continue  # "IDLoss=": another series, not the training loss
        line += data.count(b"\n", position, start)
        position = start
        if line == last_line:
            continue
        try:
            value = float(match.group(1))
        except ValueError:
            continue
        last_line = line
        yield LossPoint(value, line)
        found += 1
        if limit is not None and found >= limit:
            return


def extract_grad_norms(
    data: bytes, first_line: int, limit: int | None = None
) -> Iterator[LossPoint]:
    """Gradient-norm readings in ``data`` (whole lines), one per line, with line numbers."""
    line = first_line
    position = 0
    found = 0
    last_line = 0
    for match in _GRAD_NORM_RE.finditer(data):
        line += data.count(b"\n", position, match.start())
        position = match.start()
        if line == last_line:
            continue
        last_line = line
        yield LossPoint(float(match.group(1)), line)
        found += 1
        if limit is not None and found >= limit:
            return


@dataclass(frozen=True)
class GradNormSpike:
    line: int
    baseline: float
    peak: float

    def describe(self) -> str:
        return (
            f"gradient norm jumped from a running median of {self.baseline:.4g} to "
            f"{self.peak:.4g} (x{self.peak / self.baseline:.0f}): the training is unstable"
        )


def find_grad_norm_spike(points: Sequence[LossPoint]) -> GradNormSpike | None:
    """The largest reading at least GRAD_SPIKE_RATIO times the running median of the readings
    before it (GRAD_SPIKE_MIN_POINTS of them at least)."""
    largest: GradNormSpike | None = None
    medians = _running_medians([p.value for p in points])
    for point, (baseline, seen) in zip(points, medians, strict=True):
        if seen < GRAD_SPIKE_MIN_POINTS or baseline <= 0:
            continue
        jump = point.value / baseline
        if jump >= GRAD_SPIKE_RATIO and (largest is None or jump > largest.peak / largest.baseline):
            largest = GradNormSpike(point.line, baseline, point.value)
    return largest


def find_loss_spike(points: Sequence[LossPoint]) -> LossSpike | None:
    """The first jump far above the running median that is still elevated at the end."""
    return find_spikes(points)[0]


def find_spikes(points: Sequence[LossPoint]) -> tuple[LossSpike | None, LossSpike | None]:
    """(the first lasting spike, else None; else the largest spike the loss came back from),
    in one pass over the curve. A passing spike is nothing to roll back, but the one abnormal
    thing in a log that otherwise ends in ordinary output; it is held to a higher jump than a
    lasting one (``PASSING_SPIKE_RATIO``): small batches make single steps jitter."""
    passing: LossSpike | None = None
    for spike in _spikes(points):
        if not spike.recovered:
            return spike, None
        jump = spike.peak / spike.baseline
        if jump >= PASSING_SPIKE_RATIO and (
            passing is None or jump > passing.peak / passing.baseline
        ):
            passing = spike
    return None, passing


def _spikes(points: Sequence[LossPoint]) -> Iterator[LossSpike]:
    """Every point far above the running median before it, with where the loss settled."""
    if len(points) < 2:
        return
    values = [p.value for p in points]
    for index, (baseline, seen) in enumerate(_running_medians(values)):
        value = values[index]
        if (
            seen
            and baseline > 0
            and value >= baseline * SPIKE_RATIO
            and value - baseline >= SPIKE_MIN_ABS
        ):
            after = values[index + 1 :]
            level = _median(sorted(after[-SETTLE_POINTS:])) if after else value
            yield LossSpike(index, points[index].line, baseline, value, level)


def _running_medians(values: Sequence[float]) -> Iterator[tuple[float, int]]:
    """For each value, the median of the (up to WINDOW) values before it and how many there
    were (0.0 and 0 for the first)."""
    window: deque[float] = deque()
    ordered: list[float] = []
    for value in values:
        yield (_median(ordered) if ordered else 0.0), len(ordered)
        window.append(value)
        bisect.insort(ordered, value)
        if len(window) > WINDOW:
            del ordered[bisect.bisect_left(ordered, window.popleft())]


def _median(ordered: Sequence[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass(frozen=True)
class ScaleCollapse:
    line: int
    start: float
    end: float
    drops: int
    # Deep enough to be a collapse; else a shorter fall the log still ends in (an unstable run,
    # or a warm-up the log was cut in): a suspicion only.
    deep: bool = True

    def describe(self) -> str:
        if not self.deep:
            return (
                f"fp16 loss scale still falling where the log ends ({self.drops} falls, from "
                f"{self.start:g} to {self.end:g}): steps skipped for overflowing gradients"
            )
        return (
            f"fp16 loss scale fell {self.drops} times in a row, from {self.start:g} to "
            f"{self.end:g}: gradients overflow step after step (the loss is diverging)"
        )


def extract_loss_scales(
    data: bytes, first_line: int, limit: int | None = None, previous: float | None = None
) -> Iterator[LossPoint]:
    """The dynamic loss scale after each line of ``data`` that prints one. A line that states
    the fall itself ("Attempted loss scale: 8192, reducing to 4096", "scale_before: 0.25,
    scale_after: 0.125") also gives the scale before it, where no reading before says so
    already: the first such line of a log is a fall of its own. ``previous``: the last reading
    before ``data`` (a log is read in blocks)."""
    line = first_line
    found = 0
    last = previous
    for raw in data.split(b"\n"):
        matches = list(_SCALE_RE.finditer(raw)) if b"scale" in raw or b"reducing" in raw else []
        values = [_scale(m.group(1)) for m in matches[:1] + matches[-1:]] if matches else []
        if len(matches) > 1 and 0 < values[-1] < values[0] and (last is None or values[0] < last):
            readings = values
        else:
            readings = values[-1:]
        for value in readings:
            # A scale printed as 0 is a rounded tiny one (fairseq "loss_scale 0"): no reading.
            if value > 0:
                yield LossPoint(value, line)
                last = value
                found += 1
                if limit is not None and found >= limit:
                    return
        line += 1


def _scale(text: bytes) -> float:
    try:
        return float(text)
    except ValueError:
        return -1.0


def find_scale_collapse(points: Sequence[LossPoint]) -> ScaleCollapse | None:
    """The loss scale's last run of falls, if it ends the curve: deep (at least
    COLLAPSE_HALVINGS falls and a 2^COLLAPSE_HALVINGS-fold drop, or a fall to COLLAPSE_FLOOR),
    else shallow (``deep`` False) when it holds at least FALLING_HALVINGS falls. A warm-up that
    settles (steady readings after it) or recovers (the scale grows) is neither."""
    if len(points) < 2:
        return None
    end = len(points) - 1
    last_drop = max(
        (i for i in range(1, len(points)) if points[i].value < points[i - 1].value), default=None
    )
    if last_drop is None or end - last_drop >= SCALE_SETTLE_POINTS:
        return None
    start = last_drop
    drops = 0
    while start > 0 and points[start].value <= points[start - 1].value:
        if points[start].value < points[start - 1].value:
            drops += 1
        start -= 1
    first, last = points[start].value, points[last_drop].value
    deep = (drops >= COLLAPSE_HALVINGS and first / last >= 2**COLLAPSE_HALVINGS) or (
        last <= COLLAPSE_FLOOR
    )
    if not deep and drops < FALLING_HALVINGS:
        return None
    return ScaleCollapse(line=points[last_drop].line, start=first, end=last, drops=drops, deep=deep)
