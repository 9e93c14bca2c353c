"""Runbook `preflight`: are these nodes fit to start a job? Run before a big job starts (the
CLI) or from a Slurm prolog (`scripts/slurm/prolog_slurmctld.sh`), in seconds:

    node diagnostics playbook (one run over all nodes: nvidia-smi, the kernel log)
    → each node fit or not, and why (trainmedic.decisions.preflight)
    → optionally a pair test over the fit ones (slow or broken links)
    → optionally drain the unfit ones (the shared isolation step: policy, breaker, approval)
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel, ConfigDict, Field, field_validator

from flows.isolate import isolate
from flows.locate import LocateRequest, locate_faulty_nodes, node_names
from flows.tasks import collect_node_diagnostics
from trainmedic.core.models import ActionRecord
from trainmedic.core.settings import get_settings
from trainmedic.decisions.preflight import NodeFitness, node_fitness
from trainmedic.diagnosis.engine import HOT_GPU_C
from trainmedic.reports.common import actions_table


class PreflightRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[str] = Field(min_length=1, max_length=4096, description="e.g. node[001-064]")
    pair_test: bool = Field(default=False, description="also pair-test the fit nodes")
    drain: bool = Field(default=False, description="drain the unfit nodes (under the policy)")
    xid_window_s: float = Field(
        default=86_400,
        gt=0,
        le=30 * 86_400,
        description="a hardware Xid (or an Xid 154 asking for a repair) newer than this counts",
    )
    dry_run: bool = False

    @field_validator("nodes", mode="before")
    @classmethod
    def _expand(cls, value: object) -> object:
        return node_names(value)


class PreflightResult(BaseModel):
    fit: list[str]
    unfit: dict[str, list[str]]
    drained: list[str]
    wall_s: float
    report_id: str
    # Set when any node is unfit: the job must not start on these nodes as they were, and
    # what is still in service waits for a human.
    human_needed: str | None = None


@flow(name="preflight", log_prints=True, persist_result=True, result_serializer="json")
def preflight(request: PreflightRequest) -> PreflightResult:
    started = time.monotonic()
    logger = get_run_logger()
    diagnostics = collect_node_diagnostics(request.nodes, dry_run=False)  # read-only
    now = datetime.now(UTC)
    verdicts: list[NodeFitness] = []
    for node in request.nodes:
        facts = (diagnostics.facts.get(node) or {}).get("trainmedic_diagnostics")
        answered = str(diagnostics.hosts.get(node, "")) == "ok"
        fields = (facts or {}).get("gpu_fields") or []  # type: ignore[union-attr]
        verdicts.append(
            node_fitness(
                node,
                facts if answered else None,  # type: ignore[arg-type]
                gpu_fields=[str(f) for f in fields],  # type: ignore[union-attr]
                now=now,
                xid_window_s=request.xid_window_s,
                hot_c=HOT_GPU_C,
            )
        )
    unfit = {v.node: list(v.problems) for v in verdicts if not v.fit}
    fit = [v.node for v in verdicts if v.fit]
    actions: list[ActionRecord] = []
    if request.pair_test and len(fit) >= 2:
        located = locate_faulty_nodes(LocateRequest(nodes=fit, dry_run=request.dry_run))
        for node in located.faulty:
            unfit[node] = ["failed its pair tests"]
        for node in located.slow:
            unfit[node] = ["slow in its pair tests"]
        fit = [n for n in fit if n not in unfit]
    for node, problems in unfit.items():
        logger.warning("%s unfit: %s", node, "; ".join(problems))
    drained: list[str] = []
    if request.drain and unfit:
        outcome = isolate(
            # A drain reason takes no ";" (the scheduler's reason is one safe line).
            {n: "preflight: " + ", ".join(p)[:120] for n, p in unfit.items()},
            runbook="preflight",
            evidence="",
            approval_timeout_s=get_settings().approval_timeout_s,
            job_id=None,
            dry_run=request.dry_run,
        )
        actions.extend(outcome.actions)
        drained = [a.target for a in actions if a.what == "drain" and a.changed]
    wall = round(time.monotonic() - started, 1)
    left = sorted(set(unfit) - set(drained))
    lines = [
        f"# Pre-flight of {len(request.nodes)} nodes: {len(fit)} fit, {len(unfit)} unfit "
        f"({wall} s)",
        "",
        *(f"- **{n}**: {'; '.join(p)}" for n, p in sorted(unfit.items())),
    ]
    if actions:
        lines += ["", "## Actions", "", *actions_table(actions)]
    report_id = create_markdown_artifact(
        key="preflight", markdown="\n".join(lines) + "\n", description="Pre-flight check"
    )
    return PreflightResult(
        fit=fit,
        unfit=unfit,
        drained=drained,
        wall_s=wall,
        report_id=str(report_id),
        human_needed=(
            f"unfit: {', '.join(sorted(unfit))}"
            + (f" (drained: {', '.join(drained)})" if drained else "")
            + (f"; still in service: {', '.join(left)}" if left else "")
        )
        if unfit
        else None,
    )
