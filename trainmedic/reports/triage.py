"""The triage report: what an on-call engineer reads first. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trainmedic.core.models import (
    ActionRecord,
    Checkpoint,
    Diagnosis,
    Evidence,
    JobInfo,
    PlaybookResult,
)
from trainmedic.decisions.remediation import Plan
from trainmedic.reports.common import actions_table, cell, dry_run_mark, names
from trainmedic.state.records import Incident

MAX_EVIDENCE = 12


def kernel_log_state(facts: dict[str, object]) -> str:
    """``read``, ``UNREADABLE: <why>`` or ``—`` (not collected) for one node's kernel log."""
    rc = facts.get("kernel_rc")
    if rc is None:
        return "—"
    if str(rc) == "0":
        return "read"
    return f"UNREADABLE: {facts.get('kernel_error') or f'rc {rc}'}"


def why_this_diagnosis(diagnosis: Diagnosis) -> list[str]:
    """Why the winner beat each rival explanation the logs offered, and what it rests on."""
    lines = ["## Why this diagnosis", ""]
    if diagnosis.symptom_only:
        lines += [
            "The evidence is only symptoms (what the other ranks see when something broke "
            "elsewhere) or none: it names no node to drain.",
            "",
        ]
    if not diagnosis.rivals:
        lines.append(f"No rival explanation: every matching line points at {diagnosis.category}.")
        return lines
    lines += [
        f"| rival | score | strongest line | why {diagnosis.category} won |",
        "|---|---|---|---|",
    ]
    for rival in diagnosis.rivals:
        lines.append(
            f"| {rival.category} | {rival.score:.2f} | {cell(rival.where)} "
            f"(`{cell(rival.signature)}`) | {cell(rival.reason)} |"
        )
    return lines


def triage_report(
    *,
    job: JobInfo,
    diagnosis: Diagnosis,
    plan: Plan,
    actions: Sequence[ActionRecord],
    checkpoint: Checkpoint | None,
    new_job: JobInfo | None,
    diagnostics: PlaybookResult | None,
    dry_run: bool,
    incident: Incident | None = None,
) -> str:
    rem = diagnosis.remediation
    lines = [
        f"# Triage of job {job.job_id} ({job.name}){dry_run_mark(dry_run)}",
        "",
    ]
    if incident is not None:
        others = [j for j in incident.jobs if j != job.job_id]
        lines += [
            f"Failed in a storm: **incident {incident.incident_id}**, with jobs "
            f"{', '.join(others)}: one diagnosis of the nodes, one isolation decision "
            f"(report `incident-{incident.incident_id}`).",
            "",
        ]
    lines += [
        "## Diagnosis",
        "",
        "| field | value |",
        "|---|---|",
        f"| category | **{diagnosis.category}** |",
        f"| layer | {diagnosis.layer} |",
        f"| root-cause host | {diagnosis.root_cause_host or '—'} |",
        f"| origin node | {plan.origin_node or '—'} |",
        f"| confidence | {diagnosis.confidence:.2f} |",
        f"| source | {diagnosis.source} |",
        f"| job state | {job.state} (exit {job.exit_code}) on {', '.join(job.nodes)} |",
        f"| logs | `{job.log_dir}` |",
        "",
        f"**Remediation:** {rem.summary}",
    ]
    if rem.hints:
        lines += ["", "Hints: " + "; ".join(f"`{h}`" for h in rem.hints)]
    lines += ["", *why_this_diagnosis(diagnosis)]
    lines += ["", "## Evidence", ""]
    # A line read by two signatures (Xid 79 and "fallen off the bus") is shown once, with
    # both names.
    by_place: dict[tuple[str, int], list[Evidence]] = {}
    for ev in diagnosis.evidence:
        by_place.setdefault((ev.file, ev.line), []).append(ev)
    if by_place:
        lines += ["| file | line | signature | text |", "|---|---|---|---|"]
        for same in list(by_place.values())[:MAX_EVIDENCE]:
            ev = same[0]
            names = ", ".join(e.signature for e in same)
            # The file name alone keeps the table readable; the job's log dir is given above.
            name = Path(ev.file).name
            lines.append(f"| {cell(name)} | {ev.line} | {cell(names)} | `{cell(ev.text)}` |")
        if len(by_place) > MAX_EVIDENCE:
            lines.append(f"\n…and {len(by_place) - MAX_EVIDENCE} more evidence lines.")
    else:
        lines.append("No log line matched a signature.")
    if diagnostics is not None:
        lines += [
            "",
            "## Node diagnostics",
            "",
            "| node | reach | nvidia-smi rc | kernel log | Xid lines |",
            "|---|---|---|---|---|",
        ]
        unreadable = []
        for host, outcome in diagnostics.hosts.items():
            facts = diagnostics.facts.get(host, {}).get("trainmedic_diagnostics", {})
            if not isinstance(facts, dict):
                facts = {}
            xids = facts.get("xid_lines", [])
            rc = facts.get("nvidia_smi_rc", "—")
            kernel = kernel_log_state(facts)
            if kernel.startswith("UNREADABLE"):
                unreadable.append(f"{host} ({kernel.removeprefix('UNREADABLE: ')})")
            lines.append(
                f"| {host} | {outcome} | {rc} | {cell(kernel)} | "
                f"{cell('; '.join(xids[-2:])) or '—'} |"
            )
        if unreadable:
            lines += [
                "",
                "**Kernel evidence could not be read** on "
                + cell("; ".join(unreadable))
                + ": no Xid line from these nodes was considered. Check the privilege of the "
                "kernel-log task (kernel.dmesg_restrict, sudo for the Ansible user).",
            ]
    lines += ["", "## Decisions", ""] + [f"- {r}" for r in plan.reasons]
    lines += ["", "## Actions", "", *actions_table(actions)]
    lines += ["", "## Restart", ""]
    if checkpoint is not None:
        lines.append(f"- checkpoint: step {checkpoint.step} at `{checkpoint.path}`")
    elif new_job is not None:
        lines.append("- no checkpoint was ever saved: restarted from the beginning")
    if new_job is not None:
        lines.append(
            f"- new job **{new_job.job_id}** ({new_job.state}) on {', '.join(new_job.nodes)}"
        )
    if checkpoint is None and new_job is None:
        lines.append("- not restarted")
    return "\n".join(lines) + "\n"


def incident_report(
    *,
    incident: Incident,
    cases: Sequence[tuple[JobInfo, Diagnosis, JobInfo | None]],
    actions: Sequence[ActionRecord],
    dry_run: bool,
) -> str:
    """A storm on one page: the jobs that failed together, what each was diagnosed as and
    resubmitted as, and the one isolation decision taken for all of them."""
    lines = [
        f"# Incident {incident.incident_id}{dry_run_mark(dry_run)}",
        "",
        f"{len(incident.jobs)} jobs failed together on {len(incident.nodes)} nodes "
        f"({names(incident.nodes)}); handled by one run.",
        "",
    ]
    if incident.suspected_switches:
        lines += [
            f"**Suspected leaf switch: {', '.join(incident.suspected_switches)}** — every "
            "tested node behind it failed its pair tests; its nodes are held out of placement "
            "(not drained) and on-call was paged.",
            "",
        ]
    lines += [
        "| job | category | origin | resubmitted as |",
        "|---|---|---|---|",
    ]
    for job, diagnosis, new_job in cases:
        lines.append(
            f"| {job.job_id} | {diagnosis.category} | {diagnosis.root_cause_host or '—'} | "
            f"{new_job.job_id + ' on ' + ', '.join(new_job.nodes) if new_job else '—'} |"
        )
    lines += ["", "## Isolation decision", "", *actions_table(actions)]
    return "\n".join(lines) + "\n"
