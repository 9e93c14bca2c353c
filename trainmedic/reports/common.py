"""Pieces every runbook report shares: table cells, the actions table, name lists."""

from __future__ import annotations

from collections.abc import Sequence

from trainmedic.core.models import ActionRecord


def cell(text: object) -> str:
    """One Markdown table cell: pipes escaped, one line, bounded."""
    return str(text).replace("|", "\\|").replace("\n", " ")[:300]


def names(values: Sequence[str]) -> str:
    return ", ".join(values) if values else "—"


def dry_run_mark(dry_run: bool) -> str:
    return " — DRY RUN" if dry_run else ""


def actions_table(actions: Sequence[ActionRecord]) -> list[str]:
    if not actions:
        return ["No action taken."]
    return [
        "| action | target | outcome | changed |",
        "|---|---|---|---|",
        *(
            f"| {a.what} | {cell(a.target)} | {cell(a.outcome)} | {'yes' if a.changed else 'no'} |"
            for a in actions
        ),
    ]
