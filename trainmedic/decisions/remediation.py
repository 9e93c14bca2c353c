"""What to do about a diagnosis: pure decisions, no I/O, no Prefect.

The runbook asks :func:`plan_remediation` and then carries the plan out; every decision carries
its reason, so the report can say *why* a node was drained or a job was not retried.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from pydantic import BaseModel, Field

from trainmedic.core.models import Diagnosis, JobInfo
from trainmedic.core.taxonomy import Action, Category
from trainmedic.core.validate import log_number
from trainmedic.decisions.attempts import exclusions
from trainmedic.diagnosis import far_ends, suspect_hosts, task_hosts
from trainmedic.diagnosis.synthetic import UNEXPLAINED_END
from trainmedic.diagnosis.xid import APPLICATION_XID

_RANK_RE = re.compile(r"\brank\s*[:=]?\s*(\d+)\b", re.IGNORECASE)
GC_INTERVAL_STEPS = 50
# Below this confidence no automatic destructive action (a drain, a rollback) is taken: the
# pair test proves or clears a node, a human confirms a rollback. Settings.confidence_floor
# (TRAINMEDIC_CONFIDENCE_FLOOR) sets it per installation; this is its default.
DEFAULT_CONFIDENCE_FLOOR = 0.5
# Diagnoses no rule made: a suggestion a human confirms before any action.
SUGGESTIONS = {
    "llm": "the LLM fallback's suggestion",
    "learned": "the labelled corpus's word table's suggestion (no signature matched)",
}
# A log that only stops, with no word of an error, suggests a hang but proves none: a script's
# crash whose last lines were lost reads the same, so a human looks before any retry.
_GUESSES = {UNEXPLAINED_END.id: "a guess from a log that ends with no word of an error"}


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


# Evidence that a node's hardware is at fault: with it, an application Xid is not the story.
HARDWARE_CATEGORIES = frozenset({Category.GPUFallenOff, Category.ECCError, Category.NVLinkError})


# What an unsure diagnosis must not do on its own: each of these acts on the job as if the
# diagnosis were proven (a suspected host OOM from a SIGKILL alone: the kill may have been an
# operator's).
_CONFIRMED_FIRST = {
    Action.rollback: "a rollback discards training progress and skips data",
    Action.retry_with_changes: "a resubmission with changed settings acts on an unproven cause",
}


# Evidence of the application's own fault: what NVIDIA reads so, an application-class Xid (13,
# 31, 43, 45, ...) and a kernel's illegal memory access, illegal address or illegal
# instruction; and GPU code the job's install cannot load on this GPU (no kernel image for its
# architecture, a symbol its module lacks), which follows the job to any node it lands on.
APPLICATION_SIGNATURES = frozenset({APPLICATION_XID, "cuda-illegal-access", "gpu-code-unloadable"})


def application_fault(diagnosis: Diagnosis) -> bool:
    """A GPU fault that is the application's (an application-class Xid, an illegal memory
    access, GPU code its install cannot load), with no hardware evidence (a hardware Xid, ECC
    or NVLink line, telemetry) anywhere in the logs."""
    if diagnosis.category is not Category.CUDAError:
        return False
    signatures = {e.signature for e in diagnosis.evidence}
    hardware = any(e.category in HARDWARE_CATEGORIES for e in diagnosis.evidence)
    return bool(APPLICATION_SIGNATURES & signatures) and not hardware


def origin_node(diagnosis: Diagnosis, job: JobInfo) -> str | None:
    """The one job node the winning evidence points at; None when the evidence names no node
    of this job, or several, or names only a rank whose node the logs contradict (then the
    pair test decides)."""
    on_job = [h for h in suspect_hosts(diagnosis) if h in job.nodes]
    if len(on_job) == 1:
        return on_job[0]
    if on_job:
        return None
    found = _RANK_RE.search(diagnosis.root_cause_host or "")
    rank = log_number(found[1]) if found is not None else None
    if rank is not None:
        # Where a rank ran is a guess from the job's node order (block distribution). The
        # logs' own srun lines may say otherwise (the batch host is not always the first
        # node): then the guess is wrong or the task ids are not ranks, and no node is named.
        index = rank // job.spec.gpus_per_node
        tied = task_hosts(diagnosis).get(rank, set())
        if index < len(job.nodes) and not (tied and job.nodes[index] not in tied):
            return job.nodes[index]
    return None


def plan_remediation(
    diagnosis: Diagnosis,
    job: JobInfo,
    *,
    attempts: int = 0,
    retry_budget: int = 3,
    drained: Collection[str] = (),
    failure_streak: int = 1,
    crash_loop_after: int = 3,
    streak_categories: Sequence[str] = (),
    confidence_floor: float = DEFAULT_CONFIDENCE_FLOOR,
) -> Plan:
    action = diagnosis.remediation.action
    unsure = diagnosis.confidence < confidence_floor
    reasons: list[str] = [
        f"{diagnosis.category} ({diagnosis.layer}): {diagnosis.remediation.summary}"
    ]
    origin = origin_node(diagnosis, job)

    guess = next(
        (_GUESSES[e.signature] for e in diagnosis.evidence[:1] if e.signature in _GUESSES), None
    )
    if diagnosis.source in SUGGESTIONS or guess is not None:
        said = SUGGESTIONS.get(diagnosis.source) or guess
        reasons.append(
            f"the diagnosis is {said}, not a rule's proof: a human confirms "
            "or corrects it before anything is drained or restarted"
        )
        return Plan(
            action=Action.investigate, origin_node=origin, page_oncall=True, reasons=tuple(reasons)
        )

    if application_fault(diagnosis):
        reasons.append(
            "an application-class GPU fault (an illegal memory access, an application-class "
            "Xid: NVIDIA reads these as the program's own; or GPU code its install cannot load "
            "on this GPU) and no hardware evidence beside it: "
            "sent to the job owner; no node is drained or tested, the job is not retried "
            "automatically"
        )
        return Plan(
            action=Action.notify_owner,
            origin_node=origin,
            notify_owner=True,
            reasons=tuple(reasons),
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

    if unsure and action in _CONFIRMED_FIRST:
        reasons.append(
            f"confidence {diagnosis.confidence:.2f} is below the floor {confidence_floor:.2f}: "
            f"{_CONFIRMED_FIRST[action]}, so a human confirms the diagnosis first"
        )
        return Plan(
            action=Action.investigate, origin_node=origin, page_oncall=True, reasons=tuple(reasons)
        )

    if failure_streak >= crash_loop_after:
        seen = f" (diagnosed as {', '.join(streak_categories)})" if streak_categories else ""
        reasons.append(
            f"crash loop: the last {failure_streak} runs of this training job failed{seen}; "
            "stopping automatic resubmission and paging on-call"
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
        peers = [h for h in far_ends(diagnosis) if h in job.nodes]
        if origin is None and peers:
            locate = True
            reasons.append(
                f"the evidence names {', '.join(peers)} only as the far end of a connection "
                "that broke, printed by its peer: not proof of a fault there (its process may "
                "have died of its own error, or the path between failed); pair-test the job's "
                "nodes to prove or clear it"
            )
        elif origin is None or diagnosis.category is Category.Hang:
            locate = True
            reasons.append("no proven origin node: pair-test the job's nodes to find it")
        elif diagnosis.symptom_only:
            locate = True
            reasons.append(
                f"the evidence on {origin} is a symptom (what the other ranks see when something "
                "broke elsewhere), not a cause: no node is drained on it; pair-test the job's "
                "nodes to find the origin"
            )
        elif unsure:
            locate = True
            reasons.append(
                f"confidence {diagnosis.confidence:.2f} is below the floor "
                f"{confidence_floor:.2f}: {origin} is not drained on this evidence; pair-test "
                "the job's nodes to prove or clear it"
            )
        else:
            drain = (origin,)
            reasons.append(f"origin node {origin} proven by the evidence: drain it")

    spec_changes: dict[str, int] = {}
    if action is Action.retry_with_changes:
        spec_changes = {"num_workers": 0, "gc_interval": GC_INTERVAL_STEPS}
        reasons.append(f"resubmit with num_workers=0 and GC every {GC_INTERVAL_STEPS} steps")

    exclude = exclusions(job, drained, drain)
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
