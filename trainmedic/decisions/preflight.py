"""Is a node fit to start a job? A quick verdict from what the node-diagnostics playbook
collected (nvidia-smi and the kernel log), for a pre-flight check before a job starts and a
Slurm prolog, where seconds matter and a bad node costs the whole job.

A node is unfit when: it did not answer; nvidia-smi failed (a lost GPU makes it exit
non-zero); a GPU reports uncorrectable volatile ECC errors, a temperature at or above
``hot_c`` or an active hardware thermal slowdown; or its kernel log holds an Xid of a
hardware class (NVIDIA's catalogue) newer than ``xid_window_s``, but for a non-fatal NVLink5
one, which NVIDIA's decode ignores; or an Xid 154 that left a GPU needing a repair (a reset, a
reboot) and was not followed by one saying it needs none. Older Xid lines are history, not a
reason (a repaired node keeps its old lines until it reboots). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from trainmedic.core.models import Strict
from trainmedic.decisions.repair import RepairKind, load_repair_knowledge
from trainmedic.diagnosis.freshness import kernel_line_time
from trainmedic.diagnosis.xid import RECOVERY_XID, lookup, parse_recovery_change, parse_xid_line

__all__ = ["NodeFitness", "kernel_line_time", "node_fitness"]


class NodeFitness(Strict):
    node: str
    fit: bool
    problems: tuple[str, ...] = ()


def node_fitness(
    node: str,
    facts: Mapping[str, object] | None,
    *,
    gpu_fields: Sequence[str],
    now: datetime,
    xid_window_s: float,
    hot_c: float = 90.0,
) -> NodeFitness:
    """``facts``: the playbook's ``trainmedic_diagnostics`` for the node (None: unreachable)."""
    if not facts:
        return NodeFitness(node=node, fit=False, problems=("did not answer the check",))
    problems: list[str] = []
    rows = [str(r) for r in facts.get("nvidia_smi") or []]  # type: ignore[union-attr]
    rc = int(str(facts.get("nvidia_smi_rc", 0)) or 0)
    if rc != 0:
        problems.append(f"nvidia-smi exit {rc}: {rows[0] if rows else 'no output'}"[:200])
    else:
        problems += _gpu_problems(rows, gpu_fields, hot_c)
    since = now - timedelta(seconds=xid_window_s)
    recovery: dict[str, str | None] = {}  # per GPU, what its latest Xid 154 says it needs
    for line in [str(x) for x in facts.get("xid_lines") or []]:  # type: ignore[union-attr]
        xid = parse_xid_line(line)
        at = kernel_line_time(line)
        if xid is None or (at is not None and at < since):
            continue  # not an Xid, or history: before the window
        if xid.code == RECOVERY_XID:
            recovery[xid.pci_bus_id] = _repair_asked(line, at)
            continue
        entry = lookup(xid.code)
        if entry is not None and entry.kind == "hardware" and not _ignored(xid.severity):
            problems.append(f"Xid {entry.code} ({entry.mnemonic}) at {at or 'an unknown time'}")
    problems += [f"GPU {gpu}: {asked}" for gpu, asked in recovery.items() if asked]
    return NodeFitness(node=node, fit=not problems, problems=tuple(dict.fromkeys(problems)))


def _ignored(severity: str | None) -> bool:
    """A non-fatal NVLink5 Xid: NVIDIA's decode ignores it (an Xid 154 beside it says more)."""
    kinds = load_repair_knowledge().nvlink5_severity
    return severity is not None and kinds.get(severity) is RepairKind.none


def _repair_asked(line: str, at: datetime | None) -> str | None:
    """What an Xid 154 line says its GPU needs before it can be used again; None for nothing."""
    change = parse_recovery_change(line)
    if change is None:
        return None
    known = load_repair_knowledge().recovery.get(change.action.action) if change.action else None
    if known is RepairKind.none:
        return None
    return f"Xid 154 at {at or 'an unknown time'}: the driver asks for {change.said!r}"


def _gpu_problems(rows: Sequence[str], fields: Sequence[str], hot_c: float) -> list[str]:
    problems = []
    for row in rows:
        values = dict(zip(fields, (v.strip() for v in row.split(",")), strict=False))
        gpu = values.get("index", "?")
        ecc = values.get("ecc.errors.uncorrected.volatile.total", "0")
        if ecc.isdigit() and int(ecc) > 0:
            problems.append(f"GPU {gpu}: {ecc} uncorrectable ECC errors (volatile)")
        temp = values.get("temperature.gpu", "")
        if temp.replace(".", "", 1).isdigit() and float(temp) >= hot_c:
            problems.append(f"GPU {gpu}: {temp} C")
        if values.get("clocks_throttle_reasons.hw_thermal_slowdown", "").lower() == "active":
            problems.append(f"GPU {gpu}: hardware thermal slowdown active")
    return problems
