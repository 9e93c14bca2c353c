"""The isolation step every runbook shares: drain nodes convicted by evidence (a proven
origin in triage, pair tests in locate), through the one policy that decides who may drain
what without a human.

    decide (trainmedic.decisions.guard: auto-approve size, blast radius, rate limit)
    → if needed, pause for a human (typed form: approve / reject / approve subset, timeout)
    → drain each approved node (reason names the run; a drain record kept on the server)
    → stop what the failed job still runs there (its own steps only, never another job)
    → playbooks/isolate_node.yml on them (isolation marker, collect Xid / nvidia-smi / dcgmi),
      in the background: ``start_isolation`` returns once the scheduler holds the nodes out

The decision and the drains it allows happen under one hold of the cluster's guard lock (on
the Prefect server): two isolations at once cannot both fit under a guard that has room for
one. The lock is never held across a human's approval; an approved isolation takes it again
to drain, and each drain still passes the circuit breaker.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Literal

from prefect import get_run_logger, pause_flow_run, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import FlowPauseTimeout
from prefect.futures import PrefectFuture
from prefect.input import RunInput
from prefect.runtime import flow_run
from pydantic import Field

from flows.tasks import drain_node, server_state, stop_job_on_node, tell_human
from trainmedic.adapters.ansible import run_playbook
from trainmedic.adapters.scheduler import get_scheduler
from trainmedic.core import validate
from trainmedic.core.models import ActionRecord, IsolationOutcome, NodeName, PlaybookResult
from trainmedic.core.settings import get_settings
from trainmedic.decisions.guard import (
    IsolationDecision,
    approved_nodes,
    decide_isolation,
    isolation_policy,
    recent_drains,
)
from trainmedic.decisions.ownership import drain_reason
from trainmedic.state import ActionEntry

__all__ = [
    "IsolationApproval",
    "IsolationOutcome",
    "PendingIsolation",
    "isolate",
    "start_isolation",
]


class IsolationApproval(RunInput):
    """A human's answer to "drain these nodes?"."""

    decision: Literal["approve", "reject", "approve_subset"] = Field(
        description="approve all, reject all, or approve only the nodes listed"
    )
    nodes: list[NodeName] = Field(
        default_factory=list, description="for approve_subset: the nodes to drain"
    )
    note: str = Field(
        default="",
        max_length=200,
        pattern=validate.SAFE_TEXT_RE.pattern,
        description="why (goes into the report)",
    )
    by: str = Field(
        default="",
        max_length=64,
        pattern=validate.SAFE_TEXT_RE.pattern,
        description="who answers (goes into the report)",
    )


@task(name="isolate-nodes", cache_policy=NO_CACHE)
def isolate_nodes(nodes: list[str], reason: str, dry_run: bool) -> PlaybookResult:
    """playbooks/isolate_node.yml: mark isolated, collect the evidence."""
    return run_playbook(
        "isolate_node.yml", nodes, {"trainmedic_isolation_reason": reason}, check=dry_run
    )


def isolate(
    verdicts: dict[str, str],
    *,
    runbook: str,
    evidence: str,
    approval_timeout_s: int,
    job_id: str | None,
    dry_run: bool,
) -> IsolationOutcome:
    """Isolate ``verdicts`` (node → what convicted it, e.g. "faulty", "ECCError") under this
    installation's policy (server-side settings, never a run's parameters)."""
    return start_isolation(
        verdicts,
        runbook=runbook,
        evidence=evidence,
        approval_timeout_s=approval_timeout_s,
        job_id=job_id,
        dry_run=dry_run,
    ).finish()


@dataclasses.dataclass
class PendingIsolation:
    """An isolation whose nodes are drained (or not) and whose marker playbook is running:
    ``finish()`` waits for it and gives the outcome with the evidence it collected."""

    outcome: IsolationOutcome
    playbook: PrefectFuture[PlaybookResult] | None

    def finish(self) -> IsolationOutcome:
        if self.playbook is None:
            return self.outcome
        result = self.playbook.result()
        found: dict[str, dict[str, object]] = {}
        for host, facts in result.facts.items():
            collected = facts.get("trainmedic_isolation")
            found[host] = {
                "outcome": str(result.hosts.get(host)),
                **(collected if isinstance(collected, dict) else {}),
            }
        self.playbook = None
        self.outcome = self.outcome.model_copy(update={"evidence": found})
        return self.outcome


def start_isolation(
    verdicts: dict[str, str],
    *,
    runbook: str,
    evidence: str,
    approval_timeout_s: int,
    job_id: str | None,
    dry_run: bool,
) -> PendingIsolation:
    """``isolate`` up to the drains and the stops, with the marker playbook started in the
    background: the scheduler's drain already keeps jobs off the nodes, so a resubmission
    need not wait for the marker and the evidence collection (seconds of Ansible)."""
    logger = get_run_logger()
    candidates = list(verdicts)
    store = server_state()
    run_name = flow_run.get_name() or "local"
    actions: list[ActionRecord] = []

    def drain_all(nodes: list[str]) -> None:
        for node in nodes:
            reason = drain_reason(runbook, run_name, verdicts[node], evidence, job_id)
            actions.append(
                drain_node(
                    node,
                    reason,
                    dry_run,
                    evidence=f"{verdicts[node]} {evidence}",
                    job_id=job_id,
                    verdict=verdicts[node],
                )
            )

    def stop_all(nodes: list[str]) -> None:
        # Only once the drains are recorded, and only the failed job's own work there. Under
        # the same hold of the lock as the drains: one acquisition, not one per action (each
        # costs seconds when a busy SQLite server answers 503 and the client backs off).
        for node in nodes if job_id else []:
            reason = drain_reason(runbook, run_name, verdicts[node], evidence, job_id)
            actions.append(stop_job_on_node(job_id, node, reason, dry_run))

    with store.lock():
        decision = _decide(candidates, store.actions())
        logger.info("isolation of %s: %s %s", candidates, decision.mode, list(decision.reasons))
        asks_human = decision.needs_approval and not dry_run
        if not asks_human:
            approved, ignored, decided_by = _approve(decision, approval_timeout_s, dry_run)
            drain_all(approved)
            stop_all(approved)
    if asks_human:
        # Never holding the lock while a human thinks: the answer takes it again to drain.
        actions.append(_ask_for_approval(decision, approval_timeout_s, job_id, evidence))
        approved, ignored, decided_by = _approve(decision, approval_timeout_s, dry_run)
        actions.append(ActionRecord(what="approval", target="on-call", outcome=decided_by))
        with store.lock():
            drain_all(approved)
            stop_all(approved)

    playbook = None
    if approved:
        playbook = isolate_nodes.submit(approved, f"{runbook} {run_name}", dry_run)
    outcome = IsolationOutcome(
        mode=decision.mode,
        decided_by=decided_by,
        candidates=candidates,
        approved=approved,
        drained=[a.target for a in actions if a.what == "drain" and a.changed],
        already_drained=list(decision.already_drained),
        reasons=list(decision.reasons),
        ignored=ignored,
        actions=actions,
    )
    return PendingIsolation(outcome=outcome, playbook=playbook)


def _decide(candidates: list[str], actions: list[ActionEntry]) -> IsolationDecision:
    policy = isolation_policy(get_settings())
    cluster = get_scheduler().nodes()
    drained = {n.name for n in cluster if n.state == "DRAINED"}
    recent = recent_drains(actions, datetime.now(UTC), policy.window_s)
    return decide_isolation(
        candidates, cluster_size=len(cluster), drained=drained, recent=recent, policy=policy
    )


def _ask_for_approval(
    decision: IsolationDecision, approval_timeout_s: int, job_id: str | None, evidence: str
) -> ActionRecord:
    """Tell on-call what is asked and the exact line that answers it."""
    run_name = flow_run.get_name() or "local"
    nodes = ",".join(decision.nodes)
    return tell_human(
        "approval.needed",
        job_id=job_id,
        category="isolation",
        summary=f"{run_name} asks to drain {len(decision.nodes)} node(s) {nodes}: "
        + "; ".join(decision.reasons),
        evidence=evidence,
        answer=f"`trainmedic approve {run_name} --reason TEXT` (or --nodes {nodes} for a "
        f"subset, or --reject); no answer within {approval_timeout_s} s drains nothing",
    )


def _approve(
    decision: IsolationDecision, approval_timeout_s: int, dry_run: bool
) -> tuple[list[str], list[str], str]:
    """The approved nodes, the ignored ones, and who decided."""
    if decision.mode == "none":
        return [], [], "nothing new to drain"
    if decision.mode == "auto":
        return list(decision.nodes), [], "policy (auto-approved)"
    if dry_run:
        # Nothing will be drained anyway: show the evidence as if a human had said yes.
        return list(decision.nodes), [], "dry run (approval would be asked)"
    logger = get_run_logger()
    prompt = "\n".join(
        [
            f"### Drain {len(decision.nodes)} node(s)? {', '.join(decision.nodes)}",
            "",
            *[f"- {reason}" for reason in decision.reasons],
            "",
            "`approve` all, `reject` all, or `approve_subset` with the nodes to drain. "
            f"No answer within {approval_timeout_s} s: nothing is drained.",
        ]
    )
    try:
        answer = pause_flow_run(
            wait_for_input=IsolationApproval.with_initial_data(
                description=prompt, decision="reject", nodes=list(decision.nodes)
            ),
            timeout=approval_timeout_s,
            poll_interval=2,
        )
    except FlowPauseTimeout:
        logger.warning("no approval within %d s: nothing drained", approval_timeout_s)
        return [], [], f"approval timed out after {approval_timeout_s} s: nothing drained"
    approved, ignored = approved_nodes(decision, answer.decision, answer.nodes)
    if ignored:
        logger.warning("approval named nodes that were not convicted, ignored: %s", ignored)
    note = f": {answer.note}" if answer.note else ""
    who = f" ({answer.by})" if answer.by else ""
    return approved, ignored, f"human{who}: {answer.decision}{note}"
