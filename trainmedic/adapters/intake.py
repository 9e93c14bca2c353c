"""The intake: turn the scheduler's job states into trainmedic events.

It remembers which failures it has reported (``<home>/intake.json``), so a restart of the
intake never reports a failure twice, and on its very first pass it takes the failures that
are already there as known instead of flooding the runbooks with history.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trainmedic.adapters.scheduler.base import Scheduler
from trainmedic.core.files import locked, read_json, write_json_atomic
from trainmedic.core.models import JobEvent, JobInfo, JobState

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


class Intake:
    def __init__(
        self,
        scheduler: Scheduler,
        home: Path,
        send: Callable[[JobEvent], object],
        *,
        backfill: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.send = send
        self.state_path = Path(home) / "intake.json"
        self.lock_path = Path(home) / "intake.lock"
        self.backfill = backfill

    def poll(self) -> list[JobEvent]:
        """One pass: report every failure not reported before. Returns what was sent."""
        with locked(self.lock_path):
            state = read_json(self.state_path)
            first_pass = state is None
            reported: set[str] = set((state or {}).get("reported", []))
            sent: list[JobEvent] = []
            for job in self.scheduler.jobs():
                event = failure_event(job)
                if event is None or job.job_id in reported:
                    continue
                if first_pass and not self.backfill:
                    reported.add(job.job_id)
                    continue
                self.send(event)
                # Marked only once sent: a failed send is retried on the next pass.
                reported.add(job.job_id)
                sent.append(event)
                write_json_atomic(self.state_path, {"reported": sorted(reported)})
            write_json_atomic(self.state_path, {"reported": sorted(reported)})
            return sent
