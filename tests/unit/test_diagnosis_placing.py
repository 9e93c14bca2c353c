"""The origin host: where the evidence places the cause, else the one host the logs were
written on; never for what survivors or onlookers write, and never a drain by itself."""

from __future__ import annotations

from support.builders import job_info

from trainmedic.core.taxonomy import Category
from trainmedic.decisions.remediation import origin_node, plan_remediation
from trainmedic.diagnosis import LogSource, diagnose

NCCL_INIT = [
    "gpu-server7:1810802:1810802 [0] NCCL INFO Bootstrap : Using [0]eno1:10.128.149.70<0>",
    "gpu-server7:1810802:1810802 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so)",
]
ERROR = [
    "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:825, invalid usage, NCCL version 2.7.8",
    "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
]


def diagnosed(lines: list[str], name: str = "job.log"):  # type: ignore[no-untyped-def]
    return diagnose([LogSource.from_lines(name, lines)])


def test_a_log_written_on_one_host_places_an_unplaced_cause_there() -> None:
    diagnosis = diagnosed([*ERROR, *NCCL_INIT])
    assert diagnosis.category is Category.NCCLError
    assert diagnosis.root_cause_host == "gpu-server7"
    # Written on two hosts: the log does not say which.
    other = [line.replace("gpu-server7", "gpu-server8") for line in NCCL_INIT]
    assert diagnosed([*ERROR, *NCCL_INIT, *other]).root_cause_host is None
    # Nothing says where it was written: nothing is named.
    assert diagnosed(ERROR).root_cause_host is None


def test_the_writers_prefix_must_leave_no_doubt() -> None:
    """ESPnet's "[host] date" and an ssh in a pasted prompt name the writer; "epoch1: " at the
    start of a line is not a host."""
    espnet = "[spsy-ml-2] 2021-10-30 16:52:21,022 (trainer:653) INFO: 24epoch:train:901-950batch"
    assert diagnosed([espnet, *ERROR]).root_cause_host == "spsy-ml-2"
    assert diagnosed(["[INFO] 2021-10-30 16:52:21 start", *ERROR]).root_cause_host is None
    assert diagnosed(["epoch1: loss 2.3", *ERROR]).root_cause_host is None
    pasted = ["[admin@login-1 ~]$ ssh gpu-2-5 nvidia-smi", "No devices were found"]
    assert diagnosed(pasted).root_cause_host == "gpu-2-5"
    # A conda environment's name before the prompt; the session ends at the prompt.
    conda = [*ERROR, "(base) alice@c002:~/runs$ "]
    assert diagnosed(conda).root_cause_host == "c002"


def test_survivors_and_onlookers_name_no_origin_by_where_they_wrote() -> None:
    """A lost node's obituary is written elsewhere than where the fault began, so the log's one
    host is not named. A log that just stopped stopped where it was written, and a collective
    timing out where every log came from one machine timed out there: named, and still only
    pair-tested, never drained."""
    witness = [
        *NCCL_INIT,
        "slurmstepd: error: *** STEP 1001.0 ON gpu-server7 CANCELLED AT 2026-12-02T15:10:26 "
        "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***",
    ]
    lost = diagnosed(witness)
    assert lost.category is Category.NodeFailure and lost.root_cause_host is None
    stalled = diagnosed([*NCCL_INIT, "NCCL INFO Using network Socket"])
    assert stalled.category is Category.Hang and stalled.root_cause_host == "gpu-server7"
    plan = plan_remediation(stalled, job_info(nodes=("gpu-server7", "gpu-server8")))
    assert plan.locate and plan.drain == ()
    timeout = (
        "[E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=2, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600058 milliseconds "
        "before timing out."
    )
    waited = diagnosed([*NCCL_INIT, timeout])
    # The one rank it was seen on ran on the one machine the logs came from.
    assert waited.symptom_only and waited.root_cause_host == "gpu-server7"
    assert plan_remediation(waited, job_info(nodes=("gpu-server7",))).drain == ()
    # Two machines wrote: the rank alone is named.
    two_writers = [line.replace("gpu-server7", "gpu-server8") for line in NCCL_INIT]
    assert diagnosed([*NCCL_INIT, *two_writers, timeout]).root_cause_host == "rank 3"
    unranked = timeout.replace("[Rank 3] ", "")
    one_node = diagnosed([*NCCL_INIT, unranked])
    assert one_node.category is Category.NCCLTimeout and one_node.symptom_only
    assert one_node.root_cause_host == "gpu-server7"
    plan = plan_remediation(one_node, job_info(nodes=("gpu-server7",)))
    assert plan.drain == ()
    two_nodes = [line.replace("gpu-server7", "gpu-server8") for line in NCCL_INIT]
    assert diagnosed([*NCCL_INIT, *two_nodes, unranked]).root_cause_host is None


def test_a_host_named_only_by_where_the_log_was_written_drains_nothing() -> None:
    """The report names the machine; the plan needs the host in the evidence's own lines to
    drain, so a hardware fault placed this way is pair-tested, not drained."""
    lines = [
        *NCCL_INIT,
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    ]
    diagnosis = diagnosed(lines)
    assert diagnosis.category is Category.ECCError
    assert diagnosis.root_cause_host == "gpu-server7"
    job = job_info("42", nodes=("gpu-server7", "gpu-server8"))
    assert origin_node(diagnosis, job) is None
    plan = plan_remediation(diagnosis, job)
    assert plan.drain == () and plan.locate


def test_the_peer_that_closed_the_socket_and_the_node_whose_slurmd_failed_are_named() -> None:
    """NCCL on node0 saw node2 close the connection: node2's process went first. A slurmd's
    own journal line is about its node."""
    closed = "node0:13571:13571 [0] NCCL WARN socketProgress: Connection closed by remote peer "
    closed += "node2<42830>"
    assert diagnosed([*NCCL_INIT, closed]).root_cause_host == "node2"
    epilog = (
        "Feb 22 17:46:38 ip-10-1-74-228 slurmd[13562]: spank-epilog: error: pyxis: mkdir: "
        "cannot create directory '/opt/dlami/nvme/tmp/enroot/data': Permission denied"
    )
    failed = diagnosed([epilog])
    assert failed.category is Category.NodeFailure
    assert failed.root_cause_host == "ip-10-1-74-228"


def test_a_ray_tasks_error_header_names_its_node_where_no_rule_explains_the_error() -> None:
    """The driver re-raises a task's error under a header naming the node it was raised on;
    where no rule explains the cut-off traceback, the report still points there (and drains
    nothing: no rule proved a fault)."""
    lines = [
        "    raise value.as_instanceof_cause()",
        "ray.exceptions.RayTaskError(AcceleratorError): ray::MegatronTrainRayActor.train() "
        "(pid=76563, ip=10.1.49.166, actor_id=37d82bcbdafcda12f1eef52b02000000)",
    ]
    guess = diagnosed(lines)
    assert guess.root_cause_host == "10.1.49.166"
    assert plan_remediation(guess, job_info(nodes=("node001", "node002"))).drain == ()


def test_a_launchers_summary_names_the_host_of_the_ranks_it_reports() -> None:
    """The cause names a rank; torchelastic's summary (however flattened), Open MPI's lost
    daemon block and a cloud job's "[pod] [date]" prefix name the host."""
    summary = [
        "Root Cause (first observed failure): [0]: time : 2024-07-25_12:48:53 host : "
        "ip-119-181-1-31.ec2.internal rank : 0 (local_rank: 0) exitcode : -9 (pid: 6774)",
        "[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered",
    ]
    assert diagnosed(summary).root_cause_host == "ip-119-181-1-31.ec2.internal"
    orte = [
        "ORTE has lost communication with its daemon located on node:",
        "",
        "   hostname:  ip-10-15-20-17.ec2.internal",
    ]
    lost = diagnosed(orte)
    assert lost.category is Category.NodeFailure
    assert lost.root_cause_host == "ip-10-15-20-17.ec2.internal"
    pod = (
        "[dlc1mtq58q0821ib-master-0] [2026-03-30 19:24:42,731] torch.distributed.elastic."
        "multiprocessing.api: [ERROR] failed (exitcode: -9) local_rank: 0 (process ID: 71)"
    )
    assert diagnosed([pod]).root_cause_host == "dlc1mtq58q0821ib-master-0"


def test_zsh_prompts_and_uname_name_the_machine_a_report_came_from() -> None:
    zsh = ["zeyer@cn-234 ~ % nvidia-smi", *ERROR]
    assert diagnosed(zsh).root_cause_host == "cn-234"
    uname = ["Linux node-11 5.4.0-65-generic #73-Ubuntu SMP Mon Jan 18 17:25:17 UTC 2021", *ERROR]
    assert diagnosed(uname).root_cause_host == "node-11"
    # The kernel's own banner names a version, not a host.
    banner = ["Linux version 5.4.0-65-generic (buildd@lcy01-amd64-018)", *ERROR]
    assert diagnosed(banner).root_cause_host is None


def test_a_syslogd_wall_message_names_the_machine_the_terminal_is_on() -> None:
    """syslogd writes a kernel emergency to the terminals of its own machine: the lines after
    its header were printed there."""
    wall = [
        "Message from syslogd@gpu-07 at Apr  3 04:50:06 ...",
        " kernel:[2615390.401038] watchdog: BUG: soft lockup - CPU#20 stuck for 23s! [python:3756]",
        *ERROR,
    ]
    assert diagnosed(wall).root_cause_host == "gpu-07"


def test_a_gpu_named_without_its_machine_joins_the_one_machine_the_log_came_from() -> None:
    lost = ["Unable to determine the device handle for GPU0000:03:00.0: Unknown Error"]
    assert diagnosed(lost).root_cause_host == "GPU 0000:03:00.0"
    on_one_host = ["zeyer@cn-234 ~ % nvidia-smi", *lost]
    assert diagnosed(on_one_host).root_cause_host == "cn-234 GPU 0000:03:00.0"
    # Two machines in the log, the line under neither's prompt: which one is not known.
    two = [*lost, "zeyer@cn-234 ~ % uptime", "up 3 days", "zeyer@cn-235 ~ % uptime", "up 1 day"]
    assert diagnosed(two).root_cause_host == "GPU 0000:03:00.0"
