"""Prefect tasks shared by the runbooks: one side effect each, retries only on I/O.

The decisions live in trainmedic (policy, checkpoints, diagnosis); these tasks only fetch and
act, so each shows up in the Prefect UI as one named, retried, logged step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

from prefect import get_run_logger, pause_flow_run, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import FlowPauseTimeout, PrefectHTTPStatusError
from prefect.input import RunInput
from prefect.runtime import flow_run
from pydantic import Field

from flows.verify import heartbeat_step, schedule_verification, training_again
from trainmedic.adapters import checkpoints
from trainmedic.adapters.ansible import Inventory, run_playbook
from trainmedic.adapters.scheduler import get_scheduler
from trainmedic.adapters.server_lock import server_mutex
from trainmedic.adapters.server_state import ServerState
from trainmedic.adapters.telemetry import fetch_gpu_telemetry, fetch_prometheus_telemetry
from trainmedic.core.errors import (
    CheckpointError,
    ConfigError,
    PolicyRefused,
    SchedulerError,
    ServerError,
    TelemetryError,
)
from trainmedic.core.models import (
    ActionRecord,
    Checkpoint,
    GpuTelemetry,
    JobInfo,
    JobState,
    NodePlace,
    PlaybookResult,
)
from trainmedic.core.settings import get_settings
from trainmedic.core.validate import SAFE_TEXT_RE, safe_text
from trainmedic.decisions.admission import Admission, admit, event_scope
from trainmedic.decisions.attempts import spec_changes_for
from trainmedic.decisions.guard import BreakerState, breaker_state, circuit_breaker
from trainmedic.decisions.training import LossRecord, parse_loss_history
from trainmedic.diagnosis import LlmConfig, llm_config_from_settings
from trainmedic.diagnosis.freshness import telemetry_over_window
from trainmedic.state import ActionEntry, ActionKind, DrainRecord

JOB_LOCK_WAIT_S = 900
LOCK_LEASE_S = 1800


@contextlib.contextmanager
def job_lock(job_id: str, timeout_s: float = JOB_LOCK_WAIT_S) -> Iterator[None]:
    """One remediation per training job at a time, across every runbook and worker.

    Two events for one job (the scheduler's failure and the framework's loss report, or a
    replay) start two flow runs; the second waits here for the first, then finds the job
    already resubmitted and does nothing twice.
    """
    # Per cluster: clusters sharing one Prefect server reuse job ids (Slurm's count from 1).
    name = f"remediate-{get_settings().cluster}-job-{job_id}"
    with server_mutex(name, timeout_s, LOCK_LEASE_S):
        yield


def admit_event(job: JobInfo, event: str, occurred: datetime | None) -> Admission:
    """Whether this event starts a remediation of ``job`` (trainmedic.decisions.admission)."""
    return admit(
        job,
        event=event,
        occurred=occurred,
        now=datetime.now(UTC),
        resubmissions=[j for j in get_scheduler().jobs() if j.resubmission_of == job.job_id],
        scope=event_scope(get_settings()),
    )


def _transient(exc_types: tuple[type[BaseException], ...]):  # type: ignore[no-untyped-def]
    def condition(task, task_run, state) -> bool:  # type: ignore[no-untyped-def]
        try:
            state.result()
        except exc_types:
            return True
        except Exception:
            return False
        return False

    return condition


@task(
    name="load-job",
    retries=2,
    retry_delay_seconds=[1, 3],
    cache_policy=NO_CACHE,
    retry_condition_fn=_transient((SchedulerError, OSError)),
)
def load_job(job_id: str) -> JobInfo:
    """The scheduler's record of the job: state, nodes, log and checkpoint locations."""
    return get_scheduler().job(job_id)


@task(
    name="fetch-job-logs",
    retries=3,
    retry_delay_seconds=[1, 2, 4],
    cache_policy=NO_CACHE,
    retry_condition_fn=_transient((OSError,)),
)
def fetch_job_logs(job: JobInfo) -> list[str]:
    """Every rank's stdout/stderr of the job (paths on the shared filesystem)."""
    log_dir = Path(job.log_dir)
    files = sorted(str(p) for p in log_dir.iterdir() if p.is_file())
    get_run_logger().info("job %s: %d log files under %s", job.job_id, len(files), log_dir)
    return files


@task(name="collect-node-diagnostics", cache_policy=NO_CACHE)
def collect_node_diagnostics(nodes: list[str], dry_run: bool) -> PlaybookResult:
    """Run playbooks/collect_node_diagnostics.yml (read-only) on the job's nodes."""
    result = run_playbook("collect_node_diagnostics.yml", nodes, check=dry_run)
    unreachable = [h for h, o in result.hosts.items() if o == "unreachable"]
    if unreachable:
        get_run_logger().warning("unreachable during diagnostics: %s", ", ".join(unreachable))
    return result


@task(
    name="fetch-telemetry",
    retries=3,
    retry_delay_seconds=[1, 2, 4],
    cache_policy=NO_CACHE,
    retry_condition_fn=_transient((TelemetryError,)),
)
def fetch_telemetry(nodes: list[str], since: datetime | None = None) -> list[GpuTelemetry]:
    """DCGM metrics of the job's nodes (empty when no endpoint is set). With ``since`` (the
    job's start) and a Prometheus server, the counters are their increase since then; a
    scrape's are lifetime totals (flagged so: never evidence)."""
    settings = get_settings()
    if settings.telemetry_query_url is not None:
        url, timeout_s = str(settings.telemetry_query_url), settings.http_timeout_s
        now = fetch_prometheus_telemetry(url, nodes, datetime.now(UTC), timeout_s=timeout_s)
        if since is None:
            return now
        return telemetry_over_window(
            fetch_prometheus_telemetry(url, nodes, since, timeout_s=timeout_s), now
        )
    if settings.telemetry_url is None:
        get_run_logger().info("no telemetry endpoint configured (TRAINMEDIC_TELEMETRY_URL)")
        return []
    samples = fetch_gpu_telemetry(str(settings.telemetry_url), timeout_s=settings.http_timeout_s)
    wanted = set(nodes)
    return [s for s in samples if s.host in wanted]


def server_state() -> ServerState:
    """This cluster's guard lock and records on the Prefect server."""
    return ServerState(get_settings().cluster)


def breaker_status() -> BreakerState:
    return breaker_state(
        server_state().actions(), datetime.now(UTC), circuit_breaker(get_settings())
    )


@dataclasses.dataclass
class GuardedAction:
    """Set ``changed = False`` when the action turned out to change nothing: a no-op spends
    nothing of the circuit breaker."""

    changed: bool = True


@dataclasses.dataclass
class GuardedBatch:
    """The targets the breaker lets through (``allowed``, in the order asked) and those it
    refuses; ``done(target)`` for each allowed target whose action did change something."""

    allowed: list[str]
    refused: list[str]
    changed: list[str] = dataclasses.field(default_factory=list)

    def done(self, target: str) -> None:
        self.changed.append(target)


@contextlib.contextmanager
def guarded(kind: ActionKind, target: str) -> Iterator[GuardedAction]:
    """Every destructive action passes here: under the cluster's guard lock (on the Prefect
    server), refused while the circuit breaker is open, recorded on the server once done. The
    check and the record happen under one hold of the lock, so two runs at once cannot both
    take the breaker's last slot."""
    with guarded_many(kind, [target]) as batch:
        action = GuardedAction()
        yield action
        if action.changed:
            batch.done(target)


@contextlib.contextmanager
def guarded_many(kind: ActionKind, targets: list[str]) -> Iterator[GuardedBatch]:
    """:func:`guarded` for an incident's actions of one kind: one hold of the guard lock for
    all of them (a storm's resubmissions queued on the lock one by one, ~0.6 s each on a busy
    server). The breaker lets through as many as it has room for, in order; with no room at
    all nothing is done and it pages; the ones beyond its room are refused after the others
    are done and recorded."""
    store = server_state()
    with store.lock():
        entries = store.actions()
        state = breaker_state(entries, datetime.now(UTC), circuit_breaker(get_settings()))
        room = state.room
        if room == 0:
            _breaker_refuses(kind, targets, state, entries)
        batch = GuardedBatch(allowed=targets[:room], refused=targets[room:])
        try:
            yield batch
        finally:
            for target in batch.changed:
                store.record_action(
                    ActionEntry(
                        kind=kind,
                        target=target,
                        at=datetime.now(UTC),
                        flow_run=flow_run.get_name() or "",
                    )
                )
    if batch.refused:
        entries = store.actions()
        state = breaker_state(entries, datetime.now(UTC), circuit_breaker(get_settings()))
        _breaker_refuses(kind, batch.refused, state, entries)


def _breaker_refuses(
    kind: ActionKind, targets: list[str], state: BreakerState, entries: list[ActionEntry]
) -> NoReturn:
    what = f"{kind} {', '.join(targets)}"
    get_run_logger().error("%s refused: %s", what, state.describe())
    emit_for_human(
        "page",
        job_id=None,
        category="circuit breaker open",
        summary=f"{what} refused: {state.describe()}",
        evidence="; ".join(f"{e.kind} {e.target} ({e.flow_run})" for e in entries[-5:]),
        answer="`trainmedic breaker` (the actions it counts), then "
        "`trainmedic breaker --reset` once they are checked",
    )
    raise PolicyRefused(
        f"{what} refused: {state.describe()}; a human resets it with "
        "`trainmedic breaker --reset` after checking what the automation did"
    )


@task(name="drain-node", cache_policy=NO_CACHE)
def drain_node(
    node: str,
    reason: str,
    dry_run: bool,
    *,
    evidence: str = "",
    job_id: str | None = None,
    verdict: str = "",
) -> ActionRecord:
    """Drain one node in the scheduler (idempotent: an already drained node is left alone,
    whoever drained it) and keep trainmedic's drain record on the server: the exact reason
    given, the run, the evidence, the time (what makes the drain ours, see
    trainmedic.decisions.ownership)."""
    reason = safe_text(reason, "reason")
    logger = get_run_logger()
    if dry_run:
        logger.info("dry run: would drain %s (%s)", node, reason)
        return ActionRecord(what="drain", target=node, outcome="dry run: not drained")
    scheduler = get_scheduler()
    store = server_state()
    changed = False
    with store.lock():
        if not any(n.name == node and n.state == "DRAINED" for n in scheduler.nodes()):
            with guarded(ActionKind.drain, node) as action:
                changed = action.changed = scheduler.drain(node, reason)
                if changed:
                    record = DrainRecord(
                        node=node,
                        at=datetime.now(UTC),
                        flow_run=flow_run.get_name() or "",
                        reason=reason,
                        evidence=evidence[:300],
                        job_id=job_id,
                        verdict=verdict[:120],
                    )
                    store.record_drain(record)
    logger.warning("drain %s: %s (%s)", node, "drained" if changed else "already drained", reason)
    return ActionRecord(
        what="drain",
        target=node,
        changed=changed,
        outcome=f"drained: {reason}" if changed else "already drained",
    )


@task(name="choose-checkpoint", cache_policy=NO_CACHE)
def choose_checkpoint(job: JobInfo, before_step: int | None = None) -> Checkpoint | None:
    """The newest complete checkpoint of this training run whose checksums match (partial,
    truncated and other runs' checkpoints skipped), never later than the job's last progress.

    None when the job never wrote one (it died before its first save): it starts over, which
    loses nothing. Checkpoints that all fail validation are different: starting over would
    throw away the whole run, so that raises for a human to decide.
    """
    logger = get_run_logger()
    directory = Path(job.checkpoint_dir)
    if not checkpoints.checkpoint_dirs(directory):
        logger.warning("job %s never saved a checkpoint: it starts from the beginning", job.job_id)
        return None
    progress = heartbeat_step(Path(job.heartbeat_path))
    bound = before_step
    if progress is not None:
        # A checkpoint past the job's own progress is not its own (a stale directory).
        bound = min(bound, progress + 1) if bound is not None else progress + 1
    chosen, skipped = checkpoints.newest_valid_in(
        directory, before_step=bound, run_id=job.spec.run_id
    )
    for bad in skipped:
        logger.warning("skipping checkpoint step %d: %s", bad.step, bad.problem)
    if chosen is None:
        where = f" before step {bound}" if bound is not None else ""
        problems = ", ".join(f"{c.step} ({c.problem})" for c in skipped)
        raise CheckpointError(
            f"job {job.job_id}: no valid checkpoint{where}"
            + (f"; skipped invalid: {problems}" if problems else "")
        )
    logger.info("restart checkpoint: step %d (%s)", chosen.step, chosen.path)
    return chosen


# The Prefect server refusing for a moment (SQLite busy under a storm: 503) while the task
# takes the guard lock: it retries instead of failing the remediation half-way. Safe because
# it is idempotent: a second try finds its own resubmission. (A drain does not retry: a drain
# done whose record was lost would come back "already drained", and not be ours.)
SERVER_BUSY = (PrefectHTTPStatusError, ServerError)
# The task options of an idempotent task that retries while the server is busy.
RETRY_WHILE_SERVER_BUSY: dict[str, Any] = {
    "retries": 3,
    "retry_delay_seconds": [1, 3, 9],
    "retry_condition_fn": _transient(SERVER_BUSY),
}


@dataclasses.dataclass(frozen=True)
class Resubmission:
    """One job to resubmit: from which checkpoint, with which spec changes."""

    job: JobInfo
    checkpoint: Checkpoint | None
    changes: dict[str, object]


@dataclasses.dataclass(frozen=True)
class Resubmitted:
    """The job a failed job restarts as; ``earlier`` when it was found already resubmitted
    (a replayed event, a rerun of the flow) and nothing was submitted now."""

    job: JobInfo
    earlier: bool = False


@task(name="resubmit-job", cache_policy=NO_CACHE, **RETRY_WHILE_SERVER_BUSY)
def resubmit_job(
    job: JobInfo,
    checkpoint: Checkpoint | None,
    exclude: list[str],
    changes: dict[str, object],
    dry_run: bool,
) -> Resubmitted | None:
    """Resubmit from ``checkpoint`` excluding ``exclude``; at most once per failed job."""
    return _resubmit(
        [Resubmission(job=job, checkpoint=checkpoint, changes=changes)], exclude, dry_run
    )[0]


@task(name="resubmit-jobs", cache_policy=NO_CACHE, **RETRY_WHILE_SERVER_BUSY)
def resubmit_jobs(
    resubmissions: list[Resubmission], exclude: list[str], dry_run: bool
) -> list[Resubmitted | None]:
    """An incident's jobs resubmitted under one hold of the guard (each at most once, as
    :func:`resubmit_job`), new jobs in the order asked. One job's failed resubmission does not
    stop the others; the first such failure fails the task once all are recorded."""
    return _resubmit(resubmissions, exclude, dry_run)


def _resubmit(
    resubmissions: list[Resubmission], exclude: list[str], dry_run: bool
) -> list[Resubmitted | None]:
    logger = get_run_logger()
    scheduler = get_scheduler()
    # A replayed event or a rerun of this flow must not start a second copy of a job.
    history = scheduler.jobs()
    new: dict[str, Resubmitted] = {}
    for item in resubmissions:
        existing = [j for j in history if j.resubmission_of == item.job.job_id]
        if existing:
            logger.warning(
                "job %s was already resubmitted as %s: not resubmitting again",
                item.job.job_id,
                existing[0].job_id,
            )
            new[item.job.job_id] = Resubmitted(existing[0], earlier=True)
    todo = [item for item in resubmissions if item.job.job_id not in new]
    if dry_run:
        for item in todo:
            logger.info(
                "dry run: would resubmit %s from step %d excluding %s",
                item.job.job_id,
                item.checkpoint.step if item.checkpoint else 0,
                exclude,
            )
        todo = []
    failed: list[Exception] = []
    if todo:
        targets = {f"job {item.job.job_id}": item for item in todo}
        with guarded_many(ActionKind.resubmit, list(targets)) as batch:
            for target in batch.allowed:
                item = targets[target]
                resume = item.checkpoint.step if item.checkpoint else None
                try:
                    job = scheduler.resubmit(
                        item.job.job_id,
                        resume_from_step=resume,
                        exclude=tuple(exclude),
                        **spec_changes_for(item.job.spec, resume, item.changes),
                    )
                except SchedulerError as error:
                    logger.error("resubmitting job %s failed: %s", item.job.job_id, error)
                    failed.append(error)
                    continue
                batch.done(target)
                new[item.job.job_id] = Resubmitted(job)
                logger.info(
                    "resubmitted job %s as %s from step %d",
                    item.job.job_id,
                    job.job_id,
                    resume or 0,
                )
    if failed:
        raise failed[0]
    return [new.get(item.job.job_id) for item in resubmissions]


def resubmit_record(
    job: JobInfo, resubmitted: Resubmitted, from_step: int, changes: dict[str, object]
) -> ActionRecord:
    """The report's line for a resubmission: done now, or found done by an earlier run."""
    target = f"job {job.job_id}"
    if resubmitted.earlier:
        outcome = f"already resubmitted as job {resubmitted.job.job_id} (earlier): not again"
        return ActionRecord(what="resubmit", target=target, changed=False, outcome=outcome)
    skipped = changes.get("skip_batches")
    outcome = f"job {resubmitted.job.job_id} from step {from_step}"
    if isinstance(skipped, tuple):
        outcome += f", skipping batches {skipped[0]}-{skipped[1]}"
    return ActionRecord(what="resubmit", target=target, changed=True, outcome=outcome)


@task(name="verify-restart", cache_policy=NO_CACHE)
def verify_restart(new_job: JobInfo, from_step: int) -> tuple[JobInfo, ActionRecord]:
    """The resubmitted job trains past the checkpoint again (checked here, in seconds), or it
    waits in the queue: then it is queued, not failed, and the verify-resubmission runbook
    checks it when it starts, while this run ends and releases the job's lock."""
    settings = get_settings()
    scheduler = get_scheduler()
    target = f"job {new_job.job_id}"
    current = scheduler.job(new_job.job_id)
    grace_until = time.monotonic() + settings.queue_grace_s
    while current.state is JobState.PENDING and time.monotonic() < grace_until:
        time.sleep(0.5)
        current = scheduler.job(new_job.job_id)
    if current.state is JobState.PENDING:
        run = schedule_verification(current.job_id, from_step)
        queued = f"queued ({current.reason or 'PENDING'}): "
        outcome = (
            f"{queued}verified when it starts by run {run}"
            if run
            else f"{queued}NOT verified (no verify-resubmission deployment): check it by hand"
        )
        get_run_logger().warning("job %s %s", current.job_id, outcome)
        return current, ActionRecord(what="verify", target=target, outcome=outcome)
    deadline = time.monotonic() + settings.verify_timeout_s
    while not training_again(current, from_step):
        if time.monotonic() > deadline:
            raise SchedulerError(
                f"resubmitted job {new_job.job_id} made no progress within "
                f"{settings.verify_timeout_s} s"
            )
        time.sleep(0.5)
        current = scheduler.job(new_job.job_id)
    get_run_logger().info("job %s is training again", new_job.job_id)
    return current, ActionRecord(
        what="verify", target=target, outcome="heartbeat advancing past the checkpoint"
    )


@task(name="stop-job", cache_policy=NO_CACHE)
def stop_job(job: JobInfo, reason: str, dry_run: bool) -> ActionRecord:
    """Cancel a job that is still running (a hung or diverged one); idempotent."""
    reason = safe_text(reason, "reason")
    if dry_run:
        return ActionRecord(what="stop job", target=f"job {job.job_id}", outcome="dry run")
    if get_scheduler().job(job.job_id).state.finished:
        changed = False
    else:
        with guarded(ActionKind.stop_job, f"job {job.job_id}"):
            changed = get_scheduler().cancel(job.job_id, reason)
    get_run_logger().warning(
        "stop job %s: %s", job.job_id, "cancelled" if changed else "had already ended"
    )
    return ActionRecord(
        what="stop job",
        target=f"job {job.job_id}",
        changed=changed,
        outcome=f"cancelled: {reason}" if changed else "had already ended",
    )


@task(name="stop-job-on-node", cache_policy=NO_CACHE)
def stop_job_on_node(job_id: str, node: str, reason: str, dry_run: bool) -> ActionRecord:
    """After a node's drain is recorded: stop what the failed job still runs there, and only
    that (never another job). Idempotent: a job with nothing left there is left alone."""
    reason = safe_text(reason, "reason")
    target = f"job {job_id} on {node}"
    if dry_run:
        return ActionRecord(what="stop job on node", target=target, outcome="dry run")
    with guarded(ActionKind.stop_job, target) as action:
        cancelled = get_scheduler().cancel_steps_on(job_id, node, reason)
        action.changed = bool(cancelled)
    get_run_logger().warning("stop job %s on %s: %s", job_id, node, cancelled or "nothing ran")
    return ActionRecord(
        what="stop job on node",
        target=target,
        changed=bool(cancelled),
        outcome=f"cancelled {', '.join(cancelled)}" if cancelled else "nothing of it ran there",
    )


@task(
    name="read-loss-history",
    retries=2,
    retry_delay_seconds=[1, 3],
    cache_policy=NO_CACHE,
    retry_condition_fn=_transient((OSError,)),
)
def read_loss_history(job: JobInfo) -> list[LossRecord]:
    """The job's loss curve (``loss.csv``: step,batch,loss, written by the framework hook)."""
    path = Path(job.log_dir).parent / "loss.csv"
    with path.open() as handle:
        return parse_loss_history(handle, source=str(path))


@task(name="request-checkpoint", cache_policy=NO_CACHE)
def request_checkpoint(job: JobInfo, dry_run: bool) -> bool:
    """Send the job its "save now" signal."""
    if dry_run:
        return False
    return get_scheduler().request_checkpoint(job.job_id)


@task(name="wait-for-checkpoint", cache_policy=NO_CACHE)
def wait_for_checkpoint(job: JobInfo, newer_than: int, timeout_s: float) -> Checkpoint:
    """Wait for a valid checkpoint newer than ``newer_than`` to land."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # While polling, the manifest and the shard sizes only: the checksums of a checkpoint
        # that is still being written would be hashed for nothing, again and again.
        found, _ = checkpoints.newest_valid_in(
            Path(job.checkpoint_dir), run_id=job.spec.run_id, deep=False
        )
        if found is not None and found.step > newer_than:
            checked = checkpoints.verify(Path(found.path), run_id=job.spec.run_id)
            if checked.valid:
                return checked
        if get_scheduler().job(job.job_id).state.finished:
            break
        time.sleep(0.5)
    raise CheckpointError(
        f"job {job.job_id}: no new valid checkpoint after step {newer_than} within {timeout_s} s"
    )


def llm_config() -> LlmConfig | None:
    """The optional LLM fallback's endpoint; its key from the environment or, better, from
    the Prefect Secret block named in TRAINMEDIC_LLM_API_KEY_BLOCK (never logged)."""
    settings = get_settings()
    config = llm_config_from_settings(settings)
    block = settings.llm_api_key_block
    if config is not None and config.api_key is None and block:
        from prefect.blocks.system import Secret

        config = dataclasses.replace(config, api_key=str(Secret.load(block).get()))
    return config


def restart_from(
    job: JobInfo,
    checkpoint: Checkpoint | None,
    *,
    exclude: list[str],
    changes: dict[str, object],
    dry_run: bool,
    verify: bool = True,
) -> tuple[JobInfo | None, list[ActionRecord]]:
    """Resubmit ``job`` from ``checkpoint`` (None: from the beginning) and, unless a dry run
    or ``verify`` is off (the caller verifies, several jobs at once), wait until it trains
    again. Returns the new job and the actions for the report."""
    from_step = checkpoint.step if checkpoint else 0
    resubmitted = resubmit_job(job, checkpoint, exclude, changes, dry_run)
    if resubmitted is None:
        return None, []
    new_job = resubmitted.job
    actions = [resubmit_record(job, resubmitted, from_step, changes)]
    if verify and not dry_run:
        new_job, verified = verify_restart(new_job, from_step)
        actions.append(verified)
    return new_job, actions


@task(name="tell-a-human", cache_policy=NO_CACHE)
def tell_human(
    kind: str, *, job_id: str | None, category: str, summary: str, evidence: str, answer: str
) -> ActionRecord:
    """Emit ``trainmedic.<kind>`` (page, owner.notify, approval.needed) about a job: the
    notification automation (`trainmedic notify`) sends it to on-call or the owner. The
    record says what was done: the event emitted, and whether anything delivers it."""
    return emit_for_human(
        kind, job_id=job_id, category=category, summary=summary, evidence=evidence, answer=answer
    )


def emit_for_human(
    kind: str, *, job_id: str | None, category: str, summary: str, evidence: str, answer: str
) -> ActionRecord:
    """:func:`tell_human`'s work, callable where a task is not (inside the guard)."""
    from prefect.events import emit_event

    from trainmedic.adapters.notifications import installed

    run_name = flow_run.get_name() or "local"
    about = (
        {"prefect.resource.id": f"trainmedic.job.{job_id}", "trainmedic.job.id": job_id}
        if job_id
        else {"prefect.resource.id": f"trainmedic.run.{run_name}"}
    )
    event = emit_event(
        event=f"trainmedic.{kind}",
        resource=about,
        payload={
            "job_id": job_id or "-",
            "category": category,
            "summary": summary[:500],
            "evidence": evidence[:500],
            "answer": answer,
            "run_name": run_name,
        },
    )
    what = {"page": "page on-call", "owner.notify": "notify owner"}.get(kind, kind)
    if event is None:
        outcome = "NOT sent: no Prefect API to emit the event to"
    elif installed():
        outcome = f"event trainmedic.{kind} {str(event.id)[:8]} sent to the notification automation"
    else:
        outcome = (
            f"event trainmedic.{kind} {str(event.id)[:8]} emitted, but NO notification "
            "automation is installed (`trainmedic notify`): nobody is told"
        )
    get_run_logger().warning("%s: %s (%s)", what, summary, outcome)
    return ActionRecord(what=what, target=f"job {job_id}" if job_id else run_name, outcome=outcome)


class YesNoApproval(RunInput):
    """A human's yes or no to one destructive step (a rollback, a reset or reboot). The
    form's default is no, and no answer is a no: only a yes acts."""

    approve: bool = Field(default=False, description="go ahead as planned")
    note: str = Field(default="", max_length=200, pattern=SAFE_TEXT_RE.pattern)
    by: str = Field(default="", max_length=64, pattern=SAFE_TEXT_RE.pattern, description="who")


def ask_yes_no(
    *, job_id: str | None, category: str, asks: str, evidence: str, prompt: str, timeout_s: int
) -> tuple[bool, str]:
    """Tell on-call what this run asks (``asks``: "to roll job 12 back ...") and the line that
    answers it, then pause for the answer. Whether it is a yes, and who said what."""
    run_name = flow_run.get_name() or "local"
    tell_human(
        "approval.needed",
        job_id=job_id,
        category=category,
        summary=f"{run_name} asks {asks}",
        evidence=evidence,
        answer=f"`trainmedic approve {run_name} --reason TEXT` (or --reject); "
        f"no answer within {timeout_s} s does nothing",
    )
    try:
        answer = pause_flow_run(
            wait_for_input=YesNoApproval.with_initial_data(description=prompt, approve=False),
            timeout=timeout_s,
            poll_interval=2,
        )
    except FlowPauseTimeout:
        return False, f"no answer within {timeout_s} s: nothing done"
    verdict = ("approved" if answer.approve else "rejected") + (
        f" by {answer.by}" if answer.by else ""
    )
    return answer.approve, verdict + (f": {answer.note}" if answer.note else "")


@task(name="node-topology", cache_policy=NO_CACHE)
def node_topology() -> dict[str, NodePlace]:
    """Rack and leaf switch per node: the inventory's declaration, completed by the
    scheduler's own topology where it knows it (it wins: it is what placement uses)."""
    try:
        declared = Inventory(get_settings().inventory).places()
    except ConfigError:
        declared = {}
    known = get_scheduler().topology()
    merged = dict(declared)
    for node, place in known.items():
        mine = declared.get(node, NodePlace())
        merged[node] = NodePlace(rack=place.rack or mine.rack, switch=place.switch or mine.switch)
    return merged
