"""Is a node fit to start a job, from what the diagnostics playbook collected (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from trainmedic.decisions.preflight import kernel_line_time, node_fitness

FIELDS = [
    "index",
    "pci.bus_id",
    "temperature.gpu",
    "ecc.errors.uncorrected.volatile.total",
    "clocks_throttle_reasons.hw_thermal_slowdown",
]
NOW = datetime(2026, 12, 3, 18, 0, tzinfo=UTC)
HEALTHY = [f"{g}, 00000000:{g:02x}:00.0, {41 + g}, 0, Not Active" for g in range(4)]


def facts(rows=HEALTHY, rc=0, xid=()):  # type: ignore[no-untyped-def]
    return {"nvidia_smi_rc": str(rc), "nvidia_smi": list(rows), "xid_lines": list(xid)}


def check(found):  # type: ignore[no-untyped-def]
    return node_fitness("node003", found, gpu_fields=FIELDS, now=NOW, xid_window_s=86_400)


def test_a_healthy_node_is_fit() -> None:
    verdict = check(facts())
    assert verdict.fit and verdict.problems == ()


def test_lost_gpu_ecc_heat_and_throttling_make_a_node_unfit() -> None:
    lost = check(facts(rows=["Unable to determine the device handle for GPU0000:3b:00.0"], rc=15))
    assert not lost.fit and lost.problems[0].startswith("nvidia-smi exit 15: Unable")
    rows = [
        "0, 00000000:00:00.0, 41, 2, Not Active",
        "1, 00000000:01:00.0, 96, 0, Active",
        *HEALTHY[2:],
    ]
    problems = check(facts(rows=rows)).problems
    assert problems == (
        "GPU 0: 2 uncorrectable ECC errors (volatile)",
        "GPU 1: 96 C",
        "GPU 1: hardware thermal slowdown active",
    )
    assert check(None).problems == ("did not answer the check",)


def test_only_recent_hardware_xids_count() -> None:
    recent = (NOW - timedelta(hours=2)).strftime("%a %b %d %H:%M:%S %Y")
    old = (NOW - timedelta(days=9)).strftime("%a %b %d %H:%M:%S %Y")
    line = "NVRM: Xid (PCI:0000:3b:00): {code}, pid=1234, GPU has fallen off the bus."
    assert not check(facts(xid=[f"[{recent}] " + line.format(code=79)])).fit
    assert check(facts(xid=[f"[{old}] " + line.format(code=79)])).fit  # history
    assert check(facts(xid=[f"[{recent}] " + line.format(code=13)])).fit  # the app's fault
    iso = (NOW - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S,123456+00:00")
    (problem,) = check(facts(xid=[f"{iso} " + line.format(code=48)])).problems
    assert problem.startswith("Xid 48 (")
    # A line without a time cannot be shown to be old: it counts.
    assert not check(facts(xid=[line.format(code=79)])).fit


def test_kernel_line_times_in_both_formats() -> None:
    assert kernel_line_time("[Thu Dec  3 17:42:01 2026] NVRM: x") == datetime(
        2026, 12, 3, 17, 42, 1, tzinfo=UTC
    )
    assert kernel_line_time("2026-12-03T17:42:01,123456+01:00 NVRM: x") == datetime(
        2026, 12, 3, 16, 42, 1, tzinfo=UTC
    )
    assert kernel_line_time("NVRM: no time") is None


def test_a_gpu_the_driver_says_needs_a_repair_is_unfit_until_it_says_none() -> None:
    """Xid 154 after an application's Xid 31: no hardware Xid, but the GPU cannot be used until
    it is reset. A later Xid 154 back to "None" (the reset done) clears it."""
    at = (NOW - timedelta(hours=1)).strftime("%a %b %d %H:%M:%S %Y")
    xid = f"[{at}] NVRM: Xid (PCI:0000:3b:00): "
    fault = xid + "31, pid=1234, name=python, MMU Fault"
    needs = xid + "154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    done = xid + "154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    (problem,) = check(facts(xid=[fault, needs])).problems
    assert problem.startswith("GPU 00000000:3B:00.0: Xid 154 at ")
    assert problem.endswith(": the driver asks for 'GPU Reset Required'")
    assert check(facts(xid=[fault, needs, done])).fit
    assert check(facts(xid=[fault])).fit  # the application's own fault alone


def test_a_non_fatal_nvlink5_xid_leaves_the_node_fit_and_a_fatal_one_does_not() -> None:
    at = (NOW - timedelta(hours=1)).strftime("%a %b %d %H:%M:%S %Y")
    xid = f"[{at}] NVRM: Xid (PCI:0018:01:00): "
    nonfatal = xid + "145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001)"
    fatal = xid + "149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000)"
    assert check(facts(xid=[nonfatal])).fit
    assert not check(facts(xid=[nonfatal, fatal])).fit
