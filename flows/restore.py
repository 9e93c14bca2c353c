"""Runbook `restore-node`: a repaired node goes back into service only after it passes its
burn-in, and only when trainmedic drained it.

    drained by trainmedic? (its drain record, and the scheduler's reason still ours: an
    admin's drain, a re-drain after ours, Slurm FAIL/DOWN are never returned, unless a named
    human forces it with a reason) → not a lemon, not waiting for hardware inspection (both
    only with --force) → burn-in: the DCGM diagnostic (`dcgmi diag -r burn_in_dcgm_level`,
    playbooks/burn_in.yml) → pick a known-healthy partner (IDLE, not drained) → pair test with
    it, alongside a reference test between two other idle nodes when there are any (same run,
    no extra wall time) → pass: remove the isolation marker, then resume in the scheduler (so
    the site's health check never sees a resumed node still marked), then forget the drain
    record; fail: keep it drained and say why → Markdown report

"Pass" means what it means in the locate runbook: the test completes, at no less than
``slow_ratio`` of the reference bus bandwidth (a repaired link that is still slow stays out).
"""

from __future__ import annotations

from datetime import UTC, datetime

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flows.locate import HOLD_S, release_hold, run_pair_tests
from flows.tasks import server_state
from trainmedic.adapters.ansible import Inventory, run_playbook
from trainmedic.adapters.scheduler import get_scheduler
from trainmedic.core import validate
from trainmedic.core.errors import InputError
from trainmedic.core.models import (
    HostOutcome,
    NodeInfo,
    NodeName,
    NodeState,
    PairResult,
    PlaybookResult,
)
from trainmedic.core.settings import get_settings
from trainmedic.decisions.guard import lemon
from trainmedic.decisions.ownership import Ownership, drain_owner
from trainmedic.locate import Group, Verdict, judge_round
from trainmedic.reports.nodes import restore_report

__all__ = ["RestoreRequest", "RestoreResult", "choose_partners", "restore_node"]


class RestoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node: NodeName = Field(description="the drained node to return to service")
    partner: NodeName | None = Field(default=None, description="test partner (IDLE, not drained)")
    slow_ratio: float = Field(default=0.5, gt=0.0, le=1.0)
    reference_gbps: float | None = Field(
        default=None, gt=0, description="nominal pair bus bandwidth; default: measured now"
    )
    test_timeout_s: int | None = Field(default=None, ge=5, le=3600)
    dry_run: bool = Field(default=False, description="test, but change nothing")
    force: bool = Field(
        default=False,
        description="return a node trainmedic did not drain (an admin's, FAIL, re-drained); "
        "needs forced_by and force_reason, both recorded",
    )
    forced_by: str | None = Field(
        default=None, max_length=64, pattern=validate.SAFE_TEXT_RE.pattern, description="who"
    )
    force_reason: str | None = Field(
        default=None, max_length=200, pattern=validate.SAFE_TEXT_RE.pattern, description="why"
    )

    @model_validator(mode="after")
    def _force_is_owned_by_a_human(self) -> RestoreRequest:
        if self.force and not (self.forced_by and self.force_reason):
            missing = "forced_by" if not self.forced_by else "force_reason"
            raise InputError(missing, None, "--force needs a named human and a reason")
        return self


class RestoreResult(BaseModel):
    node: str
    partner: str | None
    restored: bool
    verdict: str
    reason: str
    busbw_gbps: float | None
    reference_gbps: float | None
    report_key: str
    owner: str = ""  # whose drain it was, one sentence
    burn_in: list[str] = Field(default_factory=list)  # the DCGM diagnostic's result lines


def choose_partners(
    node: str, nodes: list[NodeInfo], partner: str | None = None
) -> tuple[str, Group | None]:
    """The test partner, and a reference pair of two other idle nodes when there are two.

    Only IDLE nodes qualify: a drained or down node is not known healthy, and an allocated
    one is running someone's training."""
    idle = sorted(n.name for n in nodes if n.state is NodeState.IDLE and n.name != node)
    if partner is not None:
        if partner == node:
            raise InputError("partner", partner, "cannot be the node itself")
        if partner not in idle:
            state = next((str(n.state) for n in nodes if n.name == partner), "unknown")
            raise InputError("partner", partner, f"not IDLE (it is {state}): not known healthy")
    elif idle:
        partner = idle[0]
    else:
        raise InputError("partner", None, "no IDLE node to test with")
    others = [n for n in idle if n != partner]
    return partner, (others[0], others[1]) if len(others) >= 2 else None


@task(name="unisolate-node", cache_policy=NO_CACHE)
def unisolate_node(node: str, reason: str, dry_run: bool) -> PlaybookResult:
    """playbooks/isolate_node.yml with state absent: remove the isolation marker."""
    return run_playbook(
        "isolate_node.yml",
        [node],
        {"trainmedic_isolation_state": "absent", "trainmedic_isolation_reason": reason},
        check=dry_run,
    )


@task(name="burn-in-node", cache_policy=NO_CACHE)
def burn_in_node(node: str, level: int) -> tuple[bool, list[str]]:
    """playbooks/burn_in.yml: the DCGM diagnostic at ``level``. Passed, and its result lines
    (an unreachable node has none, and has not passed)."""
    result = run_playbook("burn_in.yml", [node], {"trainmedic_burn_in_level": level})
    facts = result.facts.get(node, {}).get("trainmedic_burn_in")
    if not isinstance(facts, dict):
        return False, [f"{node}: {result.hosts.get(node, 'no answer')}"]
    lines = [str(line) for line in facts.get("dcgmi") or []]
    return str(facts.get("dcgmi_rc")) == "0", lines


@flow(name="restore-node", log_prints=True, persist_result=True, result_serializer="json")
def restore_node(request: RestoreRequest) -> RestoreResult:
    settings = get_settings()
    logger = get_run_logger()
    node = Inventory(settings.inventory).check([request.node], "node")[0]
    scheduler = get_scheduler()
    nodes = scheduler.nodes()
    current = next((n for n in nodes if n.name == node), None)
    result = RestoreResult(
        node=node,
        partner=None,
        restored=False,
        verdict="",
        reason="",
        busbw_gbps=None,
        reference_gbps=request.reference_gbps,
        report_key=f"restore-{node}",
    )

    if current is None or current.state not in (NodeState.DRAINED, NodeState.DOWN):
        state = current.state if current else "unknown to the scheduler"
        return _finish(
            result, request, verdict="not drained", reason=f"{node} is {state}: nothing to restore"
        )
    store = server_state()
    ownership = drain_owner(current, store.drain_record(node))
    result = result.model_copy(update={"owner": _owner_line(ownership, request)})
    if not ownership.ours and not request.force:
        return _finish(
            result,
            request,
            verdict="refused: not trainmedic's drain",
            reason=f"{ownership.why}; only its owner returns it (or `trainmedic restore "
            f"{node} --force --by NAME --reason TEXT`)",
        )
    drained = lemon(
        store.actions(),
        node,
        datetime.now(UTC),
        drains=settings.lemon_drains,
        window_days=settings.lemon_window_days,
    )
    if drained and not request.force:
        return _finish(
            result,
            request,
            verdict="refused: a lemon",
            reason=f"{node} was {drained}: it needs hardware inspection, not another return "
            f"(`trainmedic restore {node} --force --by NAME --reason TEXT` after it)",
        )
    record = store.drain_record(node)
    if record is not None and record.inspection and not request.force:
        return _finish(
            result,
            request,
            verdict="refused: needs hardware inspection",
            reason=f"{record.inspection}; after the inspection `trainmedic restore {node} "
            "--force --by NAME --reason TEXT`",
        )
    if current.state is NodeState.DOWN:
        return _finish(
            result, request, verdict="kept out: down", reason=f"{node} is DOWN: repair it first"
        )
    logger.info("restoring %s (%s)", node, result.owner)

    level = settings.burn_in_dcgm_level
    if level:
        passed_diag, diag = burn_in_node(node, level)
    else:  # a site without DCGM: said in the report, never passed off as a diagnostic
        passed_diag, diag = True, ["no DCGM diagnostic: TRAINMEDIC_BURN_IN_DCGM_LEVEL=0"]
    result = result.model_copy(update={"burn_in": diag})
    if not passed_diag:
        failed = [
            ": ".join(cell.strip() for cell in line.split("|") if cell.strip())
            for line in diag
            if "Fail" in line or "ssh:" in line
        ]
        return _finish(
            result,
            request,
            verdict="kept drained: burn-in failed",
            reason=f"dcgmi diag -r {level}: " + ("; ".join(failed) or "; ".join(diag[-3:]))[:300],
        )

    partner, results = _pair_test_with_held_partners(node, request)
    if results is None:
        return _finish(
            result,
            request,
            verdict="kept drained: no partner",
            reason=f"{partner} took a job before it could be held for the pair test; "
            "run the restore again",
        )
    test = next(r for r in results if set(r.nodes) == {node, partner})
    reference = request.reference_gbps or _reference(results, node)
    verdict = judge_round([test], request.slow_ratio, reference)[0]
    result = result.model_copy(
        update={"partner": partner, "busbw_gbps": test.busbw_gbps, "reference_gbps": reference}
    )

    if verdict is Verdict.ERROR:
        return _finish(
            result,
            request,
            verdict="kept drained: error",
            reason=f"pair test with {partner}: {test.error}",
        )
    if verdict is Verdict.SLOW:
        return _finish(
            result,
            request,
            verdict="kept drained: slow",
            reason=f"pair test with {partner}: busbw {test.busbw_gbps} GB/s "
            f"< {request.slow_ratio} x {reference} GB/s",
        )
    if reference is None:
        logger.warning("no reference bandwidth (no other idle pair): only errors are detected")
    diagnosed = f"dcgmi diag -r {level} and " if level else ""
    passed = f"{diagnosed}the pair test with {partner} passed"
    if request.dry_run:
        return _finish(result, request, verdict="would restore (dry run)", reason=passed)
    # Ownership again, right before acting: an admin may have drained it again meanwhile.
    now = next((n for n in scheduler.nodes() if n.name == node), current)
    if not request.force and not drain_owner(now, store.drain_record(node)).ours:
        return _finish(
            result,
            request,
            verdict="refused: drained again during the test",
            reason=f"{node} now: {now.reason!r}",
        )
    # The marker first: the site's health check must never find a resumed node still marked.
    removed = unisolate_node(node, f"restore-node {flow_run.get_name() or 'local'}", dry_run=False)
    if removed.hosts.get(node) != HostOutcome.ok:
        # Still marked (or unknown): resumed, the node would be failed by the site's health
        # check, or run jobs while marked out of service. It stays drained, ours, for a human.
        return _finish(
            result,
            request,
            verdict="kept drained: isolation marker not removed",
            reason=f"isolate_node.yml (absent) on {node}: {removed.hosts.get(node, 'no answer')}",
        )
    scheduler.resume(node)
    store.forget_drain(node)
    return _finish(result, request, verdict="restored", reason=passed, restored=True)


def _pair_test_with_held_partners(
    node: str, request: RestoreRequest
) -> tuple[str, list[PairResult] | None]:
    """The partner and the pair tests of ``node`` with it (and of a reference pair), the
    partners chosen from the cluster as it is now (the burn-in took minutes) and held for the
    test: a job placed on them meanwhile would be tested under, and slowed by, someone's
    training. No results when the partner could not be held."""
    scheduler = get_scheduler()
    partner, reference_pair = choose_partners(node, scheduler.nodes(), request.partner)
    wanted = [partner, *(reference_pair or ())]
    hold = f"trainmedic-restore-{node}-{(flow_run.get_id() or 'local')[:8]}"
    held = set(wanted if request.dry_run else scheduler.hold(hold, wanted, HOLD_S))
    try:
        if partner not in held:
            return partner, None
        # The node leads its test: if it is down, that is an unreachable host at once rather
        # than a partner waiting for it until the test timeout.
        groups: list[Group] = [(node, partner)]
        if (
            request.reference_gbps is None
            and reference_pair is not None
            and set(reference_pair) <= held
        ):
            groups.append(reference_pair)
        return partner, run_pair_tests(groups, request.test_timeout_s, request.dry_run)
    finally:
        if not request.dry_run:
            release_hold(hold)


def _owner_line(ownership: Ownership, request: RestoreRequest) -> str:
    if ownership.ours or not request.force:
        return ownership.why
    return f"{ownership.why}; forced by {request.forced_by}: {request.force_reason}"


def _reference(results: list[PairResult], node: str) -> float | None:
    others = [r for r in results if node not in r.nodes and r.ok]
    return others[0].busbw_gbps if others else None


def _finish(
    result: RestoreResult,
    request: RestoreRequest,
    *,
    verdict: str,
    reason: str,
    restored: bool = False,
) -> RestoreResult:
    result = result.model_copy(update={"verdict": verdict, "reason": reason, "restored": restored})
    log = get_run_logger()
    (log.info if restored else log.warning)("%s: %s (%s)", result.node, verdict, reason)
    create_markdown_artifact(
        key=result.report_key,
        markdown=restore_report(
            node=result.node,
            verdict=result.verdict,
            reason=result.reason,
            partner=result.partner,
            busbw_gbps=result.busbw_gbps,
            reference_gbps=result.reference_gbps,
            restored=result.restored,
            dry_run=request.dry_run,
            owner=result.owner,
            burn_in=result.burn_in,
        ),
        description=f"Restore {result.node}: {verdict}",
    )
    return result
