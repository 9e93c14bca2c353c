"""Runbook `locate-faulty-nodes`: which nodes of a set are broken or slow — then isolate them.

    check the nodes against the inventory → hold them (a scheduler hold on the idle ones:
    no job lands there during the tests; drained and down nodes run nothing anyway; a node
    running someone's job is never tested, it is reported undetermined) → round after
    round of pair tests
    (playbooks/nccl_pair_test.yml, all groups of a round at once; trainmedic.locate decides
    the groups and the verdicts) → table artifact per round → if asked to isolate: policy
    (trainmedic.decisions.guard) → human approval unless it is small and inside the blast-radius
    guard → drain in the scheduler + playbooks/isolate_node.yml → release the hold →
    Markdown summary

A round's groups are split into batches, one ansible-runner run (one Prefect task) each,
the batches of a round running concurrently: an ansible-playbook start costs ~1.5 s of
controller CPU, more than a short test, so one run per group would spend more time starting
Ansible than testing (16 nodes: 16 s one run per pair vs 8 s batched, on 2 cores).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import Annotated

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from flows.isolate import IsolationApproval, isolate
from trainmedic.adapters.ansible import Inventory, run_playbook
from trainmedic.adapters.scheduler import get_scheduler
from trainmedic.core import validate
from trainmedic.core.errors import InputError, PlaybookTimeout
from trainmedic.core.models import (
    ActionRecord,
    IsolationOutcome,
    JobId,
    JobInfo,
    NodeName,
    NodeState,
    PairResult,
    PlaybookResult,
)
from trainmedic.core.settings import get_settings
from trainmedic.locate import Group, LocateReport, RoundRecord, check_nodes, locate
from trainmedic.reports.nodes import locate_report, round_table

__all__ = [
    "IsolationApproval",
    "LocateRequest",
    "LocateResult",
    "locate_faulty_nodes",
    "pair_result",
    "plan_batches",
    "run_pair_tests",
]

TIMEOUT_RCS = (124, 137)  # coreutils timeout: TERM sent / KILL sent after the grace period


class LocateRequest(BaseModel):
    """Parameters of a locate run (UI form, a deployment trigger, `trainmedic locate`)."""

    model_config = ConfigDict(extra="forbid")

    nodes: Annotated[
        list[NodeName],
        # The form and the deployment's schema take either; the validator expands both.
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "string", "examples": ["node[001-016]"]},
                    {"type": "array", "items": {"type": "string"}, "minItems": 1},
                ]
            }
        ),
    ] = Field(
        min_length=1,
        max_length=4096,
        description="nodes to test: a Slurm host list such as node[001-016] or a list of names",
    )
    seed: int | None = Field(default=None, ge=0, description="pairing seed; default from names")
    slow_ratio: float = Field(
        default=0.5, gt=0.0, le=1.0, description="slower than this share of the reference: slow"
    )
    # A waiting test holds one SSH session on the controller, not a CPU: 256 at once clears a
    # 512-node fabric's round one in one wave.
    concurrency: int = Field(default=256, ge=1, le=512, description="tests running at once")
    tests_per_run: int | None = Field(
        default=None,
        ge=1,
        le=512,
        description="pair tests per ansible-runner run (default: sized to the controller)",
    )
    test_timeout_s: int | None = Field(
        default=None,
        ge=5,
        le=3600,
        description="kill a test after this long (default: the inventory's)",
    )
    dry_run: bool = Field(default=False, description="test and decide; drain nothing")
    isolate: bool = Field(default=False, description="drain and isolate what is found")
    approval_timeout_s: int = Field(
        default=3600,
        ge=10,
        le=7 * 86_400,
        description="how long to wait for a human; then drain nothing",
    )
    job_id: JobId | None = Field(default=None, description="the job that led here, if any")

    @field_validator("nodes", mode="before")
    @classmethod
    def _expand(cls, value: object) -> object:
        return node_names(value)


def node_names(value: object) -> object:
    """A request's ``nodes``: one expression, or a list of names and expressions, all become
    plain names, checked once (the form and the deployment schema take either)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        return value
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise InputError("nodes", item, "not a node name or host list")
        names.extend(validate.expand_nodelist(item))
    return check_nodes(dict.fromkeys(names))


class LocateResult(BaseModel):
    nodes: list[str]
    faulty: list[str]
    slow: list[str]
    healthy: list[str]
    undetermined: list[str]
    not_tested: dict[str, str] = Field(default_factory=dict)  # node → why it was not held
    rounds: int
    tests_run: int
    wall_s: float
    round_wall_s: list[float]
    reference_gbps: float | None
    isolation: IsolationOutcome | None
    flow_run_id: str | None
    report_key: str

    def summary(self) -> dict[str, object]:
        """The CLI's --json object."""
        return {
            "faulty": self.faulty,
            "slow": self.slow,
            "undetermined": self.undetermined,
            "not_tested": self.not_tested,
            "rounds": self.rounds,
            "tests_run": self.tests_run,
            "wall_s": round(self.wall_s, 3),
            "drained": self.isolation.drained if self.isolation else [],
            "flow_run_id": self.flow_run_id,
        }


# ----------------------------------------------------------------------------- decisions


# Sizing a wave's playbook runs to the controller when the request does not: one
# ansible-playbook process queues its hosts' tasks from a single thread, so a few runs side by
# side use the cores; each run also costs ~1.5 s of CPU to start, so never runs of a handful.
# Measured on 2 cores, 128 tests of 5 s: 1 run 15.2 s, 4 runs 13.8 s, 8 runs 16.2 s.
RUNS_PER_CORE = 2
MIN_TESTS_PER_RUN = 16


def controller_cores() -> int:
    """The CPUs this process may run on (a container's or cgroup's share, not the host's)."""
    return max(1, len(os.sched_getaffinity(0)))


def plan_batches(
    groups: Sequence[Group],
    concurrency: int,
    tests_per_run: int | None = None,
    cores: int = 1,
) -> list[list[list[Group]]]:
    """Waves of batches: every batch is one playbook run, a wave's batches run at once, and
    no wave runs more than ``concurrency`` tests. One wave unless the round is bigger.
    Without ``tests_per_run``, a wave is split over ``RUNS_PER_CORE`` runs per core of
    ``cores``, at least ``MIN_TESTS_PER_RUN`` tests each."""
    wave = max(1, min(concurrency, len(groups)))
    if tests_per_run is None:
        runs = RUNS_PER_CORE * max(1, cores)
        tests_per_run = max(MIN_TESTS_PER_RUN, math.ceil(wave / runs))
    size = max(1, min(concurrency, tests_per_run))
    batches = [list(groups[i : i + size]) for i in range(0, len(groups), size)]
    per_wave = max(1, concurrency // size)
    return [batches[i : i + per_wave] for i in range(0, len(batches), per_wave)]


def pair_result(group: Group, result: PlaybookResult, timeout_s: int | None) -> PairResult:
    """One group's verdict from the facts nccl_pair_test.yml set on the group's first host."""
    leader = group[0]
    outcome = result.hosts.get(leader)
    facts = (result.facts.get(leader) or {}).get("trainmedic_nccl_result")
    if outcome == "unreachable":
        return PairResult(nodes=group, ok=False, error=f"{leader} unreachable")
    if not isinstance(facts, dict):
        # The test never ran, or Ansible was cut off before it reported (the overall timeout
        # of an overloaded controller): nothing is known about the nodes, retried.
        return PairResult(
            nodes=group,
            ok=False,
            undetermined=True,
            error=f"no test result from {leader} ({outcome}): never ran or cut off",
        )
    rc = facts.get("rc")
    errors = [str(e) for e in facts.get("errors") or []]
    if rc in TIMEOUT_RCS or facts.get("timed_out") is True:
        limit = f" after {timeout_s} s" if timeout_s else ""
        return PairResult(nodes=group, ok=False, error=f"timed out{limit}: a peer never joined")
    if rc != 0:
        detail = errors[0] if errors else "no error output"
        return PairResult(nodes=group, ok=False, error=f"rc={rc}: {detail}"[:300])
    try:
        busbw = float(str(facts.get("busbw_gbps")))
    except ValueError:
        return PairResult(nodes=group, ok=False, error="completed without a bus bandwidth line")
    return PairResult(nodes=group, ok=True, busbw_gbps=busbw)


# ----------------------------------------------------------------------------- tasks

# How long a hold outlives a crashed run at most (a finished run releases it at once).
HOLD_S = 1800


@task(name="hold-nodes", cache_policy=NO_CACHE)
def hold_nodes(
    nodes: list[str], name: str, job_id: str | None, dry_run: bool
) -> tuple[list[str], dict[str, str]]:
    """The nodes that may be tested, and the others with why.

    Testable: held by us now (the idle ones), drained or down (no job runs or lands there),
    or running only the job this run is about (its own nodes: the remediation's to test).
    A node running anyone else's job is never tested under their training. A dry run holds
    nothing."""
    scheduler = get_scheduler()
    states = {n.name: n for n in scheduler.nodes()}
    running = [j for j in scheduler.jobs() if not j.state.finished]
    others = {n for j in running if j.job_id != job_id for n in j.nodes}
    own = {n for j in running if j.job_id == job_id for n in j.nodes} - others
    idle = [n for n in nodes if n in states and states[n].state is NodeState.IDLE]
    held = set(idle if dry_run else scheduler.hold(name, idle, HOLD_S))
    quiet = {NodeState.DRAINED, NodeState.DOWN}
    testable = [
        n
        for n in nodes
        if n in held or n in own or (n in states and states[n].state in quiet and n not in others)
    ]
    skipped = {
        n: f"{states[n].state if n in states else 'unknown to the scheduler'}: "
        "running another job, not held, not tested"
        for n in nodes
        if n not in testable
    }
    if skipped:
        get_run_logger().warning("not tested (not held): %s", skipped)
    return testable, skipped


@task(name="release-hold", cache_policy=NO_CACHE)
def release_hold(name: str) -> bool:
    return get_scheduler().release(name)


@task(name="run-pair-tests", cache_policy=NO_CACHE)
def run_pair_tests(
    groups: list[Group], test_timeout_s: int | None = None, check: bool = False
) -> list[PairResult]:
    """One playbook run testing every group at once (each from its first host)."""
    settings = get_settings()
    # Every test of the batch starts together: one fork per group.
    run_settings = settings.model_copy(update={"ansible_forks": max(1, len(groups))})
    extravars: dict[str, object] = {"trainmedic_pair_groups": [",".join(g) for g in groups]}
    if test_timeout_s is not None:
        extravars["trainmedic_nccl_test_timeout_s"] = test_timeout_s
    # The tests' own timeout kills a hung test; this one only catches a stuck Ansible.
    overall = (test_timeout_s or settings.playbook_timeout_s) + 120
    try:
        result = run_playbook(
            "nccl_pair_test.yml",
            [g[0] for g in groups],
            extravars,
            check=check,
            timeout_s=overall,
            settings=run_settings,
        )
    except PlaybookTimeout as exc:
        # Ansible itself was cut off (an overloaded controller): no test reported, so nothing
        # is known about these nodes. Undetermined and retried, never a conviction.
        get_run_logger().warning("pair tests cut off, undetermined: %s", exc)
        return [
            PairResult(nodes=g, ok=False, undetermined=True, error=f"cut off: {exc}"[:300])
            for g in groups
        ]
    return [pair_result(g, result, test_timeout_s) for g in groups]


# ----------------------------------------------------------------------------- flow


@flow(name="locate-faulty-nodes", log_prints=True, persist_result=True, result_serializer="json")
def locate_faulty_nodes(request: LocateRequest) -> LocateResult:
    settings = get_settings()
    logger = get_run_logger()
    nodes = Inventory(settings.inventory).check(request.nodes)
    logger.info(
        "locating faulty and slow nodes among %d: %s", len(nodes), validate.compress_nodelist(nodes)
    )

    def run_round(groups: Sequence[Group]) -> list[PairResult]:
        results: list[PairResult] = []
        waves = plan_batches(groups, request.concurrency, request.tests_per_run, controller_cores())
        for wave in waves:
            futures = [
                run_pair_tests.submit(batch, request.test_timeout_s, request.dry_run)
                for batch in wave
            ]
            results += [r for f in futures for r in f.result()]
        return results

    round_wall_s: list[float] = []
    mark = [time.monotonic()]

    def publish_round(record: RoundRecord) -> None:
        # Called once a round and its retries are done: the time since the previous call
        # is the round's wall time.
        now = time.monotonic()
        round_wall_s.append(round(now - mark[0], 3))
        mark[0] = now
        create_table_artifact(
            key=f"locate-round-{record.index}",
            table=round_table(record),
            description=f"Pair tests of round {record.index}: {len(record.groups)} groups "
            f"in {round_wall_s[-1]:.1f} s, faulty {list(record.faulty)}, slow {list(record.slow)}",
        )
        logger.info(
            "round %d: %d tests, %d retried; convicted faulty %s slow %s",
            record.index,
            len(record.groups),
            record.retried,
            list(record.faulty),
            list(record.slow),
        )

    context = FlowRunContext.get()
    run_id = str(context.flow_run.id) if context and context.flow_run else None
    hold = f"trainmedic-locate-{(run_id or 'local')[:8]}"
    testable, not_tested = hold_nodes(nodes, hold, request.job_id, request.dry_run)
    started = mark[0] = time.monotonic()
    try:
        report = (
            locate(
                testable,
                run_round,
                seed=request.seed,
                slow_ratio=request.slow_ratio,
                on_round=publish_round,
            )
            if testable
            else LocateReport(slow_ratio=request.slow_ratio)
        )
    finally:
        if not request.dry_run:
            release_hold(hold)
    wall_s = time.monotonic() - started

    outcome = None
    if request.isolate and (report.faulty or report.slow):
        verdicts = {n: "faulty" for n in report.faulty} | {n: "slow" for n in report.slow}
        outcome = isolate(
            verdicts,
            runbook="locate-faulty-nodes",
            evidence="in pair tests",
            approval_timeout_s=request.approval_timeout_s,
            job_id=request.job_id,
            dry_run=request.dry_run,
        )

    key = "locate-summary"
    create_markdown_artifact(
        key=key,
        markdown=locate_report(
            report, wall_s, outcome, dry_run=request.dry_run, not_tested=not_tested
        ),
        description=f"Locate: faulty {list(report.faulty)}, slow {list(report.slow)}",
    )
    return LocateResult(
        nodes=list(report.nodes),
        faulty=list(report.faulty),
        slow=list(report.slow),
        healthy=list(report.healthy),
        undetermined=sorted([*report.undetermined, *not_tested]),
        not_tested=not_tested,
        rounds=report.rounds,
        tests_run=report.tests_run,
        wall_s=wall_s,
        round_wall_s=round_wall_s,
        reference_gbps=report.reference_gbps,
        isolation=outcome,
        flow_run_id=run_id,
        report_key=key,
    )


def pair_test_job_nodes(
    job: JobInfo, *, dry_run: bool, slow_ratio: float | None = None
) -> tuple[LocateResult, list[ActionRecord]]:
    """Triage's locate over a failed (or slow) job's own nodes, isolating what it convicts
    under the policy: the result and the actions for the report (the pair test's line, then
    the isolation's)."""
    settings = get_settings()
    located = locate_faulty_nodes(
        LocateRequest(
            nodes=list(job.nodes),
            job_id=job.job_id,
            isolate=True,
            approval_timeout_s=settings.approval_timeout_s,
            dry_run=dry_run,
            **({"slow_ratio": slow_ratio} if slow_ratio is not None else {}),
        )
    )
    actions = [
        ActionRecord(
            what="pair test",
            target=validate.compress_nodelist(job.nodes),
            outcome=f"faulty {located.faulty or 'none'}, slow {located.slow or 'none'} "
            f"({located.rounds} rounds, {located.tests_run} tests)",
        )
    ]
    if located.isolation is not None:
        actions.extend(located.isolation.actions)
    return located, actions
