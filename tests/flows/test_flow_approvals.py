"""Every pause is answered from the CLI (`trainmedic approve RUN [--nodes ...] [--reject]
--reason`), addressed by run id or by a name only one run has, and who answered and why is
recorded in the run and its report (real Prefect server, simulated cluster, the real
playbooks).

No capsys here: Prefect's console handler would keep capsys's stream after it is closed and
later tests would fail writing to it. Results come from the flows' return values and
artifacts; the CLI's own output, where a test needs it, is read through redirect_stdout/err
into StringIOs that are never closed."""

from __future__ import annotations

import contextlib
import io
import json
import uuid

import pytest
from prefect.client.orchestration import get_client
from support.artifacts import artifact_text, run_artifacts
from support.waits import (
    paused_triage,
    run_in_thread,
    unique_run_name,
    wait_paused,
    wait_step,
    wait_until,
)

from trainmedic.cli.common import EXIT_INPUT
from trainmedic.core.models import JobSpec, JobState, NodeState

pytestmark = pytest.mark.server


def cli(*argv: str) -> tuple[int, str, str]:
    """``trainmedic ARGV`` in this process: its exit code, stdout and stderr."""
    from trainmedic.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def drained(scheduler) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(n.name for n in scheduler.nodes() if n.state is NodeState.DRAINED)


def paused_rollback(sim, name: str):  # type: ignore[no-untyped-def]
    """A rollback paused for a human: a spike reported at step 40 that the flat loss curve
    does not show (flows.rollback asks through ask_yes_no). The job, the run's thread, its
    result box and the run's id."""
    from flows.rollback import RollbackRequest, rollback

    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="flat", nodes=1, steps=100_000, checkpoint_every=20))
    wait_step(job, 50)
    request = RollbackRequest(job_id=job.job_id, reported_step=40, approval_timeout_s=180)
    thread, box = run_in_thread(rollback, request, name)
    run_id = wait_paused(name, box=box)
    return job, thread, box, run_id


def test_a_rejected_triage_isolation_drains_nothing_and_its_report_says_who_and_why(
    prefect_server, sim, policy
) -> None:
    policy(auto_approve_max=0, max_share=0.5)  # one proven origin: a human is asked
    _, scheduler = sim
    _, _, run_name, thread, box = paused_triage(sim, "triage-reject")

    code, _, err = cli(
        "approve", run_name, "--reject", "--reason", "field engineer on site", "--by", "bob"
    )
    assert code == 0, err
    thread.join(timeout=180)
    assert not thread.is_alive()
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert result.drained == []
    assert drained(scheduler) == []
    assert "human (bob): reject: field engineer on site" in artifact_text(result.report_id)


def test_a_locate_approved_for_a_subset_drains_only_that_subset(
    prefect_server, sim, policy
) -> None:
    """Two convicted nodes, one approval asked for both; `--nodes` drains only the one
    named, and the report says who narrowed it and why."""
    from flows.locate import LocateRequest, locate_faulty_nodes

    policy(auto_approve_max=0, max_share=0.5)
    cluster, scheduler = sim
    cluster.inject("node003", "xid79")
    cluster.inject("node006", "ecc")
    run_name = unique_run_name("locate-cli-subset")
    request = LocateRequest(nodes="node[001-008]", isolate=True, approval_timeout_s=240)
    thread, box = run_in_thread(locate_faulty_nodes, request, run_name)
    wait_paused(run_name, timeout=240, box=box)
    assert drained(scheduler) == []  # nothing before the human answers

    code, out, err = cli(
        "approve",
        run_name,
        "--nodes",
        "node006",
        "--reason",
        "node003 is already in for RMA",
        "--by",
        "carol",
        "--json",
    )
    assert code == 0, err
    answer = json.loads(out)
    assert answer["answer"] == "approved node006"
    assert answer["run_input"]["decision"] == "approve_subset"
    thread.join(timeout=180)
    assert not thread.is_alive()
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert result.faulty == ["node003", "node006"]
    assert result.isolation.mode == "approval"
    assert result.isolation.approved == ["node006"]
    assert result.isolation.drained == ["node006"]
    assert drained(scheduler) == ["node006"]
    summary = str(run_artifacts(result.flow_run_id)["locate-summary"])
    assert "human (carol): approve_subset: node003 is already in for RMA" in summary


def test_a_paused_rollback_approved_from_the_cli_acts_and_records_who(prefect_server, sim) -> None:
    _, scheduler = sim
    run_name = unique_run_name("rollback-ask")
    job, thread, box, _ = paused_rollback(sim, run_name)
    assert scheduler.job(job.job_id).state is JobState.RUNNING  # nothing before the answer

    code, _, err = cli("approve", run_name, "--reason", "grad norm spiked too", "--by", "dave")
    assert code == 0, err
    thread.join(timeout=180)
    assert not thread.is_alive()
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert result.acted
    assert result.new_job_id is not None and result.checkpoint_step is not None
    assert scheduler.job(result.new_job_id).spec.resume_from_step == result.checkpoint_step
    wait_until(lambda: scheduler.job(job.job_id).state.finished, 30, "the old job stopped")
    assert "approved by dave: grad norm spiked too" in artifact_text(result.report_id)


def test_a_name_two_runs_share_is_refused_and_the_run_id_answers(prefect_server, sim) -> None:
    """Approving (or cancelling) the wrong run is destructive: a shared name is one line
    listing the runs, exit 2, and nothing answered; the id then answers the paused one."""
    from flows.rollback import rollback

    _, scheduler = sim
    run_name = unique_run_name("rollback-twice")
    job, thread, box, paused_id = paused_rollback(sim, run_name)
    with get_client(sync_client=True) as client:
        # Another run under the same name (never picked up: no deployment, no worker).
        other = client.create_flow_run(rollback, name=run_name)

    for argv in (
        ("approve", run_name, "--reason", "go"),
        ("approve", run_name, "--reject"),
        ("cancel", run_name),
    ):
        code, out, err = cli(*argv)
        assert code == EXIT_INPUT, (argv, out, err)
        assert "Traceback" not in err
        refusals = [line for line in err.splitlines() if line.startswith("trainmedic: ")]
        assert len(refusals) == 1, err
        assert "2 flow runs have that name" in refusals[0]
        assert f"{paused_id} (Paused)" in refusals[0] and str(other.id) in refusals[0]
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(paused_id).state
    assert state is not None and state.is_paused()  # nothing answered, nothing cancelled
    assert scheduler.job(job.job_id).state is JobState.RUNNING

    code, _, err = cli("approve", str(uuid.uuid4()), "--reason", "go")
    assert code == EXIT_INPUT and "no flow run with that id" in err

    code, out, err = cli("approve", str(paused_id), "--reason", "by id", "--by", "erin", "--json")
    assert code == 0, err
    assert json.loads(out)["name"] == run_name
    thread.join(timeout=180)
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert result.acted and result.new_job_id is not None
    assert "approved by erin: by id" in artifact_text(result.report_id)
    code, _, err = cli("cancel", str(other.id), "--reason", "test cleanup")
    assert code == 0, err
