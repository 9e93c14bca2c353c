"""Which repair a drained node gets, and when trainmedic stops repairing it (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainmedic.core.errors import ConfigError
from trainmedic.decisions.repair import (
    RepairKind,
    RepairPolicy,
    load_repair_knowledge,
    parse_repair_knowledge,
    plan_repair,
)
from trainmedic.diagnosis.xid import load_recovery_actions, load_xid_catalogue, parse_xid_line
from trainmedic.state.records import RepairRecord

NOW = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)
DRAINED = NOW - timedelta(minutes=10)


def xid(code: int, at: datetime, bus: str = "3b", text: str = "details") -> str:
    return f"{at.isoformat(timespec='microseconds')} NVRM: Xid (PCI:0000:{bus}:00): {code}, {text}"


def plan(lines: list[str], verdict: str = "ECCError", history: list[RepairRecord] = ()):  # type: ignore[no-untyped-def,assignment]
    return plan_repair(
        "node003",
        kernel_lines=lines,
        verdict=verdict,
        drained_at=DRAINED,
        history=history,
        now=NOW,
        policy=RepairPolicy(escalate_after=2, window=timedelta(days=7)),
    )


def repaired(fault: str, ago: timedelta, node: str = "node003") -> RepairRecord:
    return RepairRecord(node=node, fault=fault, kind="reset_gpu", at=NOW - ago)


def test_xid_line_names_the_gpu_as_nvidia_smi_does() -> None:
    parsed = parse_xid_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")
    assert parsed is not None and (parsed.code, parsed.pci_bus_id) == (79, "00000000:3B:00.0")
    assert parse_xid_line("NVRM: loading NVIDIA UNIX x86_64 Kernel Module") is None
    mig = parse_xid_line("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE")
    assert mig is not None and (mig.code, mig.pci_bus_id) == (94, "00000000:01:00.0")


@pytest.mark.parametrize(
    ("codes", "kind", "fault"),
    [
        ([48, 63], RepairKind.reset_gpu, "Xid 48"),  # DBE + pending remap: a reset applies it
        ([74], RepairKind.reset_gpu, "Xid 74"),
        ([79], RepairKind.reboot, "Xid 79"),
        ([48, 64], RepairKind.inspect, "Xid 64"),  # remap failed: RMA
        ([48, 79], RepairKind.reboot, "Xid 79"),  # the most severe wins
        ([13], RepairKind.none, "Xid 13"),  # the application's own fault
    ],
)
def test_the_fresh_xids_choose_the_repair(codes, kind, fault) -> None:  # type: ignore[no-untyped-def]
    found = plan([xid(c, DRAINED - timedelta(minutes=1)) for c in codes])
    assert (found.kind, found.fault) == (kind, fault)
    assert len(found.evidence) == len(codes)


def recovery(to: str, at: datetime = DRAINED) -> str:
    return xid(154, at, text=f"GPU recovery action changed from 0x0 (None) to {to}")


@pytest.mark.parametrize(
    ("lines", "kind", "fault"),
    [
        # Xid 154 reports what the GPU needs after the Xid that caused it: that one names the
        # fault, and 154 raises the repair where it asks for more
        ([48, "0x1 (GPU Reset Required)"], RepairKind.reset_gpu, "Xid 48"),
        ([79, "0x2 (Node Reboot Required)"], RepairKind.reboot, "Xid 79"),
        ([48, "0x2 (Node Reboot Required)"], RepairKind.reboot, "Xid 154"),
        ([48, "0x4 (Drain and Reset)"], RepairKind.reset_gpu, "Xid 48"),
        (["0x0 (None)"], RepairKind.none, "Xid 154"),
        # a code NVML's table does not know: a human
        ([48, "0x9"], RepairKind.inspect, "Xid 154"),
        # a channel torn down beside another Xid, an informational notice: nothing of their own
        ([79, 45], RepairKind.reboot, "Xid 79"),
        ([48, 163], RepairKind.reset_gpu, "Xid 48"),
    ],
)
def test_xid_154_and_notices_ask_for_what_they_say(lines, kind, fault) -> None:  # type: ignore[no-untyped-def]
    at = DRAINED - timedelta(minutes=1)
    found = plan([recovery(x, at) if isinstance(x, str) else xid(x, at) for x in lines])
    assert (found.kind, found.fault) == (kind, fault)


def test_a_non_fatal_nvlink5_xid_asks_for_nothing_and_a_fatal_one_for_a_reset() -> None:
    """NVIDIA's Xid 144-150 decode: a non-fatal event is ignored, or the Xid 154 beside it
    decides; a fatal one needs a GPU reset."""
    at = DRAINED - timedelta(minutes=1)
    nonfatal = xid(145, at, text="RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001)")
    fatal = xid(149, at, text="NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000)")
    alone = plan([nonfatal])
    assert (alone.kind, alone.gpus) == (RepairKind.none, ())
    assert alone.why.startswith("Xid 145 (NVLINK_RLW_ERROR, Nonfatal): NVIDIA's NVLink5 decode")
    assert plan([nonfatal, recovery("0x1 (GPU Reset Required)", at)]).kind is RepairKind.reset_gpu
    assert (plan([fatal]).kind, plan([fatal]).fault) == (RepairKind.reset_gpu, "Xid 149")


def test_the_repair_says_what_recovery_action_the_driver_asked_for() -> None:
    at = DRAINED - timedelta(minutes=1)
    found = plan([xid(48, at), recovery("0x2 (Node Reboot Required)", at)])
    assert found.why == "Xid 154: the driver asks for 'Node Reboot Required' (NODE_REBOOT): reboot"
    assert len(found.evidence) == 2


def test_every_recovery_action_nvml_reports_has_a_repair() -> None:
    knowledge = load_repair_knowledge()
    assert set(knowledge.recovery) == {a.action for a in load_recovery_actions().values()}
    with pytest.raises(ConfigError, match=r"REBOOT_TWICE"):
        parse_repair_knowledge('[bucket]\n[verdict]\n[recovery]\nREBOOT_TWICE = "reboot"\n')


def test_a_reset_targets_the_gpus_that_logged_the_fault() -> None:
    lines = [xid(48, DRAINED, "3b"), xid(63, DRAINED, "3b"), xid(48, DRAINED, "5b")]
    assert plan(lines).gpus == ("00000000:3B:00.0", "00000000:5B:00.0")


def test_old_xid_lines_and_lines_before_the_last_repair_are_history() -> None:
    old = xid(79, DRAINED - timedelta(days=2))
    assert plan([old], verdict="faulty").fault == "faulty"  # from the verdict, not the old Xid
    # A GPU reset leaves its kernel lines in the ring buffer: answered, not fresh.
    answered = xid(79, NOW - timedelta(hours=3))
    history = [
        RepairRecord(node="node003", fault="Xid 79", kind="reboot", at=NOW - timedelta(hours=2))
    ]
    assert plan([answered], verdict="slow", history=history).fault == "slow"
    # An Xid line with no time cannot be shown to be fresh.
    assert plan(["NVRM: Xid (PCI:0000:3b:00): 79, lost"], verdict="faulty").fault == "faulty"


@pytest.mark.parametrize(
    ("verdict", "kind"),
    [
        ("faulty", RepairKind.reboot),
        ("slow", RepairKind.inspect),
        ("ECCError", RepairKind.reset_gpu),
        ("GPUFallenOff", RepairKind.reboot),
        ("preflight: GPU 2: 96 C", RepairKind.inspect),  # no known repair: a human decides
    ],
)
def test_without_an_xid_the_drain_verdict_chooses(verdict: str, kind: RepairKind) -> None:
    assert plan([], verdict=verdict).kind is kind


def test_the_same_fault_again_after_a_repair_escalates_to_inspection() -> None:
    lines = [xid(48, DRAINED)]
    first = plan(lines)
    assert first.kind is RepairKind.reset_gpu and not first.escalated
    again = plan(lines, history=[repaired("Xid 48", timedelta(days=1))])
    assert again.kind is RepairKind.inspect and again.escalated
    assert "Xid 48 again after 1 repair(s) within 7 days" in again.why
    # Another fault, another node's repair, or a repair outside the window: not a repeat.
    assert plan(lines, history=[repaired("Xid 74", timedelta(days=1))]).kind is RepairKind.reset_gpu
    other = [repaired("Xid 48", timedelta(days=1), node="node004")]
    assert plan(lines, history=other).kind is RepairKind.reset_gpu
    assert plan(lines, history=[repaired("Xid 48", timedelta(days=8))]).kind is RepairKind.reset_gpu


def test_every_nvidia_action_bucket_of_a_hardware_xid_has_a_repair() -> None:
    knowledge = load_repair_knowledge()
    for entry in load_xid_catalogue().values():
        if entry.kind == "hardware" and entry.code not in knowledge.xid and entry.immediate_action:
            assert entry.immediate_action in knowledge.bucket, (
                f"Xid {entry.code}: bucket {entry.immediate_action} has no repair"
            )
    # No bucket in NVIDIA's sheet (Xid 165: power smoothing circuitry worn out): a human.
    assert plan([xid(165, DRAINED)]).kind is RepairKind.inspect


def test_a_bad_knowledge_file_is_one_config_error() -> None:
    with pytest.raises(ConfigError, match=r"repairs\.toml"):
        parse_repair_knowledge('[bucket]\nRESET_GPU = "hammer"\n[verdict]\n')
