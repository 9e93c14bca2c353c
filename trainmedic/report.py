"""The Markdown report of a runbook run: what an on-call engineer reads first. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from trainmedic.models import Checkpoint, Diagnosis, Evidence, JobInfo, PlaybookResult
from trainmedic.policy import Plan
from trainmedic.recovery import LossRecord

MAX_EVIDENCE = 12


class ActionRecord(BaseModel):
    what: str
    target: str
    outcome: str
    changed: bool = False


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")[:300]


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
) -> str:
    rem = diagnosis.remediation
    lines = [
        f"# Triage of job {job.job_id} ({job.name}){' — DRY RUN' if dry_run else ''}",
        "",
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
            lines.append(f"| {_cell(name)} | {ev.line} | {_cell(names)} | `{_cell(ev.text)}` |")
        if len(by_place) > MAX_EVIDENCE:
            lines.append(f"\n…and {len(by_place) - MAX_EVIDENCE} more evidence lines.")
    else:
        lines.append("No log line matched a signature.")
    if diagnostics is not None:
        lines += [
            "",
            "## Node diagnostics",
            "",
            "| node | reach | nvidia-smi rc | Xid lines |",
            "|---|---|---|---|",
        ]
        for host, outcome in diagnostics.hosts.items():
            facts = diagnostics.facts.get(host, {}).get("trainmedic_diagnostics", {})
            xids = facts.get("xid_lines", []) if isinstance(facts, dict) else []
            rc = facts.get("nvidia_smi_rc", "—") if isinstance(facts, dict) else "—"
            lines.append(f"| {host} | {outcome} | {rc} | {_cell('; '.join(xids[-2:])) or '—'} |")
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


def actions_table(actions: Sequence[ActionRecord]) -> list[str]:
    if not actions:
        return ["No action taken."]
    return [
        "| action | target | outcome | changed |",
        "|---|---|---|---|",
        *(
            f"| {a.what} | {_cell(a.target)} | {_cell(a.outcome)} | "
            f"{'yes' if a.changed else 'no'} |"
            for a in actions
        ),
    ]


def rollback_report(
    *,
    job: JobInfo,
    spike: LossRecord,
    checkpoint: Checkpoint,
    skip: tuple[int, int],
    invalid: Sequence[Checkpoint],
    actions: Sequence[ActionRecord],
    new_job: JobInfo | None,
    dry_run: bool,
) -> str:
    lines = [
        f"# Rollback of job {job.job_id} ({job.name}){' — DRY RUN' if dry_run else ''}",
        "",
        f"- loss spike began at **step {spike.step}** (data batch {spike.batch}, loss "
        f"{spike.loss:.4g})",
        f"- newest valid checkpoint before it: **step {checkpoint.step}** (`{checkpoint.path}`)",
        f"- data batches skipped on resubmission: **{skip[0]}-{skip[1]}**",
        f"- steps lost: {max(spike.step - checkpoint.step, 0)}",
    ]
    lines += [f"- skipped invalid checkpoint step {c.step}: {c.problem}" for c in invalid]
    lines += ["", "## Actions", "", *actions_table(actions)]
    if new_job is not None:
        lines += [
            "",
            f"New job **{new_job.job_id}** ({new_job.state}) on {', '.join(new_job.nodes)}",
        ]
    return "\n".join(lines) + "\n"
