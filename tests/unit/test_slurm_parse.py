"""SlurmScheduler without Slurm: parsers (on output captured from Slurm 22.05.8), input
validation before any subprocess, and the submit/lookup plumbing against a fake CLI."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from trainmedic.adapters.scheduler import slurm, slurm_parse
from trainmedic.adapters.scheduler.slurm import SlurmScheduler
from trainmedic.adapters.scheduler.slurm_parse import (
    JOBCOMP_FIELDS,
    job_state,
    node_state,
    parse_exit_code,
    parse_node_line,
    parse_sacct,
    parse_scontrol_job,
    parse_squeue_json,
    validate_reason,
)
from trainmedic.core.errors import ConfigError, InputError, JobNotFound, SchedulerError
from trainmedic.core.models import JobSpec, JobState, NodeState

REAL_RUN = subprocess.run  # the fakes below replace subprocess.run for everyone

# Captured from `scontrol show node -o` on the scripts/slurm.sh cluster.
NODE_IDLE = (
    "NodeName=node001 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=0.20 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=localhost "
    "NodeHostName=localhost Port=16818 Version=22.05.8 OS=Linux 6.18.44-fc-v1098 #1 SMP "
    "PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=23529 Sockets=1 Boards=1 State=IDLE "
    "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  "
    "BootTime=2026-12-02T14:20:48 SlurmdStartTime=2026-12-02T14:28:21 "
    "LastBusyTime=2026-12-02T14:28:24 CfgTRES=cpu=1,mem=1000M,billing=1 AllocTRES= CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s"
)
NODE_DRAINING = (
    "NodeName=node003 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=1 CPUTot=1 "
    "OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 "
    "State=ALLOCATED+DRAIN ThreadsPerCore=1 Partitions=debug  AllocTRES=cpu=1 "
    "ExtSensorsTemp=n/s Reason=xid 79 (gpu3) a=b [root@2026-12-02T14:28:31]"
)
JOB_FAILED = (
    "JobId=1 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 "
    "Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode "
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0 RunTime=00:00:00 "
    "TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-02T14:28:24 "
    "EligibleTime=2026-12-02T14:28:24 StartTime=2026-12-02T14:28:24 EndTime=2026-12-02T14:28:25 "
    "Partition=debug AllocNode:Sid=localhost:2773 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList=node[001-002] BatchHost=node001 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=2,billing=2 Socks/Node=* Comment=trainmedic:r1 "
    "Command=(null) WorkDir=/work/main StdErr=/work/main/slurm-1.out StdIn=/dev/null "
    "StdOut=/work/main/slurm-1.out Power="
)
# Captured from `scontrol show job -o` on the scripts/slurm.sh cluster: under an account, the
# spec's comment after the run tag (sbatch --account=root --comment="trainmedic:x-1 tm-x
# nightly").
JOB_TAGGED = (
    "JobId=4 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901756 "
    "Nice=0 Account=root QOS=normal JobState=PENDING Reason=None Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED "
    "TimeMin=N/A SubmitTime=2026-12-04T06:58:46 EligibleTime=2026-12-04T06:58:46 "
    "AccrueTime=Unknown StartTime=Unknown EndTime=Unknown Deadline=N/A SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-12-04T06:58:46 Scheduler=Main Partition=debug "
    "AllocNode:Sid=localhost:2024 ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 "
    "NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=1000M,node=1,billing=1 "
    "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 "
    "MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 "
    "Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp "
    "Comment=trainmedic:x-1 tm-x nightly  StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null "
    "Power= "
)
JOB_PENDING = (
    "JobId=7 JobName=train UserId=alice(1000) JobState=PENDING Reason=Resources "
    "ExitCode=0:0 SubmitTime=2026-12-02T14:30:00 EndTime=Unknown NodeList=(null) NumNodes=4"
)


def _squeue_doc(*jobs: dict[str, object]) -> str:
    return json.dumps({"meta": {}, "errors": [], "jobs": list(jobs)})


SQ_FAILED = {  # trimmed from a real `squeue --json` (v0.0.38) record
    "array_job_id": 0,
    "array_task_id": None,
    "comment": "",
    "derived_exit_code": 0,
    "end_time": 1796221704,
    "exit_code": 768,
    "job_id": 1,
    "job_state": "FAILED",
    "name": "wrap",
    "nodes": "node[001-002]",
    "node_count": 2,
    "state_reason": "NonZeroExitCode",
    "submit_time": 1796221704,
    "start_time": 1796221704,
    "user_name": "root",
    "partition": "debug",
    "account": "",  # none: a cluster without accounting
}
SQ_PENDING = {
    "array_job_id": 40,
    "array_task_id": 3,
    "comment": "trainmedic:x",
    "end_time": 1827757704,
    "exit_code": 0,
    "job_id": 43,
    "job_state": "PENDING",
    "name": "weird name|x",
    "nodes": "",
    "node_count": 1,
    "state_reason": "Priority",
    "submit_time": 1796221800,
    "start_time": 1827757704,  # a pending job's projection
    "user_name": "bob",
    "partition": "gpu,a100",  # pending in either
    "account": "llm",
}


# ----------------------------------------------------------------------------- states


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("PENDING", JobState.PENDING),
        ("CONFIGURING", JobState.PENDING),
        ("REQUEUED", JobState.PENDING),
        ("RUNNING", JobState.RUNNING),
        ("COMPLETING", JobState.RUNNING),
        ("SUSPENDED", JobState.RUNNING),
        ("COMPLETED", JobState.COMPLETED),
        ("FAILED", JobState.FAILED),
        ("OUT_OF_MEMORY", JobState.FAILED),
        ("NODE_FAIL", JobState.NODE_FAIL),
        ("BOOT_FAIL", JobState.NODE_FAIL),
        ("TIMEOUT", JobState.TIMEOUT),
        ("DEADLINE", JobState.TIMEOUT),
        ("CANCELLED", JobState.CANCELLED),
        ("CANCELLED by 0", JobState.CANCELLED),
        ("PREEMPTED", JobState.CANCELLED),
        ("CD", JobState.COMPLETED),
        ("OOM", JobState.FAILED),
        (["RUNNING", "COMPLETING"], JobState.RUNNING),  # squeue --json from 23.02 on
    ],
)
def test_job_state(raw: str | list[str], expected: JobState) -> None:
    assert job_state(raw) is expected


def test_job_state_unknown_is_an_error() -> None:
    with pytest.raises(SchedulerError, match="BOGUS"):
        job_state("BOGUS")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("IDLE", NodeState.IDLE),
        ("IDLE~", NodeState.IDLE),  # powered off by power saving, still schedulable
        ("IDLE+CLOUD+POWERED_DOWN", NodeState.IDLE),
        ("ALLOCATED", NodeState.ALLOCATED),
        ("MIXED", NodeState.ALLOCATED),
        ("MIXED+COMPLETING", NodeState.ALLOCATED),
        ("IDLE+COMPLETING", NodeState.ALLOCATED),
        ("IDLE+DRAIN", NodeState.DRAINED),
        ("ALLOCATED+DRAIN", NodeState.DRAINED),
        ("MIXED+DRAIN", NodeState.DRAINED),
        ("DOWN+DRAIN", NodeState.DRAINED),
        ("DOWN*+DRAIN", NodeState.DRAINED),
        ("IDLE+FAIL", NodeState.DRAINED),
        ("DOWN", NodeState.DOWN),
        ("DOWN*", NodeState.DOWN),
        ("IDLE*", NodeState.DOWN),
        ("IDLE+NOT_RESPONDING", NodeState.DOWN),
        ("FUTURE", NodeState.DOWN),
        ("UNKNOWN", NodeState.DOWN),
    ],
)
def test_node_state(raw: str, expected: NodeState) -> None:
    assert node_state(raw) is expected


def test_node_state_unknown_is_an_error() -> None:
    with pytest.raises(SchedulerError):
        node_state("SIDEWAYS")


# ----------------------------------------------------------------------------- lines


def test_parse_node_line_idle_with_spaces_in_values() -> None:
    info = parse_node_line(NODE_IDLE)
    assert (info.name, info.state, info.reason) == ("node001", NodeState.IDLE, "")


def test_parse_node_line_reason_keeps_equals_and_drops_stamp() -> None:
    info = parse_node_line(NODE_DRAINING)
    assert info.state is NodeState.DRAINED
    assert info.reason == "xid 79 (gpu3) a=b"


def test_parse_kv_line_joins_words_without_key() -> None:
    fields = slurm_parse.parse_kv_line(NODE_IDLE)
    assert fields["OS"] == "Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0"
    assert fields["CfgTRES"] == "cpu=1,mem=1000M,billing=1"
    assert fields["AllocTRES"] == ""


def test_parse_node_line_without_state_is_an_error() -> None:
    with pytest.raises(SchedulerError, match="State"):
        parse_node_line("NodeName=node001 Arch=x86_64")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("3:0", 3),
        ("0:0", 0),
        ("0:15", 143),  # killed by SIGTERM reads like a shell's $?
        (768, 3),  # squeue --json 22.05: raw wait status
        (9, 137),
        (0, 0),
        ({"status": "FAILED", "return_code": 3, "signal": {"id": None}}, 3),
        ({"status": "SIGNALED", "return_code": 0, "signal": {"id": 9}}, 137),
        (None, None),
        ("", None),
    ],
)
def test_parse_exit_code(raw: object, expected: int | None) -> None:
    assert parse_exit_code(raw) == expected  # type: ignore[arg-type]


def test_parse_scontrol_job_finished() -> None:
    job = parse_scontrol_job(JOB_FAILED)
    assert job.job_id == "1"
    assert job.state is JobState.FAILED
    assert job.exit_code == 3
    assert job.nodes == ("node001", "node002")
    assert job.reason == "NonZeroExitCode"
    assert job.comment == "trainmedic:r1"
    assert job.user == "root"
    assert job.node_count == 2
    assert job.ended_at is not None and job.ended_at.tzinfo is not None
    assert job.started_at is not None and job.started_at <= job.ended_at
    assert (job.partition, job.account) == ("debug", "")  # Account=(null)


def test_parse_scontrol_job_partition_account_and_a_comment_of_several_words() -> None:
    job = parse_scontrol_job(JOB_TAGGED)
    assert (job.partition, job.account) == ("debug", "root")
    assert job.comment == "trainmedic:x-1 tm-x nightly"
    assert (job.state, job.nodes, job.user) == (JobState.PENDING, (), "root")


def test_parse_scontrol_job_pending_has_no_outcome_yet() -> None:
    job = parse_scontrol_job(JOB_PENDING)
    assert (job.state, job.nodes, job.exit_code, job.ended_at) == (
        JobState.PENDING,
        (),
        None,
        None,
    )
    assert job.reason == "Resources"
    assert job.node_count == 4


def test_parse_squeue_json() -> None:
    failed, pending = parse_squeue_json(_squeue_doc(SQ_FAILED, SQ_PENDING))
    assert failed.job_id == "1"
    assert failed.state is JobState.FAILED
    assert failed.exit_code == 3
    assert failed.nodes == ("node001", "node002")
    assert failed.submitted_at == datetime.fromtimestamp(1796221704, UTC)
    assert pending.job_id == "40_3"  # array task
    assert pending.state is JobState.PENDING
    assert (pending.nodes, pending.exit_code, pending.ended_at) == ((), None, None)
    assert failed.started_at == failed.submitted_at and pending.started_at is None
    assert pending.comment == "trainmedic:x"
    assert (failed.partition, failed.account) == ("debug", "")
    assert (pending.partition, pending.account) == ("gpu,a100", "llm")


def test_parse_squeue_json_garbage() -> None:
    with pytest.raises(SchedulerError, match="squeue"):
        parse_squeue_json("slurm_load_jobs error: Unable to contact slurm controller")


def test_parse_sacct() -> None:
    d = "\x1f"
    text = (
        d.join(["1", "FAILED", "3:0", "node[001-002]", "2026-12-02T14:28:24",
                "2026-12-02T14:28:24", "2026-12-02T14:28:25", "root(0)", "debug", "",
                "name|with|bars"])
        + "\n"
        + d.join(["2", "CANCELLED by 0", "0:15", "node003", "2026-12-02T14:28:24",
                  "Unknown", "2026-12-02T14:29:00", "root(0)", "a100", "llm", "sleep"]) + "\n"
        + d.join(["2.batch", "CANCELLED", "0:15", "node003", "", "", "", "", "a100", "llm",
                  "batch"]) + "\n"
    )  # fmt: skip
    first, second = parse_sacct(text, d, JOBCOMP_FIELDS)
    assert first.source == "jobcomp" and first.comment == ""
    assert (first.job_id, first.state, first.exit_code, first.name) == (
        "1",
        JobState.FAILED,
        3,
        "name|with|bars",
    )
    assert first.nodes == ("node001", "node002")
    assert (second.state, second.exit_code, second.user) == (JobState.CANCELLED, 143, "root")
    assert first.started_at is not None and second.started_at is None  # never ran
    assert (first.partition, first.account) == ("debug", "")
    assert (second.partition, second.account) == ("a100", "llm")


def test_parse_sacct_accounting_has_partition_account_and_comment() -> None:
    d = "\x1f"
    text = d.join(["12", "NODE_FAIL", "0:0", "node[001-002]", "2026-12-03T09:00:00",
                   "2026-12-03T09:00:01", "2026-12-03T09:40:00", "alice(1000)", "a100", "llm",
                   "trainmedic:gpt-20261203T090000-ab12cd34 tm-managed", "gpt"]) + "\n"  # fmt: skip
    (job,) = parse_sacct(text, d)
    assert job.source == "accounting" and job.state is JobState.NODE_FAIL
    assert (job.partition, job.account) == ("a100", "llm")
    assert job.comment == "trainmedic:gpt-20261203T090000-ab12cd34 tm-managed"


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("reason", ["xid 79 on gpu3", "trainmedic: job 12 (ecc) #4", "a/b-c_d.e"])
def test_validate_reason_accepts(reason: str) -> None:
    assert validate_reason(reason) == reason


@pytest.mark.parametrize(
    "reason",
    ["", " lead", "trail ", "a\nb", "$(reboot)", "`id`", "a;b", "x=y", "'q'", '"q"', "[x]",
     "a" * 201, "tab\there"],
)  # fmt: skip
def test_validate_reason_rejects(reason: str) -> None:
    with pytest.raises(InputError):
        validate_reason(reason)


@pytest.fixture
def no_subprocess(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []

    def refuse(args: list[str], **_: object) -> None:
        calls.append(args)
        raise AssertionError(f"subprocess ran: {args}")

    monkeypatch.setattr(slurm.subprocess, "run", refuse)
    return calls


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.drain("node001;rm -rf /", "maintenance"),
        lambda s: s.drain("node001", "bad\nreason"),
        lambda s: s.drain("node001", "$(touch /tmp/pwned)"),
        lambda s: s.drain("node001", "`id`"),
        lambda s: s.drain("Node001", "ok"),
        lambda s: s.drain("node001 ", "ok"),
        lambda s: s.drain("-node001", "ok"),
        lambda s: s.resume("node001;reboot"),
        lambda s: s.resume("node[001-002]"),
        lambda s: s.cancel("1;ls", "ok"),
        lambda s: s.cancel("1", "a\nb"),
        lambda s: s.job("../../etc/passwd"),
        lambda s: s.job("1 2"),
        lambda s: s.job("-1"),
        lambda s: s.resubmit("1;rm"),
        lambda s: s.submit(JobSpec(name="ok", nodes=1), resubmission_of="x;y"),
    ],
)
def test_injection_rejected_before_any_subprocess(
    tmp_path: Path, no_subprocess: list[list[str]], call: object
) -> None:
    scheduler = SlurmScheduler(tmp_path)
    with pytest.raises(InputError):
        call(scheduler)  # type: ignore[operator]
    assert no_subprocess == []


def test_exclude_injection_rejected_by_the_model() -> None:
    with pytest.raises(ValueError, match="hostname"):
        JobSpec(name="ok", nodes=1, exclude=("node001,node002",))


def test_constructor_rejects_bad_config(tmp_path: Path) -> None:
    from trainmedic.core.errors import ConfigError

    with pytest.raises(ConfigError):
        SlurmScheduler(tmp_path, timeout_s=0)
    with pytest.raises(ConfigError):
        SlurmScheduler(tmp_path, command=[])
    with pytest.raises(InputError):
        SlurmScheduler(tmp_path, partition="gpu;rm")


# ----------------------------------------------------------------------------- fake CLI


class FakeSlurm:
    """Answers the calls SlurmScheduler makes, records their argv."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.jobs: dict[str, str] = {}
        self.sacct = ""  # what accounting (sacct -X) knows
        self.jobcomp = ""  # what the job-completion log (sacct -c) knows
        self.accounting = True
        self.jobcomp_enabled = False  # jobcomp/none, as most sites run
        self.steps: dict[str, dict[str, str]] = {}  # job id -> step id -> node list

    def __call__(self, args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        assert isinstance(args, list), "argv lists only"
        assert "shell" not in kwargs
        assert kwargs["timeout"]
        self.calls.append(args)

        def done(rc: int = 0, out: str = "", err: str = "") -> subprocess.CompletedProcess[str]:
            return subprocess.CompletedProcess(args, rc, out, err)

        match args:
            case ["sbatch", *_]:
                job_id = str(42 + len(self.jobs))
                comment = args[args.index("--comment") + 1]
                name = args[args.index("--job-name") + 1]
                # What slurmctld would fill in: its default partition, Account=(null).
                part = args[args.index("--partition") + 1] if "--partition" in args else "debug"
                account = args[args.index("--account") + 1] if "--account" in args else "(null)"
                self.jobs[job_id] = (
                    f"JobId={job_id} JobName={name} UserId=root(0) Account={account} "
                    f"JobState=PENDING Reason=None ExitCode=0:0 SubmitTime=2026-12-02T14:30:00 "
                    f"Partition={part} NodeList=(null) NumNodes=1 Comment={comment}"
                )
                return done(out=f"{job_id}\n")
            case ["scontrol", "show", "job", "-o", job_id]:
                if job_id in self.jobs:
                    return done(out=self.jobs[job_id] + "\n")
                return done(1, err="slurm_load_jobs error: Invalid job id specified\n")
            case ["sacct", "-X", *_]:
                if not self.accounting:
                    return done(1, err="Slurm accounting storage is disabled\n")
                return done(out=self.sacct)
            case ["sacct", "-c", *_]:
                if not self.jobcomp_enabled:
                    return done(out="Slurm job completion is disabled\n")
                return done(out=self.jobcomp)
            case ["scontrol", "show", "node", "-o", "node001"]:
                return done(out=NODE_IDLE + "\n")
            case ["scontrol", "show", "node", "-o", "node003"]:
                return done(out=NODE_DRAINING + "\n")
            case ["scontrol", "update", *_]:
                return done()
            case ["squeue", "--steps", "--jobs", job_id, *_]:
                if job_id not in self.steps:
                    return done(1, err="slurm_load_jobs error: Invalid job id specified\n")
                return done(out="".join(f"{s}|{n}\n" for s, n in self.steps[job_id].items()))
            case ["scancel", "--quiet", step]:
                job_id = step.split(".")[0]
                self.steps[job_id].pop(step)
                return done()
        raise AssertionError(f"unexpected call {args}")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    fake = FakeSlurm()
    monkeypatch.setattr(slurm.subprocess, "run", fake)
    return fake


def test_submit_writes_run_dir_and_links_job_id(tmp_path: Path, fake: FakeSlurm) -> None:
    scheduler = SlurmScheduler(tmp_path, partition="gpu", command=["srun", "python", "t.py"])
    spec = JobSpec(name="llama-7b", nodes=2, exclude=("node003", "node004"))
    info = scheduler.submit(spec)

    assert info.job_id == "42"
    assert info.state is JobState.PENDING
    # A first submission starts a training run: it gets the run's identity, nothing else.
    assert info.spec.run_id is not None and info.spec.run_id.startswith("llama-7b-")
    assert info.spec.model_copy(update={"run_id": None}) == spec
    sbatch = fake.calls[0]
    assert sbatch[:2] == ["sbatch", "--parsable"]
    assert sbatch[sbatch.index("--nodes") + 1] == "2"
    assert sbatch[sbatch.index("--exclude") + 1] == "node003,node004"
    assert sbatch[sbatch.index("--partition") + 1] == "gpu"
    link = tmp_path / "jobs" / "42"
    assert link.is_symlink()
    assert not os.readlink(link).startswith("/")  # relative: the root can be moved
    assert json.loads((link / "spec.json").read_text()) == json.loads(info.spec.model_dump_json())
    assert f"export TRAINMEDIC_RUN_ID={info.spec.run_id}" in (link / "job.sh").read_text()
    assert info.log_dir == str(link / "logs")
    assert info.heartbeat_path == str(link / "heartbeat")
    assert info.checkpoint_dir == str(tmp_path / "checkpoints" / "llama-7b")
    assert Path(sbatch[sbatch.index("--output") + 1]).parent == (link / "logs").resolve()
    script = Path(sbatch[-1])
    assert script.parent == link.resolve()
    assert REAL_RUN(["bash", "-n", str(script)], check=False).returncode == 0
    assert "exec srun python t.py" in script.read_text()


def test_submit_default_command_is_the_sim_trainer(tmp_path: Path, fake: FakeSlurm) -> None:
    scheduler = SlurmScheduler(tmp_path / "with space", python="/opt/py thon")
    info = scheduler.submit(JobSpec(name="sim", nodes=1, checkpoint_dir=str(tmp_path / "ck")))
    script = Path(fake.calls[0][-1]).read_text()
    assert "exec '/opt/py thon' -m trainmedic.sim.job --job-dir \"$TRAINMEDIC_JOB_DIR\"" in script
    assert '--nodes "$TRAINMEDIC_NODES"' in script
    assert info.checkpoint_dir == str(tmp_path / "ck")


def test_resubmit_keeps_checkpoint_dir_and_records_origin(tmp_path: Path, fake: FakeSlurm) -> None:
    scheduler = SlurmScheduler(tmp_path, command=["true"])
    first = scheduler.submit(JobSpec(name="run", nodes=1))
    second = scheduler.resubmit(first.job_id, exclude=("node003",), resume_from_step=50)
    assert second.job_id == "43"
    assert second.resubmission_of == "42"
    assert second.checkpoint_dir == first.checkpoint_dir
    assert second.spec.exclude == ("node003",)
    assert second.spec.resume_from_step == 50
    assert second.spec.run_id == first.spec.run_id  # one training run


def test_spec_partition_account_and_comment_reach_sbatch_and_come_back(
    tmp_path: Path, fake: FakeSlurm
) -> None:
    scheduler = SlurmScheduler(tmp_path, partition="gpu", command=["true"])
    plain = scheduler.submit(JobSpec(name="plain", nodes=1))
    sbatch = fake.calls[0]
    assert sbatch[sbatch.index("--partition") + 1] == "gpu" and "--account" not in sbatch
    run = Path(sbatch[-1]).parent.name
    assert sbatch[sbatch.index("--comment") + 1] == f"trainmedic:{run}"  # none invented
    assert (plain.partition, plain.account, plain.comment) == ("gpu", "", f"trainmedic:{run}")

    spec = JobSpec(name="tagged", nodes=1, partition="a100", account="llm", comment="tm-managed x")
    tagged = scheduler.submit(spec)
    sbatch = fake.calls[-2]  # then scontrol show job
    run = Path(sbatch[-1]).parent.name
    assert sbatch[sbatch.index("--partition") + 1] == "a100"  # the spec's, before the default
    assert sbatch[sbatch.index("--account") + 1] == "llm"
    assert sbatch[sbatch.index("--comment") + 1] == f"trainmedic:{run} tm-managed x"
    assert tagged.managed and tagged.spec.name == "tagged"  # the run is the comment's 1st word
    assert (tagged.partition, tagged.account) == ("a100", "llm")
    assert tagged.comment == f"trainmedic:{run} tm-managed x"
    again = scheduler.resubmit(tagged.job_id, exclude=("node003",))
    assert (again.partition, again.account, again.managed) == ("a100", "llm", True)
    assert again.comment.endswith(" tm-managed x") and again.resubmission_of == tagged.job_id


@pytest.mark.parametrize(
    "fields",
    [{"partition": "gpu;rm"}, {"account": "a b"}, {"comment": "x=y"}, {"comment": "a  b"}],
)
def test_spec_scope_fields_are_validated(fields: dict[str, str]) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        JobSpec(name="x", nodes=1, **fields)  # type: ignore[arg-type]


def test_job_found_by_comment_when_link_is_missing(tmp_path: Path, fake: FakeSlurm) -> None:
    scheduler = SlurmScheduler(tmp_path, command=["true"])
    info = scheduler.submit(JobSpec(name="run", nodes=1))
    (tmp_path / "jobs" / info.job_id).unlink()
    assert scheduler.job(info.job_id).spec.name == "run"


ALICE_JOB = ["7", "COMPLETED", "0:0", "node002", "2026-12-02T14:28:24", "2026-12-02T14:28:30",
             "2026-12-02T14:29:24", "alice(1000)", "cpu", "vision"]  # fmt: skip


def test_purged_jobs_come_from_accounting(tmp_path: Path, fake: FakeSlurm) -> None:
    scheduler = SlurmScheduler(tmp_path)
    fake.sacct = "\x1f".join([*ALICE_JOB, "", "someone else's job"])
    info = scheduler.job("7")
    assert (info.state, info.exit_code, info.nodes) == (JobState.COMPLETED, 0, ("node002",))
    assert info.window_start - info.submitted_at == timedelta(seconds=6)  # queued 6 s
    assert info.spec.name == "someone_else_s_job"
    assert info.spec.owner == "alice"
    assert (info.partition, info.account, info.comment) == ("cpu", "vision", "")
    assert not info.managed
    assert fake.calls[-1][:2] == ["sacct", "-X"]  # accounting, not the disabled jobcomp log
    with pytest.raises(JobNotFound):
        scheduler.job("8")


def test_jobcomp_log_only_where_accounting_is_off(tmp_path: Path, fake: FakeSlurm) -> None:
    fake.accounting, fake.jobcomp_enabled = False, True
    fake.jobcomp = "\x1f".join([*ALICE_JOB, "someone else's job"])
    scheduler = SlurmScheduler(tmp_path)
    assert scheduler.job("7").spec.owner == "alice"
    assert scheduler.job("7").state is JobState.COMPLETED
    assert (scheduler.job("7").partition, scheduler.job("7").account) == ("cpu", "vision")
    # Accounting said "disabled" once: not asked again.
    assert sum(1 for c in fake.calls if c[:2] == ["sacct", "-X"]) == 1


def test_no_history_at_all_is_not_an_error(tmp_path: Path, fake: FakeSlurm) -> None:
    fake.accounting = fake.jobcomp_enabled = False
    scheduler = SlurmScheduler(tmp_path)
    with pytest.raises(JobNotFound):
        scheduler.job("7")


def test_a_recycled_job_id_does_not_inherit_the_old_run(tmp_path: Path, fake: FakeSlurm) -> None:
    """Job ids restart at 1 on a reinstalled controller: the old jobs/<id> link must not turn
    another user's new job into trainmedic's old training run."""
    scheduler = SlurmScheduler(tmp_path, command=["true"])
    ours = scheduler.submit(JobSpec(name="llama", nodes=1))
    assert scheduler.job(ours.job_id).spec.name == "llama"
    fake.jobs[ours.job_id] = (
        f"JobId={ours.job_id} JobName=bobs-job UserId=bob(1001) JobState=RUNNING Reason=None "
        "ExitCode=0:0 SubmitTime=2026-12-03T09:00:00 NodeList=node002 NumNodes=1 Comment=(null)"
    )
    theirs = scheduler.job(ours.job_id)
    assert theirs.spec.name == "bobs-job" and theirs.spec.owner == "bob"
    assert theirs.resubmission_of is None
    # Another trainmedic run's comment wins over the link too.
    fake.jobs[ours.job_id] = fake.jobs[ours.job_id].replace(
        "Comment=(null)", "Comment=trainmedic:some-other-run"
    )
    assert scheduler.job(ours.job_id).spec.name == "bobs-job"


def test_isolation_cancels_only_the_jobs_own_steps_on_the_node(
    tmp_path: Path, fake: FakeSlurm
) -> None:
    fake.steps = {
        "42": {
            "42.batch": "node001",
            "42.extern": "node[001-003]",
            "42.0": "node001",
            "42.1": "node[002-003]",
            "42.2": "node003",
        },
        "43": {"43.0": "node002"},  # another job on the same node
    }
    scheduler = SlurmScheduler(tmp_path)
    assert scheduler.cancel_steps_on("42", "node002", "isolate") == ["42.1"]
    assert fake.steps["43"] == {"43.0": "node002"}  # never another job
    assert "42.extern" in fake.steps["42"] and "42.0" in fake.steps["42"]
    assert scheduler.cancel_steps_on("42", "node002", "isolate") == []  # idempotent
    assert scheduler.cancel_steps_on("77", "node002", "isolate") == []  # gone: nothing runs
    with pytest.raises(InputError):
        scheduler.cancel_steps_on("42", "node002;reboot", "isolate")


def test_sbatch_exports_only_the_listed_variables(tmp_path: Path, fake: FakeSlurm) -> None:
    SlurmScheduler(tmp_path, command=["true"]).submit(JobSpec(name="run", nodes=1))
    sbatch = fake.calls[0]
    assert sbatch[sbatch.index("--export") + 1] == "PATH,HOME,USER,LANG,LC_ALL,TZ"
    SlurmScheduler(tmp_path, command=["true"], export=()).submit(JobSpec(name="run", nodes=1))
    assert fake.calls[-2][fake.calls[-2].index("--export") + 1] == "NONE"
    with pytest.raises(ConfigError):
        SlurmScheduler(tmp_path, export=("PATH;rm",))


def test_drain_and_resume_check_state_first(tmp_path: Path, fake: FakeSlurm) -> None:
    scheduler = SlurmScheduler(tmp_path)
    assert scheduler.drain("node003", "again") is False  # already drained: nothing sent
    assert scheduler.resume("node001") is False  # not drained
    assert not any(c[:2] == ["scontrol", "update"] for c in fake.calls)
    assert scheduler.drain("node001", "xid 79 (gpu3)") is True
    assert fake.calls[-1] == [
        "scontrol", "update", "NodeName=node001", "State=DRAIN", "Reason=xid 79 (gpu3)"
    ]  # fmt: skip
    assert scheduler.resume("node003") is True
    assert fake.calls[-1] == ["scontrol", "update", "NodeName=node003", "State=RESUME"]


@pytest.mark.parametrize(
    ("exc", "match"),
    [
        (subprocess.TimeoutExpired(["sinfo"], 1.0), "no answer within"),
        (FileNotFoundError(2, "No such file or directory", "scontrol"), "cannot run"),
    ],
)
def test_cli_failures_become_scheduler_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: Exception, match: str
) -> None:
    def boom(*_: object, **__: object) -> None:
        raise exc

    monkeypatch.setattr(slurm.subprocess, "run", boom)
    with pytest.raises(SchedulerError, match=match) as info:
        SlurmScheduler(tmp_path).nodes()
    assert info.value.__cause__ is exc
    assert "scontrol show node -o" in str(info.value)


def test_nonzero_exit_names_command_and_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(args: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 1, "", "Unable to contact slurm controller\n")

    monkeypatch.setattr(slurm.subprocess, "run", fail)
    with pytest.raises(SchedulerError, match=r"squeue --json: exit 1: Unable to contact"):
        SlurmScheduler(tmp_path).jobs()


def test_from_settings_reads_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainmedic.core.settings import Settings

    monkeypatch.setenv("TRAINMEDIC_SLURM_PARTITION", "gpu")
    monkeypatch.setenv("TRAINMEDIC_SLURM_TIMEOUT_S", "5")
    monkeypatch.setenv("TRAINMEDIC_SLURM_COMMAND", "srun python 'train it.py'")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/other.conf")
    monkeypatch.delenv("TRAINMEDIC_SLURM_ROOT", raising=False)
    scheduler = SlurmScheduler.from_settings(Settings(home=tmp_path))
    assert scheduler.root == tmp_path / "slurm"
    assert scheduler.partition == "gpu"
    assert scheduler.timeout_s == 5
    assert scheduler.command == ("srun", "python", "train it.py")
    assert scheduler._env()["SLURM_CONF"] == "/etc/slurm/other.conf"
