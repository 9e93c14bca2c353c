"""Is a node fit to start a job? A quick verdict from what the node-diagnostics playbook
collected (nvidia-smi and the kernel log), for a pre-flight check before a job starts and a
Slurm prolog, where seconds matter and a bad node costs the whole job.

A node is unfit when: it did not answer; nvidia-smi failed (a lost GPU makes it exit
non-zero); a GPU reports uncorrectable volatile ECC errors, a temperature at or above
``hot_c`` or an active hardware thermal slowdown; or its kernel log holds an Xid of a
hardware class (NVIDIA's catalogue) newer than ``xid_window_s``. Older Xid lines are history,
not a reason (a repaired node keeps its old lines until it reboots). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from trainmedic.core.models import Strict
from trainmedic.diagnosis.freshness import kernel_line_time
from trainmedic.diagnosis.xid import lookup, parse_xid_line

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
    for line in [str(x) for x in facts.get("xid_lines") or []]:  # type: ignore[union-attr]
        xid = parse_xid_line(line)
        entry = lookup(xid.code) if xid else None
        if entry is None or entry.kind != "hardware":
            continue
        at = kernel_line_time(line)
        if at is not None and at < since:
            continue  # history: before the window
        problems.append(f"Xid {entry.code} ({entry.mnemonic}) at {at or 'an unknown time'}")
    return NodeFitness(node=node, fit=not problems, problems=tuple(dict.fromkeys(problems)))


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
