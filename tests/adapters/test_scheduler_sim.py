"""The simulated scheduler with real trainer processes: failures, checkpoints, drains."""

from pathlib import Path

import pytest
from support.waits import wait_finished, wait_step

from trainmedic.adapters import checkpoints
from trainmedic.core.errors import InputError, JobNotFound
from trainmedic.core.models import JobSpec, JobState, NodeState


def test_job_completes_with_checkpoints(sim) -> None:
    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="ok", nodes=2, steps=40, checkpoint_every=10))
    done = wait_finished(scheduler, job.job_id)
    assert done.state is JobState.COMPLETED and done.exit_code == 0
    found = checkpoints.scan(Path(done.checkpoint_dir))
    assert [c.step for c in found if c.valid] == [10, 20, 30, 40]


def test_xid79_on_one_node_fails_the_job_like_a_real_one(sim) -> None:
    cluster, scheduler = sim
    job = scheduler.submit(JobSpec(name="xid", nodes=2, steps=5000, checkpoint_every=20))
    wait_step(job, 25)
    cluster.inject(job.nodes[1], "xid79", gpu=1)
    done = wait_finished(scheduler, job.job_id)
    assert done.state is JobState.FAILED and done.exit_code == 1
    logs = Path(done.log_dir)
    culprit = (logs / f"rank-00005.{job.nodes[1]}.err").read_text()
    assert "CUDA error: unspecified launch failure" in culprit
    other = (logs / f"rank-00002.{job.nodes[0]}.err").read_text()
    assert "Watchdog caught collective operation timeout" in other


def test_down_node_is_node_fail(sim) -> None:
    cluster, scheduler = sim
    job = scheduler.submit(JobSpec(name="down", nodes=2, steps=5000))
    wait_step(job, 3)
    cluster.inject(job.nodes[0], "down")
    done = wait_finished(scheduler, job.job_id)
    assert done.state is JobState.NODE_FAIL
    assert not list(Path(done.log_dir).glob(f"*.{job.nodes[0]}.err"))
    states = {n.name: n.state for n in scheduler.nodes()}
    assert states[job.nodes[0]] is NodeState.DOWN


def test_resubmit_resumes_from_checkpoint_and_skips_batches(sim) -> None:
    _, scheduler = sim
    first = scheduler.submit(JobSpec(name="resume", nodes=1, steps=30, checkpoint_every=10))
    wait_finished(scheduler, first.job_id)
    second = scheduler.resubmit(first.job_id, resume_from_step=20, skip_batches=(21, 25), steps=40)
    done = wait_finished(scheduler, second.job_id)
    assert done.resubmission_of == first.job_id
    out = (Path(done.log_dir) / "rank-00000.node001.out").read_text()
    assert "loading checkpoint" in out and "at iteration 20" in out
    assert "skipping data batches 21-25" in out
    rows = (Path(done.log_dir).parent / "loss.csv").read_text().split()
    assert rows[0].startswith("21,26,")  # step 21 consumed batch 26


def test_drain_is_idempotent_and_excluded_from_allocation(sim) -> None:
    _, scheduler = sim
    assert scheduler.drain("node001", "trainmedic test: ECC") is True
    assert scheduler.drain("node001", "trainmedic test: ECC") is False
    node = next(n for n in scheduler.nodes() if n.name == "node001")
    assert node.state is NodeState.DRAINED and node.reason == "trainmedic test: ECC"
    job = scheduler.submit(JobSpec(name="x", nodes=2, steps=5, exclude=("node002",)))
    assert "node001" not in job.nodes and "node002" not in job.nodes
    assert scheduler.resume("node001") is True
    assert scheduler.resume("node001") is False


def test_pending_when_not_enough_nodes(sim) -> None:
    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="big", nodes=9, steps=5))
    assert job.state is JobState.PENDING and "needs 9 nodes" in job.reason
    assert scheduler.cancel(job.job_id, "too big") is True
    assert scheduler.job(job.job_id).state is JobState.CANCELLED


def test_partition_account_and_comment_are_reported_and_kept_by_resubmission(sim) -> None:
    """As Slurm: a job without them is in the default partition under the default account
    with no comment; a job's own stay with it, and with its resubmissions, so a site's scope
    (TRAINMEDIC_MANAGED_PARTITIONS/_ACCOUNTS/_COMMENT_TAG) keeps covering the training run."""
    _, scheduler = sim
    plain = scheduler.submit(JobSpec(name="plain", nodes=9))  # too big: stays PENDING
    assert (plain.partition, plain.account, plain.comment) == ("gpu", "default", "")
    spec = JobSpec(name="tagged", nodes=9, partition="a100", account="llm", comment="tm-managed")
    tagged = scheduler.submit(spec)
    again = scheduler.resubmit(tagged.job_id, nodes=8, steps=5)
    for job in (scheduler.job(tagged.job_id), again, scheduler.job(again.job_id)):
        assert (job.partition, job.account, job.comment) == ("a100", "llm", "tm-managed")
    assert wait_finished(scheduler, again.job_id).partition == "a100"


@pytest.mark.parametrize("reason", ["x\ny", "$(reboot)", "a`b`", ""])
def test_drain_rejects_unsafe_reasons(sim, reason: str) -> None:
    _, scheduler = sim
    with pytest.raises(InputError, match="reason"):
        scheduler.drain("node001", reason)


def test_unknown_job_and_node(sim) -> None:
    _, scheduler = sim
    with pytest.raises(JobNotFound):
        scheduler.job("999999")
    with pytest.raises(InputError, match="node"):
        scheduler.drain("node042", "why")


def test_held_nodes_take_no_job_until_released(sim) -> None:
    _, scheduler = sim
    running = scheduler.submit(JobSpec(name="running", nodes=2, steps=100_000))
    everyone = [f"node{i:03d}" for i in range(1, 9)]
    held = scheduler.hold("trainmedic-locate-t1", everyone, 600)
    assert sorted(held) == sorted(set(everyone) - set(running.nodes))  # never a job's nodes
    waiting = scheduler.submit(JobSpec(name="waiting", nodes=2, steps=100_000))
    assert scheduler.job(waiting.job_id).state is JobState.PENDING
    assert scheduler.release("trainmedic-locate-t1")
    assert not scheduler.release("trainmedic-locate-t1")  # idempotent
    assert scheduler.job(waiting.job_id).state is JobState.RUNNING
    assert not set(scheduler.job(waiting.job_id).nodes) & set(running.nodes)


def test_a_bad_batch_injected_into_a_running_job_takes_effect(sim) -> None:
    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="poison", nodes=1, steps=100_000))
    wait_step(job, 10)
    scheduler.inject_job_fault(job.job_id, "nan", batch=25)
    wait_step(job, 30)
    rows = Path(job.checkpoint_dir).parent.parent / "jobs" / job.job_id / "loss.csv"
    losses = {int(r.split(",")[1]): r.split(",")[2] for r in rows.read_text().split()}
    assert losses[24] != "nan" and losses[25] == "nan" and losses[29] == "nan"


def test_a_recreated_cluster_starts_clean(sim, capsys) -> None:  # type: ignore[no-untyped-def]
    """`sim create` again: the earlier cluster's jobs (stopped), checkpoints, data faults and
    this home's diagnosis ledger and intake record are gone: job ids start again at 1001."""
    from trainmedic.cli.main import main
    from trainmedic.core.settings import get_settings

    settings = get_settings()
    _, scheduler = sim
    job = scheduler.submit(JobSpec(name="old", nodes=1, steps=100_000, checkpoint_every=5))
    wait_step(job, 12)
    scheduler.inject_job_fault(job.job_id, "spike", batch=500)
    (settings.home / "diagnoses.json").write_text('{"1001": "ECCError"}')
    assert main(["sim", "create", "--nodes", "4"]) == 0
    assert scheduler.jobs() == []
    assert not (settings.sim_home / "checkpoints").exists()
    assert not (settings.sim_home / "data").exists()
    assert not (settings.home / "diagnoses.json").exists()
    assert scheduler.submit(JobSpec(name="new", nodes=1)).job_id == "1001"
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["sim", "job-fault", "--help"])
    helptext = capsys.readouterr().out
    assert all(kind in helptext for kind in ("hang", "script", "spike", "nan"))
