"""Runbook `repair-node`: the repair a drained node's fault needs, then its burn-in and return.

    drained by trainmedic? (repairs touch only trainmedic's own drains) → not waiting for
    hardware inspection, not a lemon → read the node (playbooks/collect_node_diagnostics.yml:
    its kernel log with times, nvidia-smi) → plan the repair (trainmedic.decisions.repair:
    NVIDIA's action for each fresh Xid, else the drain's verdict; a fault that came back after
    its repair escalates) → hardware inspection: mark it (never returned automatically), page
    → reset or reboot: ask a human (policy ``repair_approval``, default on; no answer in time
    repairs nothing) → the repair (playbooks/repair_node.yml; counted by the circuit breaker
    and kept as a repair record) → restore-node: burn-in (DCGM diagnostic, pair test at the
    reference bandwidth) and, if it passes, back in service → Markdown report

A failed repair or burn-in leaves the node drained with the evidence; the next repair of the
same fault is the escalation's business.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from pydantic import BaseModel, ConfigDict, Field

from flows.restore import RestoreRequest, RestoreResult, restore_node
from flows.tasks import (
    ask_yes_no,
    collect_node_diagnostics,
    guarded,
    server_state,
    tell_human,
)
from trainmedic.adapters.ansible import Inventory, run_playbook
from trainmedic.adapters.scheduler import get_scheduler
from trainmedic.core.models import HostOutcome, NodeInfo, NodeName, NodeState, PlaybookResult
from trainmedic.core.settings import get_settings
from trainmedic.decisions.guard import lemon
from trainmedic.decisions.ownership import drain_owner
from trainmedic.decisions.repair import RepairKind, RepairPlan, RepairPolicy, plan_repair
from trainmedic.reports.nodes import repair_report
from trainmedic.state.records import ActionKind, DrainRecord, RepairRecord

__all__ = ["RepairRequest", "RepairResult", "repair_node"]


class RepairRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node: NodeName = Field(description="the node trainmedic drained")
    approval_timeout_s: int = Field(default=1800, ge=10, le=86_400)
    dry_run: bool = Field(default=False, description="plan and check, repair nothing")


class RepairResult(BaseModel):
    node: str
    outcome: str  # one line: what happened
    repair: str = ""  # reset_gpu | reboot | inspect | none; "" when nothing was planned
    fault: str = ""
    why: str = ""
    escalated: bool = False
    decided_by: str = ""
    repaired: bool = False  # the repair ran and succeeded
    inspection: bool = False  # marked for hardware inspection (kept out)
    restored: bool = False  # back in service after its burn-in
    restore: RestoreResult | None = None
    evidence: list[str] = Field(default_factory=list)
    human_needed: str | None = None  # the node is still out: what a human has to do or know
    report_key: str = ""


@task(name="repair-with-playbook", cache_policy=NO_CACHE)
def repair_with_playbook(
    node: str, plan: RepairPlan, reason: str, dry_run: bool
) -> tuple[PlaybookResult, dict[str, object]]:
    """playbooks/repair_node.yml: the reset or the reboot. Counted by the circuit breaker
    (and refused while it is open) before it starts: the guard lock is held for the check and
    the record only, never across a reboot that may take minutes."""
    if not dry_run:
        kind = ActionKind.reset_gpu if plan.kind is RepairKind.reset_gpu else ActionKind.reboot
        with guarded(kind, node) as action:
            action.changed = True
    result = run_playbook(
        "repair_node.yml",
        [node],
        {
            "trainmedic_repair": str(plan.kind),
            "trainmedic_repair_reason": reason,
            "trainmedic_repair_gpus": list(plan.gpus),
        },
        check=dry_run,
    )
    facts = result.facts.get(node, {}).get("trainmedic_repaired")
    return result, facts if isinstance(facts, dict) else {}


@flow(name="repair-node", log_prints=True, persist_result=True, result_serializer="json")
def repair_node(request: RepairRequest) -> RepairResult:
    settings = get_settings()
    logger = get_run_logger()
    node = Inventory(settings.inventory).check([request.node], "node")[0]
    run_name = flow_run.get_name() or "local"
    result = RepairResult(node=node, outcome="", report_key=f"repair-{node}")
    store = server_state()
    current = _node(node)
    record = store.drain_record(node)
    ownership = drain_owner(current, record) if current else None
    if current is None or current.state is not NodeState.DRAINED:
        state = current.state if current else "unknown to the scheduler"
        return _finish(result, request, f"not repaired: {node} is {state}, not drained by us")
    if record is None or ownership is None or not ownership.ours:
        why = ownership.why if ownership else "no drain record"
        return _finish(result, request, f"refused: not trainmedic's drain ({why})")
    if record.inspection:
        return _finish(
            result,
            request,
            f"not repaired: waiting for hardware inspection ({record.inspection})",
            inspection=True,
        )
    now = datetime.now(UTC)
    drained = lemon(
        store.actions(),
        node,
        now,
        drains=settings.lemon_drains,
        window_days=settings.lemon_window_days,
    )
    if drained:
        return _needs_inspection(result, request, record, f"a lemon: {drained}", fault="lemon")

    diagnostics = collect_node_diagnostics([node], dry_run=False)
    if diagnostics.hosts.get(node) is HostOutcome.unreachable:
        why = f"{node} does not answer over SSH: power-cycle it through its BMC, or hands on it"
        return _needs_inspection(result, request, record, why, fault="unreachable")
    facts = diagnostics.facts.get(node, {}).get("trainmedic_diagnostics") or {}
    lines = [str(x) for x in facts.get("xid_lines") or []] if isinstance(facts, dict) else []
    plan = plan_repair(
        node,
        kernel_lines=lines,
        verdict=record.verdict or record.evidence,
        drained_at=record.at,
        history=store.repairs(node),
        now=now,
        policy=RepairPolicy(
            escalate_after=settings.repair_escalate_after,
            window=timedelta(days=settings.repair_window_days),
        ),
    )
    logger.info("%s: %s for %s (%s)", node, plan.kind, plan.fault, plan.why)
    result = result.model_copy(
        update={
            "repair": str(plan.kind),
            "fault": plan.fault,
            "why": plan.why,
            "escalated": plan.escalated,
            "evidence": list(plan.evidence),
        }
    )
    if plan.kind is RepairKind.inspect:
        return _needs_inspection(result, request, record, plan.why, fault=plan.fault)

    if plan.kind is not RepairKind.none:
        approved, decided_by = _approval(node, plan, request)
        result = result.model_copy(update={"decided_by": decided_by})
        if not approved:
            return _finish(result, request, f"not repaired: {decided_by}")
        # Ownership again, right before acting: an admin may have drained it meanwhile.
        now_node = _node(node)
        if now_node is None or not drain_owner(now_node, store.drain_record(node)).ours:
            return _finish(result, request, "refused: drained again by someone else meanwhile")
        reason = f"trainmedic repair-node {run_name}: {plan.kind} for {plan.fault}"
        played, done = repair_with_playbook(node, plan, reason, request.dry_run)
        ok = played.hosts.get(node) is HostOutcome.ok
        if not request.dry_run:
            store.record_repair(
                RepairRecord(
                    node=node,
                    fault=plan.fault,
                    kind=str(plan.kind),
                    at=datetime.now(UTC),
                    flow_run=run_name,
                    outcome="done" if ok else f"failed: {played.hosts.get(node)}",
                )
            )
        output = [str(x) for x in done.get("reset_output") or []]  # type: ignore[union-attr]
        result = result.model_copy(update={"repaired": ok and not request.dry_run})
        if not ok:
            result = result.model_copy(update={"evidence": [*result.evidence, *output]})
            return _finish(result, request, f"{plan.kind} failed ({played.hosts.get(node)})")
        if request.dry_run:
            return _finish(result, request, f"dry run: would {plan.kind} and burn in")

    restored = restore_node(RestoreRequest(node=node, dry_run=request.dry_run))
    result = result.model_copy(update={"restore": restored, "restored": restored.restored})
    did = f"{plan.kind}, then " if plan.kind is not RepairKind.none else "nothing to repair; "
    return _finish(result, request, f"{did}burn-in: {restored.verdict} ({restored.reason})")


def _node(node: str) -> NodeInfo | None:
    return next((n for n in get_scheduler().nodes() if n.name == node), None)


def _needs_inspection(
    result: RepairResult, request: RepairRequest, record: DrainRecord, why: str, *, fault: str
) -> RepairResult:
    """Keep the node out for a technician: recorded on its drain record (restore refuses it
    from then on, unless a named human forces it after the inspection), and on-call paged."""
    result = result.model_copy(update={"repair": str(RepairKind.inspect), "why": why})
    if request.dry_run:
        return _finish(result, request, f"dry run: would mark for hardware inspection ({why})")
    server_state().record_drain(record.model_copy(update={"inspection": why[:300]}))
    tell_human(
        "page",
        job_id=record.job_id,
        category="hardware inspection",
        summary=f"{result.node} needs hardware inspection ({fault}): {why}",
        evidence="; ".join(result.evidence[-3:]) or record.evidence,
        answer=f"inspect {result.node}; once it is fixed `trainmedic restore {result.node} "
        "--force --by NAME --reason TEXT` (burn-in, then back in service)",
    )
    return _finish(result, request, f"needs hardware inspection: {why}", inspection=True)


def _approval(node: str, plan: RepairPlan, request: RepairRequest) -> tuple[bool, str]:
    if request.dry_run:
        asked = get_settings().repair_approval
        return True, "dry run" + (" (approval would be asked)" if asked else "")
    if not get_settings().repair_approval:
        return True, "policy (repairs approved automatically)"
    return ask_yes_no(
        job_id=None,
        category="repair",
        asks=f"to {plan.kind} {node} for {plan.fault}: {plan.why}",
        evidence="; ".join(plan.evidence[-3:]) or plan.why,
        prompt="\n".join(
            [
                f"### {plan.kind} {node}? ({plan.fault})",
                "",
                f"- {plan.why}",
                *[f"- `{line}`" for line in plan.evidence[-3:]],
                "",
                f"Approve to {plan.kind} it, then burn it in and return it if it passes. "
                f"No answer within {request.approval_timeout_s} s: nothing is done.",
            ]
        ),
        timeout_s=request.approval_timeout_s,
    )


def _finish(
    result: RepairResult, request: RepairRequest, outcome: str, *, inspection: bool = False
) -> RepairResult:
    still_out = not result.restored and not request.dry_run
    result = result.model_copy(
        update={
            "outcome": outcome,
            "inspection": inspection,
            "human_needed": f"{result.node} still out of service: {outcome}" if still_out else None,
        }
    )
    log = get_run_logger()
    (log.info if result.restored else log.warning)("%s: %s", result.node, outcome)
    create_markdown_artifact(
        key=result.report_key,
        markdown=repair_report(result.model_dump(), dry_run=request.dry_run),
        description=f"Repair {result.node}: {outcome}"[:500],
    )
    return result
