"""Multi-rank scenarios: the root cause, not the first or most frequent error."""

from __future__ import annotations

from support.builders import job_info
from support.builders import nccl_watchdog_timeout as timeout

from trainmedic.core.models import GpuTelemetry
from trainmedic.core.taxonomy import Action, Category
from trainmedic.decisions.remediation import plan_remediation
from trainmedic.diagnosis import LogSource, diagnose, suspect_hosts
from trainmedic.diagnosis.sources import host_and_rank_from_name

NORMAL = [
    f"[2026-12-02 14:0{i // 60}:{i % 60:02d}] iteration {i}/400 | lm loss: {3.0 - i / 200:.3E} | "
    f"grad norm: 0.812 | elapsed time per iteration (ms): 812.3"
    for i in range(1, 120)
]


def job(faulty: dict[str, list[str]], healthy_hosts: list[str]) -> list[LogSource]:
    sources = [
        LogSource.from_lines(f"rank-{r:05d}.{host}.err", [*NORMAL, timeout(r)])
        for r, host in enumerate(healthy_hosts)
    ]
    sources += [LogSource.from_lines(name, lines) for name, lines in faulty.items()]
    return sources


def test_ecc_on_one_rank_beats_timeouts_everywhere() -> None:
    sources = job(
        {
            "node007-dmesg.log": [
                "NVRM: Xid (PCI:0000:3b:00): 48, pid=4242, An uncorrectable double bit error "
                "(DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0."
            ],
            "rank-00007.node007.err": [
                *NORMAL,
                "RuntimeError: CUDA error: uncorrectable ECC error encountered",
            ],
        },
        ["node000", "node001", "node002", "node003", "node004", "node005", "node006"],
    )
    diagnosis = diagnose(sources)
    assert diagnosis.category is Category.ECCError
    assert diagnosis.root_cause_host is not None
    assert "node007" in diagnosis.root_cause_host
    assert suspect_hosts(diagnosis) == ["node007"]
    assert diagnosis.confidence >= 0.8


def test_xid79_and_nvlink_scenarios_from_the_simulator() -> None:
    fallen = job(
        {
            "node003-dmesg.log": [
                "NVRM: Xid (PCI:0000:3b:00): 79, pid=12345, name=python, "
                "GPU has fallen off the bus."
            ],
            "rank-00003.node003.err": [
                *NORMAL,
                "RuntimeError: CUDA error: unspecified launch failure",
            ],
        },
        ["node000", "node001", "node002"],
    )
    diagnosis = diagnose(fallen)
    assert diagnosis.category is Category.GPUFallenOff
    assert "node003" in (diagnosis.root_cause_host or "")
    nvlink = job(
        {
            "node001-dmesg.log": [
                "NVRM: Xid (PCI:0000:3b:00): 74, pid=99, NVLink: fatal error detected on link 3"
            ],
            "rank-00001.node001.err": [
                *NORMAL,
                "node001:77:77 [0] NCCL WARN Cuda failure "
                "'an illegal memory access was encountered'",
            ],
        },
        ["node000", "node002"],
    )
    diagnosis = diagnose(nvlink)
    assert diagnosis.category is Category.NVLinkError
    assert "node001" in (diagnosis.root_cause_host or "")


def test_telemetry_names_the_origin_when_logs_show_only_timeouts() -> None:
    sources = job({}, ["node000", "node001", "node002", "node003"])
    assert diagnose(sources).category is Category.NCCLTimeout
    telemetry = [
        GpuTelemetry(host="node000", gpu=0, temperature_c=60),
        GpuTelemetry(host="node002", gpu=3, temperature_c=61, xid_last=79),
    ]
    diagnosis = diagnose(job({}, ["node000", "node001", "node002", "node003"]), telemetry=telemetry)
    assert diagnosis.category is Category.GPUFallenOff
    assert diagnosis.root_cause_host == "node002 GPU 3"
    assert diagnosis.source == "telemetry"
    hot = [GpuTelemetry(host="node001", gpu=2, temperature_c=95)]
    diagnosis = diagnose(job({}, ["node000", "node001", "node002"]), telemetry=hot)
    assert diagnosis.category is Category.NCCLTimeout
    assert "node001" in (diagnosis.root_cause_host or "")


def test_many_timeouts_do_not_invent_an_origin_but_one_does() -> None:
    diagnosis = diagnose(job({}, ["node000", "node001", "node002"]))
    assert diagnosis.root_cause_host is None
    single = diagnose([LogSource.from_lines("x.log", [*NORMAL, timeout(5)])])
    assert single.root_cause_host == "rank 5"


def test_hang_from_heartbeat_age() -> None:
    sources = [LogSource.from_lines("rank-00000.node000.out", NORMAL)]
    assert diagnose(sources, heartbeat_age_s=30).category is Category.Unknown
    sources = [LogSource.from_lines("rank-00000.node000.out", NORMAL)]
    diagnosis = diagnose(sources, heartbeat_age_s=1800, hang_after_s=600)
    assert diagnosis.category is Category.Hang
    assert 0.4 <= diagnosis.confidence <= 0.8


def test_exit_137_alone_is_not_host_oom_and_139_segfault() -> None:
    # A SIGKILL alone is also scancel, preemption or KillWait: no host OOM without a line
    # that proves it; beside a kernel OOM line it corroborates.
    sources = [LogSource.from_lines("rank-00000.node000.out", NORMAL)]
    alone = diagnose(sources, exit_code=137)
    assert alone.category is Category.Unknown
    assert [r.signature for r in alone.rivals] == ["exit-code-sigkill"]
    oom = "[812.3] Out of memory: Killed process 4242 (python) total-vm:81234567kB"
    sources = [LogSource.from_lines("rank-00000.node000.out", [*NORMAL, oom])]
    proven = diagnose(sources, exit_code=137)
    assert proven.category is Category.HostOOM
    assert "exit-code-sigkill" in [e.signature for e in proven.evidence]
    sources = [LogSource.from_lines("rank-00000.node000.out", NORMAL)]
    # A SIGSEGV alone is a crash whose cause a human finds: nothing is drained or retried.
    segfault = diagnose(sources, exit_code=139)
    assert segfault.category is Category.Unknown
    assert [e.signature for e in segfault.evidence] == ["exit-code-segfault"]
    dataloader = [
        LogSource.from_lines(
            "r.log",
            ["RuntimeError: DataLoader worker (pid 624) is killed by signal: Segmentation fault."],
        )
    ]
    assert diagnose(dataloader, exit_code=139).category is Category.DataloaderKilled


def test_empty_logs_are_unknown() -> None:
    diagnosis = diagnose([LogSource.from_text("empty.log", "")])
    assert diagnosis.category is Category.Unknown
    assert diagnosis.evidence == ()
    assert diagnose([]).category is Category.Unknown


def test_timestamps_order_causes_across_files() -> None:
    later = LogSource.from_lines(
        "node001.log",
        ["[2026-12-02 14:05:00] RuntimeError: CUDA error: unspecified launch failure"],
    )
    earlier = LogSource.from_lines(
        "node002.log",
        [
            "[2026-12-02 14:01:00] RuntimeError: CUDA error: "
            "an illegal memory access was encountered"
        ],
    )
    diagnosis = diagnose([later, earlier])
    assert diagnosis.category is Category.CUDAError
    assert diagnosis.root_cause_host is not None
    assert diagnosis.root_cause_host.startswith("node002")


def test_loss_spike_and_nan_from_curves() -> None:
    rising = [
        f"iteration {i} | lm loss: {2.0 + (5.0 if i > 80 else 0.0):.4E} |" for i in range(100)
    ]
    assert diagnose([LogSource.from_lines("a.log", rising)]).category is Category.LossSpike
    nan = [*NORMAL, "iteration 121/400 | lm loss: nan | grad norm: nan |"]
    assert diagnose([LogSource.from_lines("c.log", nan)]).category is Category.NaNLoss


def test_a_spike_the_loss_came_back_from_is_named_but_never_rolled_back() -> None:
    """The one abnormal thing in a log that ends in ordinary output; a small jitter is not
    one, and a spike that passed is no reason to discard progress without a human."""
    recovered = [f"{{'loss': {9.0 if i == 50 else 2.0}, 'epoch': {i}}}" for i in range(100)]
    passed = diagnose([LogSource.from_lines("b.log", recovered)])
    assert passed.category is Category.LossSpike
    assert "came back to 2" in passed.evidence[0].text
    plan = plan_remediation(passed, job_info(nodes=("node001",)))
    assert plan.action is Action.investigate and plan.page_oncall
    jitter = [f"{{'loss': {4.0 if i == 50 else 2.0}, 'epoch': {i}}}" for i in range(100)]
    assert diagnose([LogSource.from_lines("d.log", jitter)]).category is not Category.LossSpike


def test_a_curve_printed_as_loss_then_a_space_and_one_point_per_line() -> None:
    from trainmedic.diagnosis.loss import extract_losses

    jumped = [
        f"iter {i} step {i // 8}: loss {1.7 if i < 60 else 11.4:.4f}, iter time: 1106.53ms"
        for i in range(100)
    ]
    assert diagnose([LogSource.from_lines("a.log", jumped)]).category is Category.LossSpike
    # A step's line that also prints its parts is one point: no jump from 0.25 to 0.59.
    parts = b"iter 144: regular_loss: 0.248765, total-loss 0.5882(0.0360, 0.5233)\n"
    assert [p.value for p in extract_losses(parts * 3, 1)] == [0.248765] * 3
    # "loss 2 times" is prose, not a value.
    assert list(extract_losses(b"the loss 2 times higher\n", 1)) == []
    # "Loss" capitalised as a word of its own is the curve; "IDLoss=" is another series.
    capital = b"Epoch: [0][26500/44451] | Time (0.998)(0.655) | Loss 124.5792(1.6960) | MAE 0.6\n"
    assert [p.value for p in extract_losses(capital, 1)] == [124.5792]
    assert (
        list(extract_losses(b"Epoch[1] Batch[4] Speed: 146.38 samples/sec,  IDLoss=60.2\n", 1))
        == []
    )
    climbing = [
        f"Epoch: [0][{i}/900] | Loss {0.3 if i < 40 else 124.6:.4f}(0.5)" for i in range(50)
    ]
    assert diagnose([LogSource.from_lines("c.log", climbing)]).category is Category.LossSpike


def test_a_loss_spike_said_in_words_and_a_nan_said_so_stays_nan() -> None:
    said = ["step 1800 done", "the loss suddenly increased from 2 to 11 at iteration 15"]
    assert diagnose([LogSource.from_lines("a.log", said)]).category is Category.LossSpike
    nan = ["the loss exploded: loss = nan at step 120"]
    assert diagnose([LogSource.from_lines("b.log", nan)]).category is Category.NaNLoss


def test_host_and_rank_from_file_names() -> None:
    assert host_and_rank_from_name("node007.log") == ("node007", None)
    assert host_and_rank_from_name("/x/rank-00003.node002.err") == ("node002", 3)
    assert host_and_rank_from_name("node002-dmesg.log") == ("node002", None)
    assert host_and_rank_from_name("slurm-4242.out") == (None, None)
    assert host_and_rank_from_name("rank3.log") == (None, 3)


def test_line_prefix_hosts() -> None:
    sources = [
        LogSource.from_lines(
            "job.log",
            [
                "node004:27907:27907 [1] transport/net_ib.cu:788 NCCL WARN NET/IB : "
                "Got completion with error 12"
            ],
        )
    ]
    assert diagnose(sources).root_cause_host == "node004 GPU 1"


def test_a_shell_prompt_names_the_host_of_the_lines_after_it() -> None:
    """A session pasted from two nodes: each line belongs to the prompt above it, not to the
    first one; localhost in a prompt names no node, nor a container's id where the file names
    the node, but a container's id is the machine's only name in a pasted report."""

    def host(name: str, lines: list[str]) -> str:
        return (diagnose([LogSource.from_lines(name, lines)]).root_cause_host or "").split()[0]

    xid = "NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, GPU has fallen off the bus."
    session = [
        "[admin@gpu-a01 ~]$ dmesg | grep -i xid",
        "[admin@gpu-a01 ~]$ ssh gpu-a02",
        "root@gpu-a02:~# dmesg | grep -i xid",
        f"[Tue Mar  4 10:00:01 2025] {xid}",
        "root@gpu-a02:~# exit",
    ]
    assert host("session.txt", session) == "gpu-a02"
    for prompt in ("root@3f2a9c8e1b7d:/workspace# ", "user@localhost:~$ "):
        lines = [prompt + "dmesg", xid]
        assert host("node7.log", lines) == "node7"
    assert host("report.txt", ["root@3f2a9c8e1b7d:/workspace# dmesg", xid]) == "3f2a9c8e1b7d"
    # The line's own prefix still wins over the shell it was printed in.
    lines = ["root@login1:~# pdsh -w gpu[1-2] dmesg", f"gpu2: {xid}"]
    assert host("out.txt", lines) == "gpu2"


def test_launcher_prefixes_name_the_host() -> None:
    """pdsh / DeepSpeed's runner ("host: ", an IP too), tagged output ("[host:5]:"), Ray's
    worker prefix ("(Worker pid=N, ip=...)"), srun's "error: host: task N" and UCX's crash
    report ("[host:pid:0:tid]") say which node the line is about."""
    fault = "CUDA error: unspecified launch failure"
    for line, host in [
        (f"192.168.13.81: [rank19]:[E808 10:31:07.406] {fault}", "192.168.13.81"),
        (f"gpu017: [rank3]: RuntimeError: {fault}", "gpu017"),
        (f"[alphagpu12:5]:[rank5]: RuntimeError: {fault}", "alphagpu12"),
        (f"(RayWorkerWrapper pid=92234, ip=172.19.24.110) RuntimeError: {fault}", "172.19.24.110"),
        ("srun: error: cn125: task 0: Segmentation fault (core dumped)", "cn125"),
        (
            "208: [b1374:545909:0:545909] ud_ep.c:278 Fatal: UD endpoint 0xa to : "
            "unhandled timeout error",
            "b1374",
        ),
        (
            "[worker-0:2121 :0:7025] Caught signal 11 (Segmentation fault: address not mapped)",
            "worker-0",
        ),
    ]:
        found = diagnose([LogSource.from_lines("job.log", [line])]).root_cause_host or ""
        assert found.split()[0] == host, line


def test_an_error_code_in_the_launchers_place_is_no_host() -> None:
    """Ascend's "EI0002: ..." has the shape of pdsh's "node7: ": a code, not a node; the
    cluster exception locator after it names the card that went away."""
    lines = [
        "EI0002: [PID: 7277] 2024-11-28-11:59:30.645.648 The wait execution of the Notify "
        "register times out. Reason: The Notify register has not received the Notify record.",
        "Cluster Exception Location[IP/ID]:[90.90.92.240/1], Arrival Time:[Thu Nov 28 11:56:34 "
        "2024], Discoverer:[90.90.92.240/0], ExceptionType:[Heartbeat Lost Occurred]",
    ]
    diagnosis = diagnose([LogSource.from_lines("job.log", lines)])
    assert diagnosis.category is Category.NCCLTimeout
    assert diagnosis.root_cause_host == "90.90.92.240"
    assert diagnose([LogSource.from_lines("job.log", lines[:1])]).root_cause_host is None


def test_large_stream_is_bounded_and_finds_the_error() -> None:
    lines = (NORMAL[i % len(NORMAL)] for i in range(60_000))
    tail = ["NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."]
    source = LogSource.from_lines("node009.log", [*lines, *tail])
    diagnosis = diagnose([source])
    assert diagnosis.category is Category.GPUFallenOff
    assert diagnosis.evidence[0].line == 60_001


def test_witness_lines_and_paths_do_not_name_an_origin() -> None:
    """slurmstepd's "DUE TO NODE FAILURE" comes from a surviving node, and a path that
    happens to contain "node_fail" is no evidence at all."""
    from trainmedic.diagnosis import LogSource, diagnose

    lines = [
        "[2026-12-02 15:10:25,092] saved checkpoint at iteration 40 to "
        "/tmp/test_node_failure_x/ckpt/iter_0000040",
        "slurmstepd: error: *** STEP 1001.0 ON node001 CANCELLED AT 2026-12-02T15:10:26 DUE TO "
        "NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***",
    ]
    diagnosis = diagnose([LogSource.from_lines("rank-00000.node001.err", lines)])
    assert diagnosis.category == "NodeFailure"
    assert diagnosis.root_cause_host is None
    assert [e.signature for e in diagnosis.evidence] == ["slurm-step-node-failure"]


def test_a_refused_peer_is_named_without_the_printer() -> None:
    """NCCL on node001 (GPU 1) could not connect to a peer's listener: the peer is where to
    look, and neither node001 nor the GPU of the line's prefix is named with it."""
    line = (
        "node001:486514:486651 [1] include/socket.h:403 NCCL WARN Connect to "
        "10.148.3.247<56821> failed : Connection refused"
    )
    diagnosis = diagnose([LogSource.from_lines("rank-00001.err", [line])])
    assert diagnosis.category == "NetworkError"
    assert diagnosis.evidence[0].signature == "nccl-peer-unreachable"
    assert diagnosis.evidence[0].host == "10.148.3.247"
    # The line is about the peer: the machine that printed it is not a second origin.
    assert diagnosis.root_cause_host == "10.148.3.247"


def test_a_kubernetes_health_event_names_its_node_even_by_ip() -> None:
    """A structured health event (JSON) names the node in "nodeName", an IP on many clouds."""
    line = (
        '{"level":"INFO","msg":"Handling event","event":{"HealthEvent":{"checkName":'
        '"GpuXidError","message":"GPU has fallen off the bus (XID 79). Node requires reboot.",'
        '"nodeName":"10.0.15.233"}}}'
    )
    diagnosis = diagnose([LogSource.from_lines("quarantine.log", [line])])
    assert diagnosis.category == "GPUFallenOff"
    assert diagnosis.root_cause_host is not None
    assert diagnosis.root_cause_host.startswith("10.0.15.233")


def test_open_mpi_names_the_node_whose_daemon_it_lost() -> None:
    """Open MPI blames "the TCP network connection" but names the daemon's node: a node lost
    (the pod's exec had ended with 137 just before), placed on that node, not the launcher."""
    lines = [
        "command terminated with exit code 137",
        "ORTE has lost communication with a remote daemon.",
        "  HNP daemon   : [[11377,0],0] on node job-mpijob-0-launcher-ksczd",
        "  Remote daemon: [[11377,0],1] on node job-mpijob-0-worker-0",
        "This is usually due to either a failure of the TCP network",
    ]
    diagnosis = diagnose([LogSource.from_lines("launcher.log", lines)])
    assert diagnosis.category == "NodeFailure"
    assert diagnosis.root_cause_host == "job-mpijob-0-worker-0"


def test_places_named_in_the_line_by_newer_nccl_srun_and_ray() -> None:
    """Newer NCCL's refused connect, srun's failed task launch and Ray's memory monitor name
    the peer, the node and the node's IP: each is the place, not the line's printer."""
    cases = {
        "socketPollConnect: connect to 22.11.219.25<47479> returned Connection refused, "
        "exceeded error retry count after 35 attempts": ("NetworkError", "22.11.219.25"),
        "srun: error: Task launch for 36.0 failed on node cn131: Job credential expired": (
            "NodeFailure",
            "cn131",
        ),
        "(raylet) node_manager.cc:2963: System memory low at node with IP 172.17.0.2. Used "
        "memory (23.63GB) / total capacity (33.28GB) (0.709971) exceeds threshold 0.7, killing "
        "latest task": ("HostOOM", "172.17.0.2"),
    }
    for line, (category, host) in cases.items():
        diagnosis = diagnose([LogSource.from_lines("job.log", [line])])
        assert (diagnosis.category, diagnosis.root_cause_host) == (category, host), line
