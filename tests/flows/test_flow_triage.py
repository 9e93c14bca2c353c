"""The triage runbook end to end on a real Prefect server, real ansible-runner and the
simulated cluster: the outcome is checked (which node, which checkpoint, the report)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from support.artifacts import artifact_text
from support.waits import server_events, wait_finished, wait_step, wait_until

from trainmedic.adapters import checkpoints
from trainmedic.core.models import JobSpec, JobState, NodeState

pytestmark = pytest.mark.server


def failed_job(sim, fault: str, *, gpu: int = 2, name: str = "pretrain"):  # type: ignore[no-untyped-def]
    cluster, scheduler = sim
    job = scheduler.submit(JobSpec(name=name, nodes=3, steps=100_000, checkpoint_every=20))
    wait_step(job, 65)
    cluster.inject(job.nodes[1], fault, gpu=gpu)
    return wait_finished(scheduler, job.job_id)


def report(result) -> str:  # type: ignore[no-untyped-def]
    return artifact_text(result.report_id)


def test_xid79_drains_origin_and_restarts_from_newest_valid_checkpoint(prefect_server, sim) -> None:
    from flows.triage import TriageRequest, triage

    _, scheduler = sim
    job = failed_job(sim, "xid79")
    origin = job.nodes[1]
    assert job.state is JobState.FAILED
    found = [c for c in checkpoints.scan(Path(job.checkpoint_dir)) if c.valid]
    # The newest checkpoint is truncated (written while the node died): it must be skipped.
    newest = Path(found[-1].path)
    shard = next(p for p in newest.iterdir() if p.name != checkpoints.MANIFEST)
    shard.write_bytes(shard.read_bytes()[:100])

    result = triage(TriageRequest(job_id=job.job_id, event="job.failed"))

    assert result.category == "GPUFallenOff"
    assert origin in (result.root_cause_host or "")
    assert result.drained == [origin]
    assert result.checkpoint_step == found[-2].step
    new = scheduler.job(result.new_job_id)
    assert new.resubmission_of == job.job_id
    assert new.spec.resume_from_step == found[-2].step
    assert origin not in new.nodes and origin in new.spec.exclude
    assert new.state is JobState.RUNNING
    drained = {n.name: n for n in scheduler.nodes()}[origin]
    assert drained.state is NodeState.DRAINED and "triage" in drained.reason
    assert "GPUFallenOff" in drained.reason and job.job_id in drained.reason

    text = report(result)
    assert "**GPUFallenOff**" in text
    assert f"step {found[-2].step}" in text
    assert f"new job **{new.job_id}**" in text
    assert "fallen off the bus" in text or "unspecified launch failure" in text
    assert f"| drain | {origin} |" in text

    # Replayed: ends at once as a duplicate, no diagnostics, no drain, no resubmission.
    again = triage(TriageRequest(job_id=job.job_id, event="job.failed"))
    assert again.not_handled and again.not_handled.startswith("duplicate")
    assert new.job_id in again.not_handled
    assert again.drained == [] and again.new_job_id is None
    assert len([j for j in scheduler.jobs() if j.resubmission_of == job.job_id]) == 1


def test_dry_run_changes_nothing(prefect_server, sim) -> None:
    from flows.triage import TriageRequest, triage

    _, scheduler = sim
    job = failed_job(sim, "ecc", name="dry")
    before = len(scheduler.jobs())
    result = triage(TriageRequest(job_id=job.job_id, dry_run=True))
    assert result.category == "ECCError"
    assert result.new_job_id is None and result.drained == []
    assert len(scheduler.jobs()) == before
    assert all(n.state is not NodeState.DRAINED for n in scheduler.nodes())
    assert "DRY RUN" in report(result)


def test_script_error_goes_to_the_owner_and_is_not_retried(prefect_server, sim) -> None:
    from flows.triage import TriageRequest, triage

    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="buggy", nodes=2, steps=100_000, owner="alice"))
    wait_step(job, 5)
    scheduler.inject_job_fault(job.job_id, "script")
    wait_finished(scheduler, job.job_id)
    result = triage(TriageRequest(job_id=job.job_id))
    assert result.category == "ScriptError"
    assert result.new_job_id is None
    text = report(result)
    assert f"notify owner | job {job.job_id}" in text and "KeyError" in text
    # No notification automation on this server: the report says nobody was told.
    assert "nobody is told" in text
    # ...but the event that would tell the owner is on the server, with what to do.
    notices = wait_until(
        lambda: [
            e
            for e in server_events(f"trainmedic.job.{job.job_id}")
            if e["event"] == "trainmedic.owner.notify"
        ],
        30,
        "the owner's notice",
    )
    assert notices[0]["payload"]["category"] == "ScriptError"
    assert "KeyError" in notices[0]["payload"]["evidence"]


def test_node_failure_without_proven_origin_is_located_by_pair_tests(prefect_server, sim) -> None:
    """A node that dies leaves no error of its own: the pair test must find it."""
    from flows.triage import TriageRequest, triage

    _, scheduler = sim
    job = failed_job(sim, "down", name="lost")
    dead = job.nodes[1]
    assert job.state is JobState.NODE_FAIL
    result = triage(TriageRequest(job_id=job.job_id, event="job.node_fail"))
    assert result.category == "NodeFailure"
    assert result.drained == [dead]
    new = scheduler.job(result.new_job_id)
    assert dead not in new.nodes and dead in new.spec.exclude
    text = report(result)
    assert "| pair test |" in text and f"faulty ['{dead}']" in text


def test_job_that_never_saved_starts_over(prefect_server, sim) -> None:
    from flows.triage import TriageRequest, triage

    cluster, scheduler = sim
    job = scheduler.submit(JobSpec(name="young", nodes=2, steps=100_000, checkpoint_every=500))
    wait_step(job, 5)
    cluster.inject(job.nodes[0], "xid79")
    failed = wait_finished(scheduler, job.job_id)
    result = triage(TriageRequest(job_id=failed.job_id))
    assert result.checkpoint_step is None
    new = scheduler.job(result.new_job_id)
    assert new.spec.resume_from_step is None and failed.nodes[0] not in new.nodes
    assert "restarted from the beginning" in report(result)


@pytest.mark.parametrize("stale_run", ["reused-an-earlier-run", None])
def test_a_stale_checkpoint_of_an_earlier_run_is_never_resumed(
    prefect_server, sim, stale_run
) -> None:
    """An earlier training run of the same name left iter_0000800 in the shared checkpoint
    directory; this run reached step ~65. The restart resumes from this run's own newest.
    Its manifest names the other run, or (written before manifests named their run) nothing:
    then only the job's own progress (step ~65, never 800) tells it is not this run's."""
    import json

    from flows.triage import TriageRequest, triage

    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="reused", nodes=3, steps=100_000, checkpoint_every=20))
    stale = Path(job.checkpoint_dir) / checkpoints.checkpoint_dirname(800)
    stale.mkdir(parents=True)
    (stale / "model.pt").write_bytes(b"old weights")
    (stale / checkpoints.MANIFEST).write_text(
        json.dumps(
            {
                "step": 800,
                "batch": 800,
                "files": {"model.pt": checkpoints.sha256_file(stale / "model.pt")},
                **({"run": stale_run} if stale_run else {}),
            }
        )
    )
    wait_step(job, 65)
    sim[0].inject(job.nodes[1], "xid79")
    failed = wait_finished(scheduler, job.job_id)
    result = triage(TriageRequest(job_id=failed.job_id, event="job.failed"))
    assert result.checkpoint_step is not None and result.checkpoint_step < 100
    assert scheduler.job(result.new_job_id).spec.resume_from_step == result.checkpoint_step


@pytest.mark.server
def test_a_stale_event_starts_nothing_but_a_human_can_still_ask(prefect_server, sim) -> None:
    from datetime import UTC, datetime, timedelta

    from flows.triage import TriageRequest, triage

    cluster, scheduler = sim
    job = scheduler.submit(JobSpec(name="stale", nodes=2, steps=100_000, checkpoint_every=20))
    wait_step(job, 25)
    cluster.inject(job.nodes[1], "xid79")
    failed = wait_finished(scheduler, job.job_id)
    yesterday = datetime.now(UTC) - timedelta(days=1)

    stale = triage(TriageRequest(job_id=failed.job_id, event="job.failed", occurred=yesterday))
    assert stale.not_handled and stale.not_handled.startswith("stale")
    assert not [n for n in scheduler.nodes() if n.state is NodeState.DRAINED]
    assert not [j for j in scheduler.jobs() if j.resubmission_of == failed.job_id]
    assert "not handled (stale)" in report(stale)

    asked = triage(TriageRequest(job_id=failed.job_id, event="manual", occurred=yesterday))
    assert asked.not_handled is None and asked.drained == [failed.nodes[1]]


@pytest.mark.server
def test_events_about_jobs_of_unmanaged_owners_start_nothing(
    prefect_server, sim, monkeypatch
) -> None:
    from flows.triage import TriageRequest, triage
    from trainmedic.core.settings import get_settings

    monkeypatch.setenv("TRAINMEDIC_MANAGED_OWNERS", "pretrain-team")
    get_settings.cache_clear()
    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="theirs", nodes=1, steps=5, owner="someone"))
    done = wait_finished(scheduler, job.job_id)
    result = triage(TriageRequest(job_id=done.job_id, event="job.failed"))
    assert result.not_handled and result.not_handled.startswith("foreign")
    assert "someone" in result.not_handled


@pytest.mark.server
def test_a_queued_resubmission_completes_the_triage_and_is_verified_later(
    prefect_server, sim, monkeypatch
) -> None:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    from flows.triage import TriageRequest, triage
    from flows.verify import VerifyRequest, verify_resubmission
    from trainmedic.core.settings import get_settings

    monkeypatch.setenv("TRAINMEDIC_QUEUE_GRACE_S", "1")
    get_settings.cache_clear()
    verify_resubmission.to_deployment(name="verify-resubmission").apply()
    cluster, scheduler = sim
    blocker = scheduler.submit(JobSpec(name="blocker", nodes=6, steps=100_000))
    job = scheduler.submit(JobSpec(name="queued", nodes=2, steps=100_000, checkpoint_every=20))
    wait_step(job, 25)
    cluster.inject(job.nodes[1], "xid79")
    failed = wait_finished(scheduler, job.job_id)

    # One node left for a two-node job: the resubmission waits in the queue.
    result = triage(TriageRequest(job_id=failed.job_id, event="job.failed"))
    assert result.drained == [failed.nodes[1]] and result.new_job_id
    assert scheduler.job(result.new_job_id).state is JobState.PENDING
    assert "| verify | job" in report(result) and "queued" in report(result)
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(
                name=DeploymentFilterName(any_=["verify-resubmission"])
            )
        )
    (scheduled,) = [r for r in runs if r.parameters["request"]["job_id"] == result.new_job_id]
    assert scheduled.parameters["request"]["from_step"] == result.checkpoint_step

    # The capacity frees up; the verification (what the worker runs) sees it train.
    scheduler.cancel(blocker.job_id, "make room")
    verified = verify_resubmission(VerifyRequest(**scheduled.parameters["request"]))
    assert verified.state == "RUNNING" and verified.step > result.checkpoint_step


@pytest.mark.server
def test_a_resubmission_that_never_starts_is_reported(prefect_server, sim, monkeypatch) -> None:
    from flows.verify import VerifyRequest, verify_resubmission
    from trainmedic.core.errors import SchedulerError
    from trainmedic.core.settings import get_settings

    monkeypatch.setenv("TRAINMEDIC_PENDING_TIMEOUT_S", "3")
    get_settings.cache_clear()
    _, scheduler = sim
    scheduler.submit(JobSpec(name="everything", nodes=8, steps=100_000))
    stuck = scheduler.submit(JobSpec(name="stuck", nodes=1, steps=100_000))
    assert scheduler.job(stuck.job_id).state is JobState.PENDING
    with pytest.raises(SchedulerError, match=r"still PENDING .* never started"):
        verify_resubmission(VerifyRequest(job_id=stuck.job_id, from_step=0))


@pytest.mark.server
def test_a_paused_triage_is_answered_from_the_cli_with_who_and_why(
    prefect_server, sim, policy, capsys
) -> None:

    from support.waits import paused_triage

    from trainmedic.cli.main import main

    policy(auto_approve_max=0, max_share=0.5)
    _, scheduler = sim
    failed, origin, run_name, thread, box = paused_triage(sim, "triage-ask")
    assert not [n for n in scheduler.nodes() if n.state is NodeState.DRAINED]
    scheduler.admin_drain("node008", "fan replacement")
    asks = wait_until(
        lambda: [
            e
            for e in server_events(f"trainmedic.job.{failed.job_id}")
            # Other tests' clusters on this server have a job 1001 too: this run's own ask.
            if e["event"] == "trainmedic.approval.needed" and run_name in e["payload"]["answer"]
        ],
        30,
        "the approval request",
    )
    assert f"trainmedic approve {run_name}" in asks[0]["payload"]["answer"]
    assert origin in asks[0]["payload"]["summary"]

    # `status` shows the run waiting, what answers it, and the nodes out with whose drain.
    capsys.readouterr()
    assert main(["status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    waiting = {w["name"]: w for w in status["waiting_for_a_human"]}
    assert waiting[run_name]["job_id"] == failed.job_id
    assert waiting[run_name]["answer"].startswith(f"trainmedic approve {run_name}")
    assert "breaker closed" in status["breaker"]
    assert {n["name"]: n["owner"] for n in status["nodes_out"]} == {"node008": "other"}

    assert main(["approve", run_name, "--reason", "Xid 79 confirmed", "--by", "alice"]) == 0
    thread.join(timeout=180)
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert result.drained == [origin]
    assert "human (alice): approve: Xid 79 confirmed" in report(result)
    capsys.readouterr()
    assert main(["status", "--json"]) == 0
    nodes_out = json.loads(capsys.readouterr().out)["nodes_out"]
    assert {n["name"]: n["owner"] for n in nodes_out} == {"node008": "other", origin: "trainmedic"}


def test_a_crash_loop_pages_on_call_and_resubmits_no_more(prefect_server, sim, policy) -> None:
    """Three failed attempts in a row (the limit here), each diagnosed as something else
    (ECC, a lost GPU, an NVLink fault): misreadings of one fault must not reset the count. The
    third triage resubmits nothing and pages, naming the loop, the three categories and
    what answers it."""
    from flows.triage import TriageRequest, triage

    policy(auto_approve_max=2, max_share=0.5, crash_loop_after=3, min_drainable=2)
    cluster, scheduler = sim
    job = failed_job(sim, "ecc", name="loop")
    for fault in ("xid79", "nvlink"):
        done = triage(TriageRequest(job_id=job.job_id))
        assert done.new_job_id, done
        again = scheduler.job(done.new_job_id)
        wait_step(again, 70)
        cluster.inject(again.nodes[0], fault)
        job = wait_finished(scheduler, again.job_id)
    result = triage(TriageRequest(job_id=job.job_id))
    assert result.new_job_id is None and result.human_needed
    pages = wait_until(
        lambda: [
            e
            for e in server_events(f"trainmedic.job.{job.job_id}")
            if e["event"] == "trainmedic.page" and "crash loop" in e["payload"]["summary"]
        ],
        30,
        "the crash-loop page",
    )
    summary = pages[0]["payload"]["summary"]
    assert "the last 3 runs of this training job failed" in summary
    assert all(c in summary for c in ("ECCError", "GPUFallenOff", "NVLinkError")), summary
    assert f"trainmedic triage {job.job_id}" in pages[0]["payload"]["answer"]


def test_a_human_correction_changes_the_verdict_of_the_next_failure_like_it(
    prefect_server, sim, capsys
) -> None:
    """The human says the KeyError of job A was a corrupt data shard (storage), on its host;
    job B fails the same way later: its triage gives the human's verdict, says whose, and
    `runs` shows A's correction."""
    from flows.triage import TriageRequest, triage
    from trainmedic.cli.main import main

    _, scheduler = sim
    jobs = []
    for name in ("first", "second"):
        job = scheduler.submit(JobSpec(name=name, nodes=2, steps=100_000, owner="alice"))
        wait_step(job, 5)
        scheduler.inject_job_fault(job.job_id, "script")
        jobs.append(wait_finished(scheduler, job.job_id))
    first, second = jobs
    assert triage(TriageRequest(job_id=first.job_id)).category == "ScriptError"
    origin = first.nodes[0]  # rank 0 printed the traceback
    argv = ["correct", first.job_id, "--category", "StorageError", "--host", origin]
    assert main([*argv, "--reason", "corrupt data shard", "--by", "bob"]) == 0
    assert main(["correct", first.job_id, "--category", "Gremlins"]) == 2  # one line, no run

    result = triage(TriageRequest(job_id=second.job_id))
    assert result.category == "StorageError"
    assert result.root_cause_host == second.nodes[0]
    assert "bob corrected job" in report(result)

    capsys.readouterr()
    assert main(["runs", "--job", first.job_id, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and rows[0]["corrected"] == "StorageError by bob"


@pytest.fixture
def exporter(sim, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The simulated cluster's DCGM exporter over real HTTP as the runbooks' telemetry."""
    import threading

    from trainmedic.core.settings import get_settings
    from trainmedic.sim.exporter import make_server

    server = make_server(sim[0], port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    monkeypatch.setenv("TRAINMEDIC_TELEMETRY_URL", url)
    get_settings.cache_clear()
    yield url
    server.shutdown()
    server.server_close()
    get_settings.cache_clear()


def test_a_node_repaired_last_week_is_history_and_the_fresh_fault_is_drained(
    prefect_server, sim, exporter
) -> None:
    """node001's GPU 2 had an uncorrectable ECC error last week and was repaired by a GPU
    reset: its kernel log still holds the Xid 48/63 lines and its DCGM counters their
    lifetime counts (aggregate ECC 2, last Xid 48). This job loses node003's NVLink: node003
    is the origin and drained; node001 stays in service."""
    import time

    from flows.triage import TriageRequest, triage

    cluster, scheduler = sim
    last_week = time.time() - 7 * 24 * 3600
    cluster.inject("node001", "ecc", gpu=2, at=last_week)
    cluster.repair("node001", reboot=False, at=last_week + 3600)
    job = scheduler.submit(JobSpec(name="fresh", nodes=3, steps=100_000, checkpoint_every=20))
    assert job.nodes == ("node001", "node002", "node003")
    wait_step(job, 45)
    cluster.inject("node003", "nvlink", gpu=1)
    failed = wait_finished(scheduler, job.job_id)

    result = triage(TriageRequest(job_id=failed.job_id, event="job.failed"))

    assert result.category == "NVLinkError"
    assert "node003" in (result.root_cause_host or "")
    assert "node001" not in (result.root_cause_host or "")
    assert result.drained == ["node003"]
    nodes = {n.name: n for n in scheduler.nodes()}
    assert nodes["node001"].state is not NodeState.DRAINED
    new = scheduler.job(result.new_job_id)
    assert "node003" not in new.nodes and "node001" not in new.spec.exclude
    text = report(result)
    assert "Xid (PCI:0000:5b:00): 74" in text or "NVLink" in text
