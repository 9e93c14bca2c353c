"""The intake: turn the scheduler's job states into trainmedic events.

It remembers which failures it has reported (``<home>/intake.json``), so a restart of the
intake never reports a failure twice, and on its very first pass it takes the failures that
are already there as known instead of flooding the runbooks with history.

It is a service that must outlive the things it talks to: a Prefect server that restarts or a
scheduler command that times out ends the pass, is recorded (``status``) and the next pass
retries. A failure is marked reported only once its event was accepted, so nothing is lost
while the server is away; each event's id comes from its content, so a send whose answer was
lost and is sent again is dropped by the server, and triage's admission drops a replay too.

Accepted is not answered: a Prefect server under a burst can give up on an automation's
action (its in-process client retries a busy SQLite for about a minute, then records
``prefect.automation.action.failed`` and drops it). So a failure that, ``redeliver_after_s``
after its event was accepted, no runbook has taken up (no incident holds the job) and nothing
resubmitted, is reported once more as a new event (its own id, occurred now), once. When the
server says it dropped the action of the job's event, the failure does not wait that long:
it is reported again as soon as the triage trigger's window (``TRIGGER_WINDOW_S``) has passed,
which would fold an earlier report into the dropped one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from trainmedic.adapters.scheduler.base import Scheduler
from trainmedic.core.errors import TrainmedicError
from trainmedic.core.files import locked, read_json, write_json_atomic
from trainmedic.core.models import JobEvent, JobInfo, JobState
from trainmedic.decisions.admission import EventScope, out_of_scope

__all__ = [
    "EVENT_FOR_STATE",
    "TRIGGER_WINDOW_S",
    "Intake",
    "IntakeStatus",
    "PassResult",
    "failure_event",
    "intake_status",
    "unanswered",
]

# The triage trigger's `within` in prefect.yaml: its reports of one job's failure that occurred
# in this window after the one it fired on start nothing (tests/unit/test_intake.py checks the
# two agree).
TRIGGER_WINDOW_S = 60.0

EVENT_FOR_STATE = {
    JobState.FAILED: "job.failed",
    JobState.NODE_FAIL: "job.node_fail",
    JobState.TIMEOUT: "job.timeout",
}


def failure_event(job: JobInfo) -> JobEvent | None:
    kind = EVENT_FOR_STATE.get(job.state)
    if kind is None:
        return None
    return JobEvent(
        kind=kind,  # type: ignore[arg-type]
        job_id=job.job_id,
        occurred=job.ended_at or job.submitted_at,
        nodes=job.nodes,
        exit_code=job.exit_code,
        reason=job.reason[:512],
    )


class IntakeStatus(BaseModel):
    """What ``trainmedic status`` shows of the intake: is it keeping up, and if not, why."""

    model_config = ConfigDict(extra="ignore")

    reported: list[str] = []
    last_pass_at: datetime | None = None
    last_sent_at: datetime | None = None
    # Failures seen but not yet accepted by the server, oldest first: (job id, when it failed).
    pending: list[tuple[str, datetime]] = []
    last_error: str = ""
    errors_in_a_row: int = 0
    # When each reported failure's event was accepted, and the failures reported again
    # because no runbook took them up (each once).
    sent: dict[str, datetime] = {}
    redelivered: list[str] = []

    def lag_s(self, now: datetime) -> float:
        """How far behind the intake is: the age of the oldest failure not yet reported."""
        return max(0.0, (now - self.pending[0][1]).total_seconds()) if self.pending else 0.0

    def describe(self, now: datetime) -> str:
        if self.last_pass_at is None:
            return "no pass yet"
        parts = [f"last pass {max(0.0, (now - self.last_pass_at).total_seconds()):.0f} s ago"]
        if self.pending:
            parts.append(f"{len(self.pending)} failure(s) waiting, lag {self.lag_s(now):.0f} s")
        else:
            parts.append("nothing waiting")
        if self.last_error:
            parts.append(f"failing ({self.errors_in_a_row} in a row): {self.last_error}")
        if self.redelivered:
            parts.append(
                f"{len(self.redelivered)} failure(s) reported again, no runbook took them up: "
                + ", ".join(self.redelivered[-5:])
            )
        return ", ".join(parts)


def intake_status(home: Path) -> IntakeStatus | None:
    """The intake's last pass as recorded under ``home``; None before its first pass."""
    raw = read_json(Path(home) / "intake.json")
    return None if raw is None else IntakeStatus.model_validate(raw)


class PassResult(BaseModel):
    sent: list[JobEvent]
    pending: int
    error: str = ""
    redelivered: list[JobEvent] = []


def unanswered(
    jobs: Sequence[JobInfo],
    *,
    sent: dict[str, datetime],
    redelivered: Collection[str],
    now: datetime,
    after_s: float,
    scope: EventScope,
    dropped: Collection[str] = (),
) -> list[JobInfo]:
    """Failures reported at least ``after_s`` ago (those of ``dropped`` jobs, whose trigger
    action the server dropped, once the trigger's window has passed) and not yet reported
    again, that nothing resubmitted, of jobs in ``scope`` (triage's admission would end any
    other as foreign) that failed less than its ``max_age_s`` ago (older, it would refuse the
    event as stale). Whether a runbook took one up (an incident holds it) is the caller's
    question to the server: asked only of these few."""
    resubmitted = {j.resubmission_of for j in jobs if j.resubmission_of}

    def waited(job: JobInfo) -> bool:
        wait = min(after_s, TRIGGER_WINDOW_S) if job.job_id in dropped else after_s
        return now - sent[job.job_id] >= timedelta(seconds=wait)

    return [
        job
        for job in jobs
        if job.job_id in sent
        and job.job_id not in redelivered
        and job.job_id not in resubmitted
        and out_of_scope(job, scope) is None
        and failure_event(job) is not None
        and waited(job)
        and now - (job.ended_at or job.submitted_at) < timedelta(seconds=scope.max_age_s)
    ]


class Intake:
    def __init__(
        self,
        scheduler: Scheduler,
        home: Path,
        send: Callable[[JobEvent], object],
        *,
        backfill: bool = False,
        taken_up: Callable[[Sequence[JobInfo]], Collection[str]] | None = None,
        redeliver_after_s: float = 300.0,
        scope: EventScope | None = None,
        dropped: Callable[[datetime], Collection[str]] | None = None,
    ) -> None:
        """``taken_up``: of these jobs, the ids a runbook has taken up (on the Prefect
        server: an incident holds them); None turns redelivery off. ``scope``: the jobs and
        event ages this installation acts on (the settings' event scope); a failure outside it
        is never reported again, as triage would end it as foreign or stale. ``dropped``: the
        jobs whose trigger action the server dropped since a time (its action.failed events);
        None: such a failure waits ``redeliver_after_s`` like any other."""
        self.scheduler = scheduler
        self.send = send
        self.state_path = Path(home) / "intake.json"
        self.lock_path = Path(home) / "intake.lock"
        self.backfill = backfill
        self.taken_up = taken_up
        self.redeliver_after_s = redeliver_after_s
        self.scope = scope or EventScope()
        self.dropped = dropped

    def status(self) -> IntakeStatus | None:
        return intake_status(self.state_path.parent)

    def poll(self) -> list[JobEvent]:
        """One pass: report every failure not reported before. Returns what was sent; a
        failed send or scheduler query ends the pass early (see :meth:`run_pass`)."""
        return self.run_pass().sent

    def run_pass(self) -> PassResult:
        """One pass, in the order the failures happened; the first send the server does not
        accept ends it (later failures wait behind it, so they are sent in order)."""
        with locked(self.lock_path):
            previous = self.status()
            status = previous or IntakeStatus()
            reported = set(status.reported)
            now = datetime.now(UTC)
            try:
                jobs = self.scheduler.jobs()
            except (TrainmedicError, OSError) as exc:
                if previous is not None:  # a first pass that saw nothing stays a first pass
                    self._save(status, reported, status.pending, f"scheduler: {exc}", now)
                return PassResult(sent=[], pending=len(status.pending), error=str(exc))
            # Forget what the scheduler no longer lists (its history window moved on): the
            # record stays the size of that window, not of the cluster's whole life.
            listed = {job.job_id for job in jobs}
            reported &= listed
            status.sent = {j: at for j, at in status.sent.items() if j in listed}
            status.redelivered = [j for j in status.redelivered if j in listed]
            events = [e for e in map(failure_event, jobs) if e is not None]
            events = sorted((e for e in events if e.job_id not in reported), key=_when)
            if previous is None and not self.backfill:
                # The first pass takes what already failed as history.
                reported.update(e.job_id for e in events)
                events = []
            sent: list[JobEvent] = []
            error = ""
            for number, event in enumerate(events):
                try:
                    self.send(event)
                except (TrainmedicError, OSError) as exc:
                    error = f"send: {exc}"
                    events = events[number:]
                    break
                # Marked only once sent: a failed send is retried on the next pass.
                reported.add(event.job_id)
                sent.append(event)
                status.last_sent_at = datetime.now(UTC)
                status.sent[event.job_id] = status.last_sent_at
                # Saved after each send (a crash mid-pass must not send it again); the
                # server just took it, so an earlier error no longer stands, and what the
                # status shows waiting is what is still to send.
                later = [(e.job_id, e.occurred) for e in events[number + 1 :]]
                self._save(status, reported, later, "", now)
            else:
                events = []
            waiting = [(e.job_id, e.occurred) for e in events]
            again: list[JobEvent] = []
            if not error and self.taken_up is not None:
                again, error = self._redeliver(jobs, status, now)
            self._save(status, reported, waiting, error, now)
            return PassResult(sent=sent, pending=len(waiting), error=error, redelivered=again)

    def _redeliver(
        self, jobs: list[JobInfo], status: IntakeStatus, now: datetime
    ) -> tuple[list[JobEvent], str]:
        """Report again, once, each failure no runbook took up (see the module's doc)."""
        assert self.taken_up is not None
        dropped: set[str] = set()
        if self.dropped is not None and status.sent:
            # Only failures still inside the ordinary wait can gain from the server's word.
            try:
                dropped = set(self.dropped(now - timedelta(seconds=self.redeliver_after_s)))
            except (TrainmedicError, OSError) as exc:
                return [], f"server: {exc}"
        waiting = unanswered(
            jobs,
            sent=status.sent,
            redelivered=status.redelivered,
            now=now,
            after_s=self.redeliver_after_s,
            scope=self.scope,
            dropped=dropped,
        )
        if not waiting:
            return [], ""
        try:
            taken = set(self.taken_up(waiting))
        except (TrainmedicError, OSError) as exc:
            return [], f"server: {exc}"
        again: list[JobEvent] = []
        for job in waiting:
            if job.job_id in taken:
                continue
            first = failure_event(job)
            assert first is not None
            sent_at = status.sent[job.job_id]
            event = first.model_copy(
                update={
                    "occurred": now,
                    "reason": (
                        f"reported again: no runbook took up the failure reported at "
                        f"{sent_at:%H:%M:%S} UTC"
                        + (" (the server dropped its start)" if job.job_id in dropped else "")
                        + f"; {first.reason}"
                    )[:512],
                }
            )
            try:
                self.send(event)
            except (TrainmedicError, OSError) as exc:
                return again, f"send: {exc}"
            status.redelivered.append(job.job_id)
            again.append(event)
        return again, ""

    def _save(
        self,
        status: IntakeStatus,
        reported: set[str],
        waiting: list[tuple[str, datetime]],
        error: str,
        now: datetime,
    ) -> None:
        status.reported = sorted(reported)
        status.last_pass_at = now
        status.pending = waiting
        status.errors_in_a_row = status.errors_in_a_row + 1 if error else 0
        status.last_error = error[:300]
        write_json_atomic(self.state_path, status.model_dump(mode="json"))


def _when(event: JobEvent) -> datetime:
    return event.occurred
