"""Fresh evidence only: kernel lines from before the job started and lifetime counters are a
node's history, never this failure's cause (issue 15.1). Pure: no Prefect, no processes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from support.builders import nccl_watchdog_timeout as timeout

from trainmedic.core.models import GpuTelemetry
from trainmedic.core.taxonomy import Category
from trainmedic.diagnosis import LogSource, diagnose
from trainmedic.diagnosis.freshness import (
    kernel_line_time,
    split_kernel_lines,
    telemetry_over_window,
)

STARTED = datetime(2026, 12, 3, 18, 0, 0, tzinfo=UTC)
LAST_WEEK = STARTED - timedelta(days=7)


def iso(at: datetime, message: str) -> str:
    return f"{at:%Y-%m-%dT%H:%M:%S},123456+00:00 {message}"


def xid(code: int, text: str, bus: str = "1b") -> str:
    return f"NVRM: Xid (PCI:0000:{bus}:00): {code}, pid=4242, name=python, {text}"


ECC_48 = xid(48, "An uncorrectable double bit error (DBE) has been detected on GPU.")
NVLINK_74 = xid(74, "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0)")


def test_kernel_lines_from_before_the_job_started_are_history() -> None:
    lines = [
        iso(LAST_WEEK, ECC_48),  # a repaired node's old line
        "[Thu Nov 26 18:00:00 2026] " + ECC_48,  # dmesg -T, last week too
        iso(STARTED - timedelta(seconds=30), NVLINK_74),  # within the clock slack
        iso(STARTED + timedelta(minutes=5), NVLINK_74),
        NVLINK_74,  # no time: cannot be shown old, kept
    ]
    split = split_kernel_lines(lines, STARTED)
    assert split.stale == tuple(lines[:2])
    assert split.fresh == tuple(lines[2:])
    # Other zones and a naive start (UTC) give the same cut.
    cet = "2026-12-03T18:30:00,000001+01:00 " + ECC_48  # 17:30 UTC: before the start
    assert split_kernel_lines([cet], STARTED.replace(tzinfo=None)).stale == (cet,)
    assert split_kernel_lines([cet], STARTED, slack=timedelta(hours=1)).fresh == (cet,)


def test_the_window_starts_when_the_job_started_not_when_it_was_queued() -> None:
    """A fault reset on a node while the job waited in the queue is history: the job had
    not started on it."""
    from support.builders import job_info

    queued = job_info().model_copy(update={"submitted_at": STARTED - timedelta(hours=2)})
    started = queued.model_copy(update={"started_at": STARTED})
    assert queued.window_start == queued.submitted_at  # no start known: its submission
    assert started.window_start == STARTED
    while_queued = iso(STARTED - timedelta(hours=1), ECC_48)
    assert split_kernel_lines([while_queued], started.window_start).stale == (while_queued,)
    assert split_kernel_lines([while_queued], queued.window_start).fresh == (while_queued,)


def test_kernel_line_times_in_every_format_dmesg_prints() -> None:
    assert kernel_line_time(iso(STARTED, "x")) == STARTED
    assert kernel_line_time("2026-12-03T19:00:00.5+01:00 x") == STARTED
    assert kernel_line_time("[Thu Dec  3 18:00:00 2026] x") == STARTED
    assert kernel_line_time("[  812.123456] NVRM: since boot") is None
    assert kernel_line_time("NVRM: no time") is None


def gpu(host: str, index: int = 0, **values: float) -> GpuTelemetry:
    return GpuTelemetry(host=host, gpu=index, temperature_c=45, **values)  # type: ignore[arg-type]


def test_counters_count_only_as_their_increase_over_the_job() -> None:
    start = [
        gpu("node001", ecc_dbe_total=2, nvlink_errors_total=1843, xid_last=48),  # repaired
        gpu("node002", ecc_dbe_total=0, nvlink_errors_total=10),
        gpu("node003", ecc_dbe_total=6),
    ]
    now = [
        gpu("node001", ecc_dbe_total=2, nvlink_errors_total=1843, xid_last=48),
        gpu("node002", ecc_dbe_total=0, nvlink_errors_total=1853, xid_last=74),
        gpu("node003", ecc_dbe_total=2),  # reset (GPU reset) since: counted from zero
        gpu("node004", ecc_dbe_total=9, xid_last=79),  # no reading at the start
    ]
    window = {r.host: r for r in telemetry_over_window(start, now)}
    old = window["node001"]
    assert (old.ecc_dbe_total, old.nvlink_errors_total, old.xid_last) == (0, 0, 0)
    assert not old.lifetime and old.temperature_c == 45  # gauges are what they are now
    fresh = window["node002"]
    assert (fresh.nvlink_errors_total, fresh.xid_last) == (1843, 74)
    assert window["node003"].ecc_dbe_total == 2
    unknown = window["node004"]
    assert unknown.lifetime and unknown.ecc_dbe_total == 9  # kept, but never evidence


def test_lifetime_counters_are_never_evidence() -> None:
    lifetime = [
        GpuTelemetry(host="node001", gpu=0, xid_last=79, lifetime=True),
        GpuTelemetry(host="node002", gpu=1, ecc_dbe_total=2, xid_last=48, lifetime=True),
        GpuTelemetry(host="node003", gpu=2, nvlink_errors_total=1843, lifetime=True),
    ]
    assert diagnose([], telemetry=lifetime).category is Category.Unknown
    # The same readings as an increase over the job's window are evidence.
    window = [r.model_copy(update={"lifetime": False}) for r in lifetime[:1]]
    assert diagnose([], telemetry=window).category is Category.GPUFallenOff


def test_a_repaired_node_never_outranks_the_fresh_fault_elsewhere() -> None:
    """node001 was repaired last week (GPU reset: its Xid 48 lines are still in the ring
    buffer, its aggregate ECC count is 2 for life); node003's NVLink failed in this job."""
    hosts = ["node001", "node002", "node003", "node004"]
    ranks = [
        LogSource.from_lines(f"rank-{r:05d}.{h}.err", [timeout(r)]) for r, h in enumerate(hosts)
    ]
    kernel = {
        "node001": [iso(LAST_WEEK, ECC_48), iso(LAST_WEEK, xid(63, "Row Remapping: New row"))],
        "node003": [iso(STARTED + timedelta(minutes=42), NVLINK_74)],
    }
    start = [
        gpu("node001", ecc_dbe_total=2, xid_last=48),
        gpu("node003", nvlink_errors_total=0),
    ]
    now = [
        gpu("node001", ecc_dbe_total=2, xid_last=48),
        gpu("node003", nvlink_errors_total=1843, xid_last=74),
    ]

    def kernel_sources(lines_of: dict[str, list[str]]) -> list[LogSource]:
        return [LogSource.from_lines(f"{h}:kernel", ls, host=h) for h, ls in lines_of.items()]

    # What trainmedic did before: every kernel line and one scrape's totals as evidence.
    naive = diagnose(ranks + kernel_sources(kernel), telemetry=now)
    assert naive.category is Category.ECCError and "node001" in (naive.root_cause_host or "")

    fresh = {h: list(split_kernel_lines(ls, STARTED).fresh) for h, ls in kernel.items()}
    for telemetry in (
        telemetry_over_window(start, now),  # Prometheus: start against now
        [r.model_copy(update={"lifetime": True}) for r in now],  # one scrape: lifetime
    ):
        diagnosis = diagnose(ranks + kernel_sources(fresh), telemetry=telemetry)
        assert diagnosis.category is Category.NVLinkError
        assert diagnosis.root_cause_host is not None
        assert "node003" in diagnosis.root_cause_host
        assert "node001" not in diagnosis.root_cause_host
        assert not any(
            e.host == "node001" and e.category is Category.ECCError for e in diagnosis.evidence
        )
