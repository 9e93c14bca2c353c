"""Which repair brings a drained node back, and when to stop trying. Pure: the caller reads
the node's kernel log, its drain record and its repair history.

The repair follows what drained the node, as NVIDIA's Xid catalogue recommends
(``data/repairs.toml``): the node's fresh Xids (logged since its last repair, or since a
day before the drain) each ask for a repair, and the most severe one wins
(none < reset_gpu < reboot < inspect); an Xid 154 asks for the recovery action the driver
reports with it, an informational Xid for none; a node with no Xid gets the repair its drain's
verdict asks for (a failed pair test: reboot; a slow link: inspect).

Escalation, as the peers that do this at scale do it (gpud: two tries, then a hardware
ticket): the ``escalate_after``-th repair of one fault on one node within ``window`` is not
made. The fault came back after a repair that was supposed to fix it, so the node needs
hardware inspection, and from then on it is never returned automatically.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cache
from importlib import resources

from pydantic import Field

from trainmedic.core.errors import ConfigError
from trainmedic.core.models import Strict
from trainmedic.diagnosis.freshness import kernel_line_time
from trainmedic.diagnosis.xid import (
    RECOVERY_XID,
    XidEntry,
    XidLine,
    load_recovery_actions,
    lookup,
    parse_recovery_change,
    parse_xid_line,
)
from trainmedic.state.records import RepairRecord

__all__ = [
    "RepairKind",
    "RepairKnowledge",
    "RepairPlan",
    "RepairPolicy",
    "load_repair_knowledge",
    "parse_repair_knowledge",
    "plan_repair",
]


class RepairKind(StrEnum):
    none = "none"
    reset_gpu = "reset_gpu"
    reboot = "reboot"
    inspect = "inspect"


SEVERITY = {
    RepairKind.none: 0,
    RepairKind.reset_gpu: 1,
    RepairKind.reboot: 2,
    RepairKind.inspect: 3,
}


class RepairKnowledge(Strict):
    """``data/repairs.toml``: NVIDIA's action bucket, per-Xid exceptions, Xid 154's recovery
    actions, drain verdicts."""

    bucket: dict[str, RepairKind]
    xid: dict[int, tuple[RepairKind, str]]
    nvlink5_severity: dict[str, RepairKind]
    recovery: dict[str, RepairKind]
    verdict: dict[str, RepairKind]


class RepairPolicy(Strict):
    escalate_after: int = Field(default=2, ge=1)
    window: timedelta = timedelta(days=7)


class RepairPlan(Strict):
    kind: RepairKind
    fault: str  # what is repaired, the key repeats are counted by: "Xid 48", "faulty"
    gpus: tuple[str, ...] = ()  # PCI bus ids of the GPUs to reset (reset_gpu)
    why: str
    escalated: bool = False  # the repeat of a repaired fault: inspect instead
    evidence: tuple[str, ...] = ()  # the kernel lines it rests on


def parse_repair_knowledge(text: str, origin: str = "repairs.toml") -> RepairKnowledge:
    try:
        data = tomllib.loads(text)
        xids = {
            int(code): (RepairKind(entry["repair"]), str(entry["why"]))
            for code, entry in data.get("xid", {}).items()
        }
        recovery = {k: RepairKind(v) for k, v in data.get("recovery", {}).items()}
        known = {a.action for a in load_recovery_actions().values()}
        if unknown := sorted(set(recovery) - known):
            raise ValueError(f"[recovery] names no recovery action NVML reports: {unknown}")
        return RepairKnowledge(
            bucket={k: RepairKind(v) for k, v in data["bucket"].items()},
            xid=xids,
            nvlink5_severity={
                k: RepairKind(v) for k, v in data.get("nvlink5_severity", {}).items()
            },
            recovery=recovery,
            verdict={k: RepairKind(v) for k, v in data["verdict"].items()},
        )
    except (tomllib.TOMLDecodeError, KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"{origin}: {exc}") from exc


@cache
def load_repair_knowledge() -> RepairKnowledge:
    text = resources.files("trainmedic.decisions").joinpath("data", "repairs.toml")
    return parse_repair_knowledge(text.read_text(encoding="utf-8"))


def plan_repair(
    node: str,
    *,
    kernel_lines: Sequence[str],
    verdict: str,
    drained_at: datetime,
    history: Iterable[RepairRecord],
    now: datetime,
    policy: RepairPolicy,
    knowledge: RepairKnowledge | None = None,
) -> RepairPlan:
    """The repair ``node`` needs, from its kernel lines (ISO-timestamped, as the diagnostics
    playbook reads them), the verdict it was drained for and its repair history."""
    knowledge = knowledge or load_repair_knowledge()
    history = sorted((r for r in history if r.node == node), key=lambda r: r.at)
    plan = _from_xids(kernel_lines, _fresh_since(history, drained_at), knowledge)
    if plan is None:
        plan = _from_verdict(verdict, knowledge)
    if plan.kind in (RepairKind.none, RepairKind.inspect):
        return plan
    repeats = [r for r in history if r.fault == plan.fault and r.at >= now - policy.window]
    if len(repeats) + 1 >= policy.escalate_after:
        days = policy.window.total_seconds() / 86400
        return plan.model_copy(
            update={
                "kind": RepairKind.inspect,
                "escalated": True,
                "why": f"{plan.fault} again after {len(repeats)} repair(s) within {days:g} days "
                f"({', '.join(f'{r.kind} {r.at:%m-%d %H:%M}' for r in repeats)}): the "
                f"{plan.kind} did not fix it, the node needs hardware inspection",
            }
        )
    return plan


def _fresh_since(history: Sequence[RepairRecord], drained_at: datetime) -> datetime:
    """Xid lines from before the node's last repair were answered by it; without a repair,
    a day before the drain bounds what can still be this fault."""
    since = drained_at - timedelta(days=1)
    return max([since, *(r.at for r in history)])


def _from_xids(
    lines: Sequence[str], since: datetime, knowledge: RepairKnowledge
) -> RepairPlan | None:
    asks: dict[int, tuple[RepairKind, str]] = {}  # per Xid code, the most its lines ask for
    gpus: dict[int, set[str]] = {}
    evidence: dict[int, list[str]] = {}
    for line in lines:
        xid = parse_xid_line(line)
        at = kernel_line_time(line)
        if xid is None or at is None or at < since:
            continue  # not an Xid, or history (no time: cannot be shown to be fresh)
        kind, why = _xid_repair(xid, line, knowledge)
        if xid.code not in asks or SEVERITY[kind] > SEVERITY[asks[xid.code][0]]:
            asks[xid.code] = (kind, why)
        gpus.setdefault(xid.code, set()).add(xid.pci_bus_id)
        evidence.setdefault(xid.code, []).append(line)
    if not asks:
        return None
    # The most severe repair; of equals, the Xid that caused the fault rather than Xid 154,
    # which only reports what it needs.
    worst = max(asks, key=lambda code: (SEVERITY[asks[code][0]], code != RECOVERY_XID, code))
    kind, why = asks[worst]
    return RepairPlan(
        kind=kind,
        fault=f"Xid {worst}",
        gpus=tuple(sorted({g for code in asks if asks[code][0] != "none" for g in gpus[code]})),
        why=why,
        evidence=tuple(line for code in sorted(asks) for line in evidence[code])[-10:],
    )


def _xid_repair(xid: XidLine, line: str, knowledge: RepairKnowledge) -> tuple[RepairKind, str]:
    """The repair one Xid line asks for, and why."""
    entry = lookup(xid.code)
    if xid.code in knowledge.xid:
        return knowledge.xid[xid.code]
    if xid.code == RECOVERY_XID:
        return _recovery_repair(line, knowledge)
    if xid.severity in knowledge.nvlink5_severity:
        kind = knowledge.nvlink5_severity[xid.severity]
        name = entry.mnemonic if entry else "NVLink5"
        return kind, f"Xid {xid.code} ({name}, {xid.severity}): NVIDIA's NVLink5 decode: {kind}"
    if entry is not None and entry.immediate_action in knowledge.bucket:
        action = entry.immediate_action
        why = f"Xid {xid.code} ({entry.mnemonic}): NVIDIA's action {action}"
        return knowledge.bucket[action], why
    if entry is not None and entry.kind == "informational":
        return RepairKind.none, _informational(entry)
    action = entry.immediate_action if entry else "not in the catalogue"
    return RepairKind.inspect, f"Xid {xid.code} ({action or 'no action given'}): no known repair"


def _informational(entry: XidEntry) -> str:
    return f"Xid {entry.code} ({entry.mnemonic}): an informational notice, nothing to repair"


def _recovery_repair(line: str, knowledge: RepairKnowledge) -> tuple[RepairKind, str]:
    change = parse_recovery_change(line)
    if change is None:  # the line was cut before the action: the Xid beside it decides
        return RepairKind.none, f"Xid {RECOVERY_XID} without its recovery action"
    said = f"Xid {RECOVERY_XID}: the driver asks for {change.said!r}"
    if change.action is None or change.action.action not in knowledge.recovery:
        return (
            RepairKind.inspect,
            f"{said} (0x{change.code:x}), a recovery action with no known repair",
        )
    kind = knowledge.recovery[change.action.action]
    return kind, f"{said} ({change.action.action}): {kind}"


def _from_verdict(verdict: str, knowledge: RepairKnowledge) -> RepairPlan:
    key = verdict.split(maxsplit=1)[0] if verdict.split() else ""
    kind = knowledge.verdict.get(key)
    if kind is None:
        return RepairPlan(
            kind=RepairKind.inspect,
            fault=key or "unknown",
            why=f"drained for {verdict!r} with no fresh Xid: no known repair, a human decides",
        )
    return RepairPlan(
        kind=kind,
        fault=key,
        why=f"drained for {verdict!r}, no fresh Xid on the node: {kind}",
    )
