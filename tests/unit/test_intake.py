from datetime import timedelta

from support.builders import job_info

from trainmedic.adapters.intake import Intake, failure_event
from trainmedic.core.errors import SchedulerError, ServerError
from trainmedic.core.models import JobInfo, JobState


class FakeScheduler:
    """Only the jobs() view the intake reads; the state machine itself is tested elsewhere."""

    def __init__(self) -> None:
        self.list: list[JobInfo] = []

    def jobs(self) -> list[JobInfo]:
        return list(self.list)


def job(job_id: str, state: JobState) -> JobInfo:
    return job_info(job_id, state=state, ended=True)


def test_failure_states_map_to_events() -> None:
    assert failure_event(job("1", JobState.FAILED)).kind == "job.failed"
    assert failure_event(job("1", JobState.NODE_FAIL)).kind == "job.node_fail"
    assert failure_event(job("1", JobState.TIMEOUT)).kind == "job.timeout"
    assert failure_event(job("1", JobState.COMPLETED)) is None
    assert failure_event(job("1", JobState.CANCELLED)) is None


def test_intake_reports_each_failure_once_and_skips_history(tmp_path) -> None:
    scheduler = FakeScheduler()
    scheduler.list = [job("1", JobState.FAILED)]
    sent = []
    intake = Intake(scheduler, tmp_path, sent.append)
    assert intake.poll() == []  # first pass: existing failures are history
    scheduler.list += [job("2", JobState.RUNNING)]
    assert intake.poll() == []
    scheduler.list[-1] = job("2", JobState.NODE_FAIL)
    assert [e.job_id for e in intake.poll()] == ["2"]
    assert intake.poll() == []
    # A restarted intake remembers.
    assert Intake(scheduler, tmp_path, sent.append).poll() == []
    assert [e.kind for e in sent] == ["job.node_fail"]


def test_failed_send_is_retried_next_pass_in_order_and_recorded(tmp_path) -> None:
    """The server away: the pass ends at the first refused send, nothing is marked, the
    status says how far behind the intake is and why; back again, everything goes, in the
    order it failed, each once."""
    scheduler = FakeScheduler()
    intake = Intake(scheduler, tmp_path, lambda e: None)
    intake.poll()
    first, second = job("5", JobState.FAILED), job("6", JobState.TIMEOUT)
    scheduler.list = [second, first] if second.ended_at > first.ended_at else [first, second]
    calls: list[str] = []
    down = True

    def send(event):
        calls.append(event.job_id)
        if down:
            raise ServerError("the Prefect API could not be reached")

    intake.send = send
    result = intake.run_pass()
    assert result.sent == [] and result.pending == 2 and "could not be reached" in result.error
    status = intake.status()
    assert status.errors_in_a_row == 1 and [p[0] for p in status.pending] == ["5", "6"]
    later = status.pending[0][1] + timedelta(seconds=90)
    assert status.lag_s(later) == 90 and "2 failure(s) waiting" in status.describe(later)
    intake.run_pass()
    assert intake.status().errors_in_a_row == 2 and calls == ["5", "5"]
    down = False
    assert [e.job_id for e in intake.poll()] == ["5", "6"]
    assert intake.poll() == []
    assert calls == ["5", "5", "5", "6"]
    status = intake.status()
    assert status.pending == [] and status.last_error == "" and status.errors_in_a_row == 0


def test_a_scheduler_error_on_the_first_pass_keeps_history_as_history(tmp_path) -> None:
    scheduler = FakeScheduler()
    sent = []
    intake = Intake(scheduler, tmp_path, sent.append)

    def broken() -> list[JobInfo]:
        raise SchedulerError("squeue timed out")

    scheduler.jobs = broken
    assert intake.run_pass().error == "squeue timed out"
    assert intake.status() is None  # still the first pass
    scheduler.jobs = lambda: [job("1", JobState.FAILED)]
    assert intake.poll() == [] and sent == []  # history, not a flood


def test_the_record_forgets_jobs_the_scheduler_no_longer_lists(tmp_path) -> None:
    scheduler = FakeScheduler()
    scheduler.list = [job(str(n), JobState.FAILED) for n in range(5)]
    intake = Intake(scheduler, tmp_path, lambda e: None)
    intake.poll()
    assert len(intake.status().reported) == 5
    scheduler.list = scheduler.list[3:]
    intake.poll()
    assert intake.status().reported == ["3", "4"]


def test_backfill_reports_existing_failures(tmp_path) -> None:
    scheduler = FakeScheduler()
    scheduler.list = [job("1", JobState.FAILED)]
    sent = []
    Intake(scheduler, tmp_path, sent.append, backfill=True).poll()
    assert [e.job_id for e in sent] == ["1"]
