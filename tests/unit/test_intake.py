from datetime import UTC, datetime, timedelta

from support.builders import job_info

from trainmedic.adapters.events import to_prefect_event
from trainmedic.adapters.intake import TRIGGER_WINDOW_S, Intake, failure_event
from trainmedic.core.errors import SchedulerError, ServerError
from trainmedic.core.files import write_json_atomic
from trainmedic.core.models import JobEvent, JobInfo, JobState
from trainmedic.decisions.admission import EventScope


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


def test_the_status_mid_pass_shows_what_is_still_to_send_and_no_stale_error(tmp_path) -> None:
    """Saved after each send: once the server took one, the error of the outage is gone
    and only the failures not yet sent show as waiting (an operator, or `status`, reading
    it mid-pass sees the truth, not "nothing waiting, still failing")."""
    scheduler = FakeScheduler()
    intake = Intake(scheduler, tmp_path, lambda e: None)
    intake.poll()
    first, second = job("5", JobState.FAILED), job("6", JobState.TIMEOUT)
    scheduler.list = [first, second]
    order = [j.job_id for j in sorted(scheduler.list, key=lambda j: j.ended_at)]

    def refuse(event):
        raise ServerError("the Prefect API could not be reached")

    intake.send = refuse
    intake.run_pass()
    assert intake.status().last_error
    seen: list[tuple[list[str], str]] = []

    def send(event):
        status = intake.status()
        seen.append(([p[0] for p in status.pending], status.last_error))

    intake.send = send
    intake.run_pass()
    assert seen[0][0] == order and seen[0][1]  # before the first send: the outage stands
    assert seen[1] == ([order[1]], "")  # after it: one left, the server answered


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


def _age(intake: Intake, seconds: float) -> None:
    """Move every recorded send ``seconds`` into the past."""
    status = intake.status()
    status.sent = {j: at - timedelta(seconds=seconds) for j, at in status.sent.items()}
    write_json_atomic(intake.state_path, status.model_dump(mode="json"))


def test_a_failure_no_runbook_took_up_is_reported_again_once(tmp_path) -> None:
    """The server accepted the event, then dropped the automation's action (it does, under a
    burst on SQLite): after the grace, the failure is reported again, as a new event."""
    scheduler = FakeScheduler()
    sent: list[JobEvent] = []
    intake = Intake(
        scheduler, tmp_path, sent.append, taken_up=lambda jobs: set(), redeliver_after_s=60
    )
    intake.poll()
    scheduler.list = [job("7", JobState.FAILED)]
    assert [e.job_id for e in intake.poll()] == ["7"]
    assert intake.run_pass().redelivered == []  # within the grace: triage may be queued
    _age(intake, 61)
    again = intake.run_pass().redelivered
    assert [e.job_id for e in again] == ["7"] and sent[-1] is again[0]
    first = sent[0]
    assert again[0].kind == first.kind and again[0].occurred > first.occurred
    assert to_prefect_event(again[0])["id"] != to_prefect_event(first)["id"]
    assert again[0].reason.startswith("reported again: no runbook took up")
    _age(intake, 600)
    assert intake.run_pass().redelivered == [] and len(sent) == 2  # once
    assert "1 failure(s) reported again" in intake.status().describe(datetime.now(UTC))


def test_a_failure_whose_start_the_server_dropped_is_reported_again_after_the_window(
    tmp_path,
) -> None:
    """The server says it dropped the action of job 7's event (action.failed): 7 is reported
    again once the trigger's window has passed (a report inside it would be folded into the
    dropped one), not after the whole grace; job 8, of which the server said nothing, waits."""
    scheduler = FakeScheduler()
    sent: list[JobEvent] = []
    asked: list[datetime] = []

    def dropped(since: datetime) -> set[str]:
        asked.append(since)
        return {"7"}

    intake = Intake(
        scheduler,
        tmp_path,
        sent.append,
        taken_up=lambda jobs: set(),
        redeliver_after_s=300,
        dropped=dropped,
    )
    intake.poll()
    scheduler.list = [job("7", JobState.FAILED), job("8", JobState.FAILED)]
    intake.poll()
    _age(intake, TRIGGER_WINDOW_S - 5)
    assert intake.run_pass().redelivered == []  # inside the window: it would be folded
    _age(intake, 6)
    again = intake.run_pass().redelivered
    assert [e.job_id for e in again] == ["7"]
    assert "(the server dropped its start)" in again[0].reason
    assert datetime.now(UTC) - asked[-1] >= timedelta(seconds=299)  # only recent drops
    _age(intake, 300)
    assert [e.job_id for e in intake.run_pass().redelivered] == ["8"]


def test_the_intake_knows_the_triage_triggers_window() -> None:
    from pathlib import Path

    import yaml

    config = yaml.safe_load((Path(__file__).parents[2] / "prefect.yaml").read_text())
    (trigger,) = [
        t
        for d in config["deployments"]
        for t in d.get("triggers") or []
        if t["name"] == "job-failed-triage"
    ]
    assert trigger["within"] == TRIGGER_WINDOW_S


def test_failures_taken_up_resubmitted_foreign_or_stale_are_not_reported_again(
    tmp_path,
) -> None:
    scheduler = FakeScheduler()
    asked: list[list[str]] = []

    def taken_up(jobs: list[JobInfo]) -> set[str]:
        asked.append([j.job_id for j in jobs])
        return {"1"}

    intake = Intake(scheduler, tmp_path, lambda e: None, taken_up=taken_up, redeliver_after_s=60)
    intake.poll()
    long_ago = datetime.now(UTC) - timedelta(hours=2)
    scheduler.list = [
        job("1", JobState.FAILED),  # a run claimed it (in an incident)
        job("2", JobState.FAILED),  # resubmitted (by a human, say)
        job("3", JobState.FAILED).model_copy(update={"managed": False}),
        job("4", JobState.FAILED).model_copy(update={"ended_at": long_ago}),  # stale
    ]
    intake.poll()
    scheduler.list.append(job_info("5", state=JobState.RUNNING, resubmission_of="2"))
    _age(intake, 120)
    assert intake.run_pass().redelivered == []
    assert asked == [["1"]]  # the server is asked only about what could be unanswered


def test_a_server_that_cannot_say_what_was_taken_up_is_asked_again(tmp_path) -> None:
    scheduler = FakeScheduler()
    answers: list[object] = [ServerError("the Prefect API could not be reached"), set()]

    def taken_up(jobs: list[JobInfo]) -> set[str]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    intake = Intake(scheduler, tmp_path, lambda e: None, taken_up=taken_up, redeliver_after_s=1)
    intake.poll()
    scheduler.list = [job("7", JobState.FAILED)]
    intake.poll()
    _age(intake, 5)
    result = intake.run_pass()
    assert result.redelivered == [] and "could not be reached" in result.error
    assert [e.job_id for e in intake.run_pass().redelivered] == ["7"]


def test_a_failure_outside_the_event_scope_is_never_reported_again(tmp_path) -> None:
    """The site's scope (here one partition) decides what the intake reports again, as it
    decides what triage acts on: a job in another partition, or of unknown partition, would
    only end as foreign; the job in scope is reported again."""
    scheduler = FakeScheduler()
    asked: list[list[str]] = []

    def taken_up(jobs: list[JobInfo]) -> set[str]:
        asked.append([j.job_id for j in jobs])
        return set()

    intake = Intake(
        scheduler,
        tmp_path,
        lambda e: None,
        taken_up=taken_up,
        redeliver_after_s=60,
        scope=EventScope(partitions=frozenset({"train"})),
    )
    intake.poll()
    scheduler.list = [
        job("1", JobState.FAILED).model_copy(update={"partition": "train"}),
        job("2", JobState.FAILED).model_copy(update={"partition": "debug"}),
        job("3", JobState.FAILED),  # the scheduler did not say: not proven in scope
    ]
    intake.poll()
    _age(intake, 120)
    assert [e.job_id for e in intake.run_pass().redelivered] == ["1"]
    assert asked == [["1"]]
