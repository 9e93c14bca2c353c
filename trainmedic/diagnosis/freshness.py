"""Fresh evidence only: what happened while the job ran is evidence of why it failed; what a
node carried from before is its history, never this failure's cause.

A node repaired last week keeps its old ``NVRM: Xid`` lines until it reboots, and its GPUs'
counters keep their lifetime counts (the aggregate ECC count lives in the InfoROM, NVLink
error counters keep counting). So:

- a kernel line logged before the job started (less a clock slack) is context: it is kept
  aside, never ranked; a line without a readable time is kept (it cannot be shown old);
- a telemetry counter (ECC, NVLink CRC/replay/recovery, DCGM's last Xid) counts only as its
  increase over the job's window, start against now. One scrape's values are lifetime totals
  (``GpuTelemetry.lifetime``) and the engine does not count them.

Pure: no I/O, no clock (the caller says when the job started).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from trainmedic.core.models import GpuTelemetry

__all__ = [
    "KERNEL_CLOCK_SLACK",
    "KernelLines",
    "kernel_line_time",
    "split_kernel_lines",
    "telemetry_over_window",
]

# The nodes' clocks and the scheduler's differ by a little; a line this close is fresh.
KERNEL_CLOCK_SLACK = timedelta(seconds=60)

_CTIME = re.compile(r"^\[(\w{3} \w{3} +\d{1,2} \d\d:\d\d:\d\d \d{4})\]")
_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.]\d+)?([+-]\d\d:?\d\d|Z)?")


def kernel_line_time(line: str) -> datetime | None:
    """The time of a kernel line as `dmesg --time-format iso` / journalctl's ISO form or
    `dmesg -T` ("[Thu Dec  3 17:42:01 2026]", taken as UTC) print it; None when it has none
    (dmesg's default seconds since boot say nothing without the boot time)."""
    iso = _ISO.match(line)
    if iso:
        zone = iso[2] or "+00:00"
        zone = "+00:00" if zone == "Z" else zone
        try:
            return datetime.fromisoformat(iso[1] + zone)
        except ValueError:
            return None
    ctime = _CTIME.match(line)
    if ctime:
        try:
            return datetime.strptime(" ".join(ctime[1].split()), "%a %b %d %H:%M:%S %Y").replace(
                tzinfo=UTC
            )
        except ValueError:
            return None
    return None


@dataclass(frozen=True)
class KernelLines:
    """A node's kernel lines split at the job's start."""

    fresh: tuple[str, ...]  # logged during the job (or of unknown time): evidence
    stale: tuple[str, ...]  # logged before the job started: context, never a cause


def split_kernel_lines(
    lines: Iterable[object], started: datetime, *, slack: timedelta = KERNEL_CLOCK_SLACK
) -> KernelLines:
    """Split ``lines`` at ``started`` less ``slack`` (a naive ``started`` is UTC)."""
    if started.tzinfo is None:
        started = started.replace(tzinfo=UTC)
    cutoff = started - slack
    fresh: list[str] = []
    stale: list[str] = []
    for raw in lines:
        line = str(raw)
        at = kernel_line_time(line)
        (stale if at is not None and at < cutoff else fresh).append(line)
    return KernelLines(fresh=tuple(fresh), stale=tuple(stale))


def telemetry_over_window(
    start: Sequence[GpuTelemetry], now: Sequence[GpuTelemetry]
) -> list[GpuTelemetry]:
    """Each GPU's reading ``now`` with its counters as their increase since ``start`` (the
    readings when the job started): ECC and NVLink errors by how much they grew (a counter
    lower than at the start was reset, by a reboot or a GPU reset, and counted from zero
    again), the last Xid only when it changed (the same code before and now is the old one).
    Gauges (temperature, utilization) are what they are now. A GPU with no start reading
    keeps its lifetime totals, flagged so (not evidence)."""
    before = {(r.host, r.gpu): r for r in start}
    window = []
    for reading in now:
        base = before.get((reading.host, reading.gpu))
        if base is None:
            window.append(reading.model_copy(update={"lifetime": True}))
            continue
        window.append(
            reading.model_copy(
                update={
                    "lifetime": False,
                    "ecc_dbe_total": _increase(base.ecc_dbe_total, reading.ecc_dbe_total),
                    "nvlink_errors_total": _increase(
                        base.nvlink_errors_total, reading.nvlink_errors_total
                    ),
                    "xid_last": reading.xid_last if reading.xid_last != base.xid_last else 0,
                }
            )
        )
    return window


def _increase(before: float, now: float) -> float:
    return now - before if now >= before else now
