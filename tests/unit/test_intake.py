import pytest
from support.builders import job_info

from trainmedic.adapters.intake import Intake, failure_event
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


def test_failed_send_is_retried_next_pass(tmp_path) -> None:
    scheduler = FakeScheduler()
    intake = Intake(scheduler, tmp_path, lambda e: None)
    intake.poll()
    scheduler.list = [job("5", JobState.FAILED)]
    calls = []

    def flaky(event):
        calls.append(event)
        if len(calls) == 1:
            raise ConnectionError("server restarting")

    intake.send = flaky
    with pytest.raises(ConnectionError):
        intake.poll()
    assert [e.job_id for e in intake.poll()] == ["5"]
    assert len(calls) == 2


def test_backfill_reports_existing_failures(tmp_path) -> None:
    scheduler = FakeScheduler()
    scheduler.list = [job("1", JobState.FAILED)]
    sent = []
    Intake(scheduler, tmp_path, sent.append, backfill=True).poll()
    assert [e.job_id for e in sent] == ["1"]
