"""SlurmScheduler against a real slurmctld + slurmd cluster (``scripts/slurm.sh up``).

Expects the 4-node cluster of scripts/slurm.sh (node001..node004, one CPU each). SLURM_CONF is
taken from the environment, else from $TRAINMEDIC_SLURM_DIR (default
/var/tmp/trainmedic-slurm)/slurm.conf when that exists. Skipped when no cluster answers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.waits import wait_until

from trainmedic.adapters.scheduler.slurm import DEFAULT_EXPORT, SlurmScheduler
from trainmedic.core.errors import InputError, JobNotFound, SchedulerError
from trainmedic.core.models import JobInfo, JobSpec, JobState, NodeState

pytestmark = pytest.mark.slurm

NODES = ("node001", "node002", "node003", "node004")
DEFAULT_CONF = Path(os.environ.get("TRAINMEDIC_SLURM_DIR", "/var/tmp/trainmedic-slurm"))


def _cluster_env() -> tuple[dict[str, str] | None, str]:
    """(env for Slurm CLIs, why not) — decided once, at collection time."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return None, "no Slurm client tools (run: bash scripts/slurm.sh up)"
    env = dict(os.environ)
    if "SLURM_CONF" not in env and (DEFAULT_CONF / "slurm.conf").is_file():
        env["SLURM_CONF"] = str(DEFAULT_CONF / "slurm.conf")
    try:
        proc = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N"],
            capture_output=True,
            text=True,
            timeout=15,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, "sinfo did not answer in 15 s (is slurmctld up? bash scripts/slurm.sh up)"
    if proc.returncode != 0:
        return None, f"sinfo failed: {proc.stderr.strip()[:200]} (bash scripts/slurm.sh up)"
    missing = set(NODES) - set(proc.stdout.split())
    if missing:
        return None, f"cluster lacks {sorted(missing)}: not the scripts/slurm.sh cluster"
    return env, ""


ENV, WHY = _cluster_env()
if ENV is None:
    pytestmark = [pytest.mark.slurm, pytest.mark.skip(reason=f"no Slurm cluster: {WHY}")]


@pytest.fixture(autouse=True)
def slurm_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    assert ENV is not None
    if "SLURM_CONF" in ENV:  # the adapter and _sh() both read it from os.environ
        monkeypatch.setenv("SLURM_CONF", ENV["SLURM_CONF"])
    # Each test starts on a quiet cluster. A test that failed half-way may have left a
    # `sleep 300` job behind; the next one would then find its job PENDING on Resources or
    # its drained node still "draining", and fail for a reason that is not its own.
    _quiesce()
    yield
    _quiesce(wait=False)


def _quiesce(wait: bool = True, timeout: float = 120.0) -> None:
    """Cancel every job of this test cluster (only these tests use it) and put every node
    back in service; with ``wait``, until the queue is empty and every node idle."""
    leftover = _sh("squeue", "-h", "-o", "%i", check=False).split()
    if leftover:
        _sh("scancel", *leftover, check=False)
    for node in NODES:
        _sh("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
    if not wait:
        return

    def quiet() -> bool:
        queue = _sh("squeue", "-h", "-o", "%i", check=False).split()
        states = _sh("sinfo", "-h", "-N", "-o", "%T", check=False).split()
        return not queue and bool(states) and all(state == "idle" for state in states)

    wait_until(quiet, timeout, "an empty queue and every node idle", interval=0.5)


def _sh(*args: str, check: bool = True) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args}: {proc.stderr}")
    return proc.stdout


# The simulated trainer's pace travels to the job like any variable a site lists for export.
EXPORT = (*DEFAULT_EXPORT, "TRAINMEDIC_SIM_STEP_SECONDS")


def make(tmp_path: Path, *command: str) -> SlurmScheduler:
    return SlurmScheduler(
        tmp_path / "slurm", command=list(command) or None, timeout_s=30, export=EXPORT
    )


def wait_for(
    scheduler: SlurmScheduler,
    job_id: str,
    done: Callable[[JobInfo], bool] = lambda j: j.state.finished,
    timeout: float = 60.0,
) -> JobInfo:
    deadline = time.monotonic() + timeout
    while True:
        info = scheduler.job(job_id)
        if done(info):
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {info.state} after {timeout}s: {info}")
        time.sleep(0.3)


def wait_node(node: str, state: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        out = _sh("sinfo", "-h", "-N", "-n", node, "-o", "%T|%E").strip()
        if out.split("|", 1)[0] == state:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"{node} is {out!r}, not {state} after {timeout}s")
        time.sleep(0.3)


def test_successful_job_completes_with_log(tmp_path: Path) -> None:
    scheduler = make(
        tmp_path,
        "bash",
        "-c",
        'echo "hello from $TRAINMEDIC_NODES"; echo beat > "$TRAINMEDIC_HEARTBEAT"',
    )
    spec = JobSpec(name="ok-job", nodes=2)
    submitted = scheduler.submit(spec)
    assert submitted.state in (JobState.PENDING, JobState.RUNNING)

    info = wait_for(scheduler, submitted.job_id)
    assert info.state is JobState.COMPLETED
    assert info.exit_code == 0
    assert len(info.nodes) == 2
    assert info.ended_at is not None
    log = Path(info.log_dir) / f"slurm-{info.job_id}.out"
    assert log.is_file()
    assert f"hello from {','.join(info.nodes)}" in log.read_text()
    assert Path(info.heartbeat_path).read_text().strip() == "beat"
    assert Path(info.log_dir).parent == tmp_path / "slurm" / "jobs" / info.job_id
    assert (
        JobSpec.model_validate_json((Path(info.log_dir).parent / "spec.json").read_text())
        == info.spec
    )
    # The submitted spec, plus the training run's identity a first submission gets.
    assert info.spec.run_id is not None
    assert info.spec.model_copy(update={"run_id": None}) == spec

    # Accounting (slurmdbd, jobcomp/none as sites run it) agrees with the controller once
    # slurmctld has sent it the job's end (it lags by a moment), and keeps the comment that
    # tags the job as trainmedic's run.
    def recorded():  # type: ignore[no-untyped-def]
        found = [j for j in scheduler._sacct(["-j", info.job_id]) if j.job_id == info.job_id]
        # The start record can land before the end record (seen on a busy CI machine:
        # RUNNING, no exit code): wait for the end, not just the allocation.
        ended = found and found[0].nodes == info.nodes and found[0].state.finished
        return found[0] if ended else None

    from_log = wait_until(recorded, 30, f"job {info.job_id} complete in accounting")
    assert (from_log.state, from_log.exit_code) == (JobState.COMPLETED, 0)
    assert from_log.source == "accounting"
    assert from_log.comment.startswith("trainmedic:")


def test_partition_account_and_comment_are_read_back_from_slurm(tmp_path: Path) -> None:
    """What admission scopes on (TRAINMEDIC_MANAGED_PARTITIONS/_ACCOUNTS/_COMMENT_TAG), as
    slurmctld and then accounting report it. The testbed has one partition, debug, and the
    accounts sacctmgr creates with the cluster: root, with root's association, when the tests
    run as root; otherwise the account is only what Slurm defaults to, and not asserted."""
    account = "root" if _sh("id", "-un").strip() == "root" else None
    scheduler = make(tmp_path, "true")
    spec = JobSpec(name="scoped", nodes=1, partition="debug", account=account, comment="tm-x")
    submitted = scheduler.submit(spec)
    info = wait_for(scheduler, submitted.job_id)
    assert info.state is JobState.COMPLETED and info.managed
    run = Path(info.log_dir).parent.resolve().name
    for seen in (submitted, info):
        assert seen.partition == "debug"
        assert seen.comment == f"trainmedic:{run} tm-x"  # the run first, the spec's after
        if account:
            assert seen.account == account

    # Accounting lags the controller: for a moment its record of a finished job can still
    # lack the partition (seen on 22.05), as the earlier test waits for its node list.
    def recorded():  # type: ignore[no-untyped-def]
        found = [j for j in scheduler._sacct(["-j", info.job_id]) if j.job_id == info.job_id]
        return found[0] if found and found[0].state.finished and found[0].partition else None

    from_log = wait_until(recorded, 30, f"job {info.job_id} finished in accounting")
    assert (from_log.partition, from_log.comment) == ("debug", info.comment)
    if account:
        assert from_log.account == account
    # Resubmissions stay in the scope: the spec's partition, account and comment go along.
    again = wait_for(scheduler, scheduler.resubmit(info.job_id).job_id)
    assert (again.partition, again.account) == ("debug", info.account)
    assert again.comment.endswith(" tm-x") and again.managed


def test_the_cluster_runs_accounting_without_a_job_completion_log() -> None:
    """The tier's cluster is configured as most sites are: slurmdbd, JobCompType=jobcomp/none."""
    jobcomp = subprocess.run(
        ["sacct", "-c", "-n"], capture_output=True, text=True, timeout=30, check=False
    )
    assert "job completion is disabled" in (jobcomp.stdout + jobcomp.stderr).lower()
    assert "trainmedic" in _sh("sacctmgr", "-n", "-P", "list", "cluster", "format=cluster")


def test_only_listed_variables_reach_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINMEDIC_PROBE_SECRET", "leaked")
    scheduler = make(tmp_path, "bash", "-c", 'echo "probe=${TRAINMEDIC_PROBE_SECRET:-unset}"')
    info = wait_for(scheduler, scheduler.submit(JobSpec(name="env", nodes=1)).job_id)
    out = (Path(info.log_dir) / f"slurm-{info.job_id}.out").read_text()
    assert "probe=unset" in out


def test_failing_job_reports_exit_code(tmp_path: Path) -> None:
    scheduler = make(tmp_path, "bash", "-c", "echo dying >&2; exit 3")
    info = wait_for(scheduler, scheduler.submit(JobSpec(name="bad-job", nodes=1)).job_id)
    assert info.state is JobState.FAILED
    assert info.exit_code == 3
    assert info.reason == "NonZeroExitCode"


def test_simulated_trainer_runs_under_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("trainmedic.sim.job")
    monkeypatch.setenv("TRAINMEDIC_SIM_STEP_SECONDS", "0.01")  # in the export list
    scheduler = make(tmp_path)
    spec = JobSpec(name="sim-train", nodes=2, gpus_per_node=2, steps=20, checkpoint_every=10)
    info = wait_for(scheduler, scheduler.submit(spec).job_id, timeout=120)
    log_dir = Path(info.log_dir)
    slurm_log = log_dir / f"slurm-{info.job_id}.out"
    assert info.state is JobState.COMPLETED, slurm_log.read_text() if slurm_log.exists() else ""
    assert info.exit_code == 0
    hosts = {p.name.split(".")[1] for p in log_dir.glob("rank-*.out")}
    assert hosts == set(info.nodes)
    assert len(list(log_dir.glob("rank-*.out"))) == 4  # 2 nodes x 2 GPUs
    assert Path(info.heartbeat_path).is_file()
    assert info.checkpoint_dir == str(tmp_path / "slurm" / "checkpoints" / "sim-train")
    assert any(Path(info.checkpoint_dir).iterdir())


def test_drain_resume_roundtrip(tmp_path: Path) -> None:
    scheduler = make(tmp_path, "true")
    reason = "trainmedic test xid 79 (gpu3)"
    assert scheduler.drain("node004", reason) is True
    assert wait_node("node004", "drained") == f"drained|{reason}"
    (info,) = [n for n in scheduler.nodes() if n.name == "node004"]
    assert (info.state, info.reason) == (NodeState.DRAINED, reason)

    assert scheduler.drain("node004", "another reason") is False  # no change, reason kept
    assert wait_node("node004", "drained") == f"drained|{reason}"

    assert scheduler.resume("node004") is True
    wait_node("node004", "idle")
    assert scheduler.resume("node004") is False
    assert {n.name: n.state for n in scheduler.nodes()}["node004"] is NodeState.IDLE


def test_draining_a_busy_node(tmp_path: Path) -> None:
    scheduler = make(tmp_path, "sleep", "30")
    job = wait_for(
        scheduler,
        scheduler.submit(JobSpec(name="busy", nodes=1)).job_id,
        lambda j: j.state is JobState.RUNNING,
    )
    (node,) = job.nodes
    try:
        assert scheduler.drain(node, "drain while busy") is True
        assert wait_node(node, "draining") == "draining|drain while busy"
        assert {n.name: n.state for n in scheduler.nodes()}[node] is NodeState.DRAINED
    finally:
        scheduler.cancel(job.job_id, "test over")


def test_exclude_is_honoured(tmp_path: Path) -> None:
    scheduler = make(tmp_path, "true")
    # Slurm fills the lowest-numbered nodes first, so without the exclusion node001 is taken.
    infos = [
        scheduler.submit(JobSpec(name="excl", nodes=3, exclude=("node001",))),
        scheduler.submit(JobSpec(name="excl1", nodes=1, exclude=("node001", "node002"))),
    ]
    three, one = (wait_for(scheduler, i.job_id) for i in infos)
    assert three.state is JobState.COMPLETED
    assert three.nodes == ("node002", "node003", "node004")
    assert one.state is JobState.COMPLETED
    assert one.nodes[0] in ("node003", "node004")


def test_cancel_running_job(tmp_path: Path) -> None:
    scheduler = make(tmp_path, "sleep", "60")
    job_id = scheduler.submit(JobSpec(name="to-cancel", nodes=1)).job_id
    wait_for(scheduler, job_id, lambda j: j.state is JobState.RUNNING)
    assert scheduler.cancel(job_id, "hung (no heartbeat for 600s)") is True
    info = wait_for(scheduler, job_id, timeout=30)
    assert info.state is JobState.CANCELLED
    assert info.reason == "hung (no heartbeat for 600s)"
    assert scheduler.cancel(job_id, "again") is False


def test_cancel_pending_job(tmp_path: Path) -> None:
    blocker = make(tmp_path, "sleep", "60")
    block_id = blocker.submit(JobSpec(name="blocker", nodes=4)).job_id
    try:
        wait_for(blocker, block_id, lambda j: j.state is JobState.RUNNING)
        scheduler = make(tmp_path, "true")
        info = scheduler.submit(JobSpec(name="queued", nodes=1))  # every node is busy
        assert info.state is JobState.PENDING
        assert info.nodes == ()
        assert info.exit_code is None
        assert scheduler.cancel(info.job_id, "not needed") is True
        assert wait_for(scheduler, info.job_id, timeout=30).state is JobState.CANCELLED
    finally:
        blocker.cancel(block_id, "test over")


def test_impossible_request_is_a_scheduler_error(tmp_path: Path) -> None:
    scheduler = make(tmp_path, "true")
    with pytest.raises(SchedulerError, match="Requested node configuration is not available"):
        scheduler.submit(JobSpec(name="too-big", nodes=4, exclude=("node004",)))
    assert not list((tmp_path / "slurm" / "runs").iterdir())  # no orphan run directory


def test_resubmit_and_jobs_listing(tmp_path: Path) -> None:
    scheduler = make(tmp_path, "true")
    first = wait_for(scheduler, scheduler.submit(JobSpec(name="resub", nodes=1)).job_id)
    second = scheduler.resubmit(first.job_id, exclude=first.nodes, resume_from_step=10)
    assert second.resubmission_of == first.job_id
    assert second.checkpoint_dir == first.checkpoint_dir
    second = wait_for(scheduler, second.job_id)
    assert second.state is JobState.COMPLETED
    assert not set(second.nodes) & set(first.nodes)

    listed = scheduler.jobs()
    ids = [j.job_id for j in listed]
    assert ids.index(first.job_id) < ids.index(second.job_id)  # oldest first
    assert {j.job_id: j.resubmission_of for j in listed}[second.job_id] == first.job_id


def test_unknown_job(tmp_path: Path) -> None:
    scheduler = make(tmp_path)
    with pytest.raises(JobNotFound):
        scheduler.job("987654321")


def test_injection_rejected_and_nothing_changed(tmp_path: Path) -> None:
    scheduler = make(tmp_path)
    with pytest.raises(InputError):
        scheduler.drain("node001;rm -rf /", "maintenance")
    with pytest.raises(InputError):
        scheduler.drain("node001", "ok\nState=DOWN")
    with pytest.raises(InputError):
        scheduler.drain("node001", "$(touch /tmp/trainmedic-pwned)")
    assert {n.name: n.state for n in scheduler.nodes()}["node001"] is not NodeState.DRAINED
    assert not Path("/tmp/trainmedic-pwned").exists()


def test_from_settings_against_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainmedic.adapters.scheduler import get_scheduler
    from trainmedic.core.settings import Settings

    monkeypatch.delenv("TRAINMEDIC_SLURM_ROOT", raising=False)
    scheduler = get_scheduler(Settings(home=tmp_path, scheduler="slurm"))
    assert isinstance(scheduler, SlurmScheduler)
    assert scheduler.root == tmp_path / "slurm"
    assert {n.name for n in scheduler.nodes()} >= set(NODES)


def test_isolating_a_node_stops_only_the_failed_jobs_steps_there(tmp_path: Path) -> None:
    """Two steps of one job on two nodes and another job beside them: isolating node002
    cancels the job's step on node002 and nothing else."""
    scheduler = make(
        tmp_path,
        "bash",
        "-c",
        "srun -N1 -n1 -w node001 sleep 300 & srun -N1 -n1 -w node002 sleep 300 & wait",
    )
    job = scheduler.submit(JobSpec(name="two-steps", nodes=2))
    bystander = make(tmp_path / "b", "sleep", "300").submit(JobSpec(name="bystander", nodes=1))

    def steps() -> dict[str, str]:
        out = _sh("squeue", "--steps", "--jobs", job.job_id, "-h", "-o", "%i|%N")
        found = dict(line.split("|", 1) for line in out.split())
        return {s: n for s, n in found.items() if s.split(".")[1] not in ("batch", "extern")}

    running = wait_until(lambda: steps() if len(steps()) == 2 else None, 60, "two job steps")
    on_node002 = [s for s, n in running.items() if n == "node002"]
    assert scheduler.cancel_steps_on(job.job_id, "node002", "trainmedic isolate") == on_node002
    remaining = wait_until(lambda: steps() if len(steps()) == 1 else None, 30, "one step left")
    assert list(remaining.values()) == ["node001"]
    assert scheduler.job(job.job_id).state is JobState.RUNNING
    assert scheduler.job(bystander.job_id).state in (JobState.RUNNING, JobState.PENDING)
    # Nothing of it left there: a second call changes nothing.
    assert scheduler.cancel_steps_on(job.job_id, "node002", "trainmedic isolate") == []
    scheduler.cancel(job.job_id, "test done")
    scheduler.cancel(bystander.job_id, "test done")


def test_a_hold_is_a_reservation_that_never_takes_a_busy_node(tmp_path: Path) -> None:
    s = make(tmp_path, "sleep", "300")
    busy = s.submit(JobSpec(name="busy", nodes=1))
    jobs = [busy.job_id]
    try:
        busy_node = wait_for(s, busy.job_id, lambda j: j.state is JobState.RUNNING).nodes[0]
        held = s.hold("trainmedic-locate-slurmtest", list(NODES), 600)
        assert sorted(held) == sorted(set(NODES) - {busy_node})
        assert "trainmedic-locate-slurmtest" in _sh("scontrol", "show", "reservation")
        # Nothing lands on the held nodes: with the one other node busy, a new job waits.
        waiting = s.submit(JobSpec(name="waiting", nodes=1))
        jobs.append(waiting.job_id)
        time.sleep(3)
        assert s.job(waiting.job_id).state is JobState.PENDING
        assert s.release("trainmedic-locate-slurmtest")
        assert not s.release("trainmedic-locate-slurmtest")  # idempotent
        wait_for(s, waiting.job_id, lambda j: j.state is JobState.RUNNING)
    finally:
        _sh("scontrol", "delete", "ReservationName=trainmedic-locate-slurmtest", check=False)
        for job_id in jobs:
            s.cancel(job_id, "test done")
