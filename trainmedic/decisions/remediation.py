"""What to do about a diagnosis: pure decisions, no I/O, no Prefect.

The runbook asks :func:`plan_remediation` and then carries the plan out; every decision carries
its reason, so the report can say *why* a node was drained or a job was not retried.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from pydantic import BaseModel, Field

from trainmedic.core.models import Diagnosis, JobInfo
from trainmedic.core.taxonomy import Action, Category
from trainmedic.diagnosis import suspect_hosts

_RANK_RE = re.compile(r"\brank\s*[:=]?\s*(\d+)\b", re.IGNORECASE)
GC_INTERVAL_STEPS = 50


class Plan(BaseModel):
    action: Action
    origin_node: str | None = None
    drain: tuple[str, ...] = ()
    locate: bool = False
    restart: bool = False
    exclude: tuple[str, ...] = ()
    spec_changes: dict[str, int] = Field(default_factory=dict)
    notify_owner: bool = False
    page_oncall: bool = False
    reasons: tuple[str, ...] = ()


def origin_node(diagnosis: Diagnosis, job: JobInfo) -> str | None:
    """The one job node the winning evidence points at; None when the evidence names no node
    of this job, or several (then the pair test decides)."""
    on_job = [h for h in suspect_hosts(diagnosis) if h in job.nodes]
    if len(on_job) == 1:
        return on_job[0]
    if on_job:
        return None
    rank = _RANK_RE.search(diagnosis.root_cause_host or "")
    if rank is not None:
        index = int(rank[1]) // job.spec.gpus_per_node
        if index < len(job.nodes):
            return job.nodes[index]
    return None


def plan_remediation(
    diagnosis: Diagnosis,
    job: JobInfo,
    *,
    attempts: int = 0,
    retry_budget: int = 3,
    drained: Collection[str] = (),
    same_failure_streak: int = 1,
    crash_loop_after: int = 3,
) -> Plan:
    action = diagnosis.remediation.action
    reasons: list[str] = [
        f"{diagnosis.category} ({diagnosis.layer}): {diagnosis.remediation.summary}"
    ]
    origin = origin_node(diagnosis, job)

    if diagnosis.source == "llm":
        reasons.append(
            "the diagnosis is the LLM fallback's suggestion, not a rule's: a human confirms or "
            "corrects it before anything is drained or restarted"
        )
        return Plan(
            action=Action.investigate, origin_node=origin, page_oncall=True, reasons=tuple(reasons)
        )

    if not diagnosis.remediation.auto_retry:
        reasons.append(
            "not retried automatically: "
            + (
                "a script bug goes to the job owner"
                if action is Action.notify_owner
                else "a human confirms first"
            )
        )
        return Plan(
            action=action,
            origin_node=origin,
            notify_owner=action is Action.notify_owner,
            page_oncall=action is Action.investigate,
            reasons=tuple(reasons),
        )

    if same_failure_streak >= crash_loop_after:
        reasons.append(
            f"crash loop: the same {diagnosis.category} ended the last {same_failure_streak} runs "
            "of this training job; stopping automatic resubmission and paging on-call"
        )
        return Plan(action=action, origin_node=origin, page_oncall=True, reasons=tuple(reasons))

    if attempts >= retry_budget:
        reasons.append(
            f"retry budget spent: resubmitted {attempts} times already (budget {retry_budget}); "
            "paging on-call instead of requeuing"
        )
        return Plan(action=action, origin_node=origin, page_oncall=True, reasons=tuple(reasons))

    drain: tuple[str, ...] = ()
    locate = False
    if action in (Action.isolate_and_retry, Action.locate_and_retry):
        if origin is not None and diagnosis.category not in (Category.Hang,):
            drain = (origin,)
            reasons.append(f"origin node {origin} proven by the evidence: drain it")
        else:
            locate = True
            reasons.append("no proven origin node: pair-test the job's nodes to find it")

    spec_changes: dict[str, int] = {}
    if action is Action.retry_with_changes:
        spec_changes = {"num_workers": 0, "gc_interval": GC_INTERVAL_STEPS}
        reasons.append(f"resubmit with num_workers=0 and GC every {GC_INTERVAL_STEPS} steps")

    exclude = tuple(sorted({*drain, *(n for n in drained if n in job.nodes), *job.spec.exclude}))
    reasons.append(
        f"resubmit from the newest valid checkpoint (attempt {attempts + 1} of {retry_budget})"
        + (f", excluding {', '.join(exclude)}" if exclude else "")
    )
    return Plan(
        action=action,
        origin_node=origin,
        drain=drain,
        locate=locate,
        restart=True,
        exclude=exclude,
        spec_changes=spec_changes,
        reasons=tuple(reasons),
    )
