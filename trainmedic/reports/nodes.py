"""Reports of the node runbooks: locate (pair tests and the isolation decision), restore. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainmedic.core.models import IsolationOutcome
from trainmedic.core.validate import compress_nodelist
from trainmedic.locate import LocateReport, RoundRecord
from trainmedic.reports.common import cell, dry_run_mark, names


def locate_report(
    report: LocateReport,
    wall_s: float,
    outcome: IsolationOutcome | None,
    *,
    dry_run: bool,
    not_tested: dict[str, str] | None = None,
) -> str:
    not_tested = not_tested or {}
    lines = [
        f"# Locate faulty nodes{dry_run_mark(dry_run)}",
        "",
        "| | |",
        "|---|---|",
        f"| nodes tested | {len(report.nodes)}: {compress_nodelist(report.nodes)} |",
        f"| not tested (not held) | {names(sorted(not_tested)) if not_tested else '—'} |",
        f"| faulty | **{names(report.faulty)}** |",
        f"| slow | **{names(report.slow)}** |",
        f"| undetermined | {names(report.undetermined)} |",
        f"| rounds / tests | {report.rounds} / {report.tests_run} |",
        f"| reference busbw | {report.reference_gbps} GB/s (slow below x{report.slow_ratio}) |",
        f"| wall time | {wall_s:.1f} s |",
        f"| seed | {report.seed} |",
        "",
        "## Rounds",
        "",
        "| round | pair | role | result | busbw (GB/s) | attempts | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report.rows():
        lines.append(
            f"| {row['round']} | {row['nodes']} | {row['role']} | {row['verdict']} | "
            f"{row['busbw_gbps'] if row['busbw_gbps'] is not None else '—'} | "
            f"{row['attempts']} | {cell(row['error']) or ''} |"
        )
    if not_tested:
        lines += ["", "## Not tested", "", "| node | why |", "|---|---|"]
        lines += [f"| {node} | {cell(why)} |" for node, why in sorted(not_tested.items())]
    if outcome is not None:
        lines += isolation_section(outcome)
    return "\n".join(lines) + "\n"


def round_table(record: RoundRecord) -> list[dict[str, object]]:
    """One round as the rows of a Prefect table artifact."""
    return [
        {
            "pair": row["nodes"],
            "result": row["verdict"],
            "busbw_gbps": row["busbw_gbps"],
            "round": row["round"],
            "role": row["role"],
            "attempts": row["attempts"],
            "error": row["error"],
        }
        for row in record.rows()
    ]


def isolation_section(outcome: IsolationOutcome) -> list[str]:
    lines: list[str] = []
    lines += [
        "",
        "## Isolation",
        "",
        f"- decided by: {outcome.decided_by}",
        f"- candidates: {names(outcome.candidates)}",
        f"- approved: {names(outcome.approved)}",
        f"- drained now: {names(outcome.drained)}",
        f"- already drained: {names(outcome.already_drained)}",
    ]
    lines += [f"- needs approval because: {r}" for r in outcome.reasons]
    if outcome.ignored:
        lines.append(f"- ignored (not convicted): {names(outcome.ignored)}")
    for host, found in outcome.evidence.items():
        lines += ["", f"### {host} ({found.get('outcome')})", ""]
        for title, field in (
            ("Xid lines", "xid_lines"),
            ("nvidia-smi", "nvidia_smi"),
            ("dcgmi diag -r 1", "dcgmi"),
        ):
            value = found.get(field) or []
            body = "\n".join(str(v) for v in value) if isinstance(value, list) else str(value)
            lines += [f"{title}:", "", "```", body or "(nothing)", "```", ""]
    return lines


def restore_report(
    *,
    node: str,
    verdict: str,
    reason: str,
    partner: str | None,
    busbw_gbps: float | None,
    reference_gbps: float | None,
    restored: bool,
    dry_run: bool,
    owner: str = "",
    burn_in: Sequence[str] = (),
) -> str:
    def gbps(value: float | None) -> str:
        return f"{value} GB/s" if value is not None else "—"

    diag = ["", "DCGM diagnostic (burn-in):", "", "```", *burn_in, "```"] if burn_in else []
    return "\n".join(
        [
            f"# Restore {node}{dry_run_mark(dry_run)}",
            "",
            "| | |",
            "|---|---|",
            f"| outcome | **{verdict}** |",
            f"| why | {reason.replace('|', '/')} |",
            f"| drain | {owner.replace('|', '/') or '—'} |",
            f"| partner | {partner or '—'} |",
            f"| bus bandwidth | {gbps(busbw_gbps)} |",
            f"| reference | {gbps(reference_gbps)} |",
            f"| back in service | {'yes' if restored else 'no'} |",
            *diag,
            "",
        ]
    )


def repair_report(result: Mapping[str, Any], *, dry_run: bool) -> str:
    """repair-node's report: the plan, who decided, what ran, the burn-in (``result`` is the
    runbook's RepairResult, dumped)."""
    restore = result.get("restore") or {}
    burn_in = list(restore.get("burn_in") or [])
    evidence = [str(line) for line in result.get("evidence") or []]
    rows = [
        ("outcome", f"**{result['outcome']}**"),
        ("repair", result.get("repair") or "—"),
        ("fault", result.get("fault") or "—"),
        ("why", result.get("why") or "—"),
        (
            "escalated",
            "yes: the fault came back after its repair" if result.get("escalated") else "no",
        ),
        ("decided by", result.get("decided_by") or "—"),
        ("repaired", "yes" if result.get("repaired") else "no"),
        (
            "hardware inspection",
            "yes: kept out until a human returns it" if result.get("inspection") else "no",
        ),
        ("burn-in", restore.get("verdict") or "—"),
        ("back in service", "yes" if result.get("restored") else "no"),
    ]
    lines = [f"# Repair {result['node']}{dry_run_mark(dry_run)}", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {cell(str(value))} |" for name, value in rows]
    if evidence:
        lines += ["", "Evidence (the node's fresh kernel lines):", "", "```", *evidence, "```"]
    if burn_in:
        lines += ["", "DCGM diagnostic (burn-in):", "", "```", *burn_in, "```"]
    return "\n".join([*lines, ""])
