"""Causes over consequences, by a causal model and not by line order (issue 15, point 3),
and the failure classes frameworks print in many ways (hangs, loss-scale collapse, NaN,
node loss as control planes report it)."""

from __future__ import annotations

from support.builders import diagnosed, job_info
from support.builders import nccl_watchdog_timeout as timeout

from trainmedic.core.taxonomy import Action, Category
from trainmedic.decisions.remediation import DEFAULT_CONFIDENCE_FLOOR, plan_remediation
from trainmedic.diagnosis import LogSource, diagnose, load_catalogue, suspect_hosts
from trainmedic.diagnosis.loss import find_scale_collapse
from trainmedic.diagnosis.scan import scan_source
from trainmedic.reports.triage import triage_report

# ----------------------------------------------------------------------------- fallout


def test_a_hardware_fault_outranks_the_socket_error_printed_before_it() -> None:
    """ENOTCONN on one rank a second before the NVLink fault on another: the NVLink fault is
    the cause, the socket error its fallout (and the storage signature no longer takes a bare
    ENOTCONN for a FUSE mount)."""
    sources = [
        LogSource.from_lines(
            "rank-00000.node001.err",
            [
                "[2026-12-02 14:00:01] terminate called after throwing an instance of "
                "'std::system_error'",
                "[2026-12-02 14:00:01]   what():  Transport endpoint is not connected",
                "[2026-12-02 14:00:01] RuntimeError: Connection reset by peer",
            ],
        ),
        LogSource.from_lines(
            "rank-00004.node002.err",
            [
                "[2026-12-02 14:00:02] RuntimeError: CUDA error: uncorrectable NVLink error "
                "detected during the execution"
            ],
        ),
    ]
    diagnosis = diagnose(sources)
    assert diagnosis.category is Category.NVLinkError
    assert suspect_hosts(diagnosis) == ["node002"]
    assert not diagnosis.symptom_only
    (network,) = [r for r in diagnosis.rivals if r.category is Category.NetworkError]
    assert network.reason.startswith("fallout of NVLinkError")
    assert network.where.startswith("rank-00000.node001.err:")


def test_a_lost_gpu_outranks_an_as_decisive_cause_printed_before_it() -> None:
    """A framework's out-of-memory warning (it recovers from those), then the GPU lost from the
    bus: equally decisive lines, and the GPU's own hardware fault is what ended the job, though
    printed last. One line read two ways stays one event: a CPU cache's machine check is the
    node's, not GPU memory's ECC."""
    sources = [
        LogSource.from_lines(
            "train.log",
            [
                "2020-11-06 22:55:35 | WARNING | fairseq.trainer | OOM: Ran out of memory with "
                "exception: CUDA out of memory. Tried to allocate 28.00 MiB (GPU 1; 10.92 GiB "
                "total capacity; 10.13 GiB already allocated; 13.38 MiB free)",
                "2020-11-08 23:47:40 | WARNING | fairseq.trainer | attempting to recover from OOM",
                "Unable to determine the device handle for GPU 0000:0D:00.0: GPU is lost.  "
                "Reboot the system to recover this GPU",
            ],
        )
    ]
    diagnosis = diagnose(sources)
    assert diagnosis.category is Category.GPUFallenOff
    (oom,) = [r for r in diagnosis.rivals if r.category is Category.CUDAOutOfMemory]
    assert oom.where == "train.log:1"
    machine_check = [
        "[79566.550667] mce: Uncorrected hardware memory error in user-access at 8aa9a1340",
        "[79566.550686] [Hardware Error]: Load Store Unit Ext. Error Code: 1, An ECC error or "
        "L2 poison was detected on a data cache read by a load.",
    ]
    assert diagnose([LogSource.from_lines("kern.log", machine_check)]).category is (
        Category.NodeFailure
    )


def test_a_cuda_call_nccl_makes_with_an_invalid_argument_is_nccl_s_set_up_failing() -> None:
    """NCCL's transports call CUDA for shared memory, IPC and P2P set-up: a platform that
    rejects the call (WSL2, P2P through a PCIe switch with ACS) fails NCCL's init, not the GPU."""
    lines = [
        "00127-desktop:212030:212030 [0] NCCL INFO Channel 00 : 0[1000] -> 1[5000] via "
        "SHM/direct/direct",
        "00127-desktop:212030:212030 [0] transport.cc:154 NCCL WARN Cuda failure "
        "'invalid argument'",
        "00127-desktop:212030:212030 [0] NCCL INFO init.cc:1032 -> 1",
    ]
    diagnosis = diagnose([LogSource.from_lines("vllm.log", lines)])
    assert diagnosis.category is Category.NCCLError
    assert not [r for r in diagnosis.rivals if r.category is Category.CUDAError]


def test_a_ucx_adapter_failure_names_its_node_and_a_refused_connection_names_none() -> None:
    """UCX's prefix names the node that printed the line. The adapter failing to create a
    queue is that node's own fault; a connection it had refused is a witness's account of
    a peer (or of the site's network set-up): no node is drained on it."""
    adapter = (
        "[1784273406.684686] [iv-ydzf15rfggbw80bfv8sr:994396:0]      ib_mlx5_dv.c:452  UCX  "
        "ERROR   mlx5dv_devx_obj_create(CQ) failed on mlx5_1, syndrome 0x2aac7c: Remote I/O error"
    )
    diagnosis = diagnose([LogSource.from_lines("nixl.log", [adapter])])
    assert diagnosis.category is Category.NetworkError
    assert suspect_hosts(diagnosis) == ["iv-ydzf15rfggbw80bfv8sr"]
    refused = (
        "[1716594409.541480] [gpu1:1581047:0] sock.c:323 UCX ERROR connect(fd=87, "
        "dest_addr=172.17.0.1:47133) failed: Connection refused"
    )
    diagnosis = diagnose([LogSource.from_lines("train.log", [refused])])
    assert diagnosis.category is Category.NetworkError
    plan = plan_remediation(diagnosis, job_info(nodes=("gpu1", "gpu2"), gpus_per_node=4))
    assert plan.drain == ()


def test_an_nccl_error_printed_first_is_the_fallout_of_a_gpu_fault() -> None:
    sources = [
        LogSource.from_lines(
            "rank-00000.node001.err",
            [
                "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1333, "
                "unhandled system error (run with NCCL_DEBUG=INFO for details)"
            ],
        ),
        LogSource.from_lines(
            "node007-dmesg.log",
            ["GPU 0000:3b:00.0: row remapping failure detected, GPU needs to be replaced"],
        ),
    ]
    diagnosis = diagnose(sources)
    assert diagnosis.category is Category.ECCError  # 0.8 beats 0.85: fallout is no rival
    assert suspect_hosts(diagnosis) == ["node007"]


def test_a_gpu_nvml_cannot_reach_after_a_fatal_nvswitch_error_is_that_errors_aftermath() -> None:
    lost = "Unable to determine the device handle for GPU0000:20:00.0: Unknown Error"
    fatal = "nvidia-nvswitch2: SXid (PCI:0000:aa:00.0): 20034, Fatal, Link 12 LTSSM Fault Up"
    both = diagnose([LogSource.from_lines("node004-dmesg.log", [lost, fatal])])
    assert both.category is Category.NVLinkError
    alone = diagnose([LogSource.from_lines("node004-dmesg.log", [lost])])
    assert alone.category is Category.GPUFallenOff


def test_nvlink_queries_of_a_lost_gpu_are_its_aftermath_and_an_xid_74_is_not() -> None:
    lost = [
        "unable to get device link information: error getting NVLink for devices (0, 1):",
        "failed to get nvlink remote pci info: failed to get nvlink state: GPU is lost,",
    ]
    assert diagnose([LogSource.from_lines("node3.log", lost)]).category is Category.GPUFallenOff
    link = "NVRM: Xid (PCI:0000:48:00): 74, pid=2, name=python, NVLink: fatal error detected"
    reset = (
        "NVRM: Xid (PCI:0000:48:00): 154, GPU recovery action changed from 0x0 (None) to "
        "0x1 (GPU Reset Required)"
    )
    assert diagnose([LogSource.from_lines("node3.log", [link, reset])]).category is (
        Category.NVLinkError
    )


def test_xid_154_alone_is_a_gpu_that_needs_its_repair_and_beside_its_xid_its_aftermath() -> None:
    """The driver's recovery action (Xid 154) after a paste lost the Xid that caused it: the GPU
    cannot be used until it is reset or its node rebooted. Beside that Xid it is no rival."""
    reboot = (
        "NVRM: Xid (PCI:0000:17:00): 154, GPU recovery action changed from 0x0 (None) to "
        "0x2 (Node Reboot Required)"
    )
    alone = diagnose([LogSource.from_lines("node5-dmesg.log", [reboot])])
    assert alone.category is Category.GPUFallenOff
    assert alone.evidence[0].signature == "xid-recovery-required"
    back = reboot.replace(
        "0x0 (None) to 0x2 (Node Reboot Required)", "0x1 (GPU Reset Required) to 0x0 (None)"
    )
    assert "xid-recovery-required" not in {
        e.signature for e in diagnose([LogSource.from_lines("node5-dmesg.log", [back])]).evidence
    }
    dbe = (
        "NVRM: Xid (PCI:0000:17:00): 48, pid=2, An uncorrectable double bit error (DBE) has been "
        "detected on GPU in the framebuffer at partition 0, subpartition 0."
    )
    both = diagnose([LogSource.from_lines("node5-dmesg.log", [dbe, reboot])])
    assert both.category is Category.ECCError and both.confidence > 0.9
    (rival,) = (r for r in both.rivals if r.category is Category.GPUFallenOff)
    assert rival.reason.startswith("not counted: the aftermath of xid-GPUFallenOff")


def test_a_non_fatal_nvlink5_xid_is_a_suspicion_that_drains_nothing() -> None:
    """NVIDIA's decode ignores a non-fatal NVLink5 Xid: below the floor, no node is drained on
    it. A fatal one is the NVLink fault, drained."""
    head = "NVRM: Xid (PCI:0018:01:00): "
    nonfatal = head + "145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001)"
    fatal = head + "149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000)"
    job = job_info(nodes=("node5", "node6"), gpus_per_node=8)
    alone = diagnose([LogSource.from_lines("node5-dmesg.log", [nonfatal])])
    assert alone.category is Category.NVLinkError and alone.confidence < DEFAULT_CONFIDENCE_FLOOR
    assert plan_remediation(alone, job).drain == ()
    both = diagnose([LogSource.from_lines("node5-dmesg.log", [nonfatal, fatal])])
    assert "xid-NVLinkError" in {e.signature for e in both.evidence} and both.confidence > 0.9
    assert plan_remediation(both, job).drain == ("node5",)


def test_the_nccl_cascade_is_searched_for_its_initiator() -> None:
    """Timeouts on every rank, an NCCL error that only wraps a CUDA failure on one: the CUDA
    failure on that rank started it."""
    sources = [LogSource.from_lines(f"rank-0000{r}.node00{r}.err", [timeout(r)]) for r in (0, 1, 3)]
    sources.append(
        LogSource.from_lines(
            "rank-00002.node002.err",
            [
                "torch.distributed.DistBackendError: NCCL error in: NCCLUtils.hpp:268, "
                "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
                "ncclUnhandledCudaError: Call to CUDA function failed.",
                "Last error:",
                "Cuda failure 'initialization error'",
            ],
        )
    )
    diagnosis = diagnose(sources)
    assert diagnosis.category is Category.CUDAError
    assert suspect_hosts(diagnosis) == ["node002"]
    reasons = {r.category: r.reason for r in diagnosis.rivals}
    assert reasons[Category.NCCLError].startswith("fallout of CUDAError")
    assert reasons[Category.NCCLTimeout].startswith("fallout of CUDAError")


def test_teardown_and_oom_lines_are_not_cuda_faults() -> None:
    teardown = [
        "node2:24881:25569 [0] proxy.cc:1519 NCCL WARN [Proxy Service 3] Failed to execute "
        "operation Setup from rank 3, retcode 1",
        "node2:24881:25569 [0] include/alloc.h:243 NCCL WARN Cuda failure 'driver shutting down'",
    ]
    assert diagnose([LogSource.from_lines("a.log", teardown)]).category is Category.NCCLError
    oom = [
        "ng1:30:66 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote "
        "peer ng1-ib<51159>",
        "ng1:30:66 [0] proxy.cc:1143 NCCL WARN Socket recv failed while polling for opId=0x55",
        "ng1:31:67 [3] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'",
    ]
    diagnosis = diagnose([LogSource.from_lines("b.log", oom)])
    assert diagnosis.category is Category.CUDAOutOfMemory
    assert diagnosis.root_cause_host == "ng1 GPU 3"


def test_an_exception_s_class_name_is_no_cause_of_the_words_it_wraps() -> None:
    """One event: "ImportError: ...: undefined symbol: ncclMemFree" is an NCCL library that is
    not the one torch was built against, not a script's bug that an NCCL error followed. The
    other way round, an NCCL error code quoting a CUDA failure, the quoted failure is the
    cause."""
    wrapped = diagnosed(
        "Traceback (most recent call last):",
        '  File "train.py", line 1, in <module>',
        "ImportError: /env/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so: "
        "undefined symbol: ncclMemFree",
    )
    assert wrapped.category is Category.NCCLError
    quoting = diagnosed(
        "ncclUnhandledCudaError: Call to CUDA function failed. Last error: Cuda "
        "failure 'invalid resource handle'"
    )
    assert quoting.category is Category.CUDAError


def test_a_compiler_s_wrapper_gives_way_to_the_error_it_raised() -> None:
    """Inductor wraps whatever failed under it: a cubin the driver refuses is the install's
    CUDA fault; a CUDA graph's outputs read after the next replay is the training loop's."""
    refused = diagnosed(
        "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
        "RuntimeError: Triton Error [CUDA]: device kernel image is invalid",
    )
    assert refused.category is Category.CUDAError
    graphs = diagnosed(
        "RuntimeError: Error: accessing tensor output of CUDAGraphs that has been overwritten "
        'by a subsequent run. Stack trace: File "models/tokenizer.py", line 90, in forward'
    )
    assert graphs.category is Category.ScriptError


def test_an_import_through_a_checkpoint_module_is_no_checkpoint_failure() -> None:
    """A frame of checkpointing.py at module level is Python importing it: the extension it
    imports failed to load, not a checkpoint."""
    diagnosis = diagnosed(
        "Traceback (most recent call last):",
        '  File "/w/Megatron-LM/megatron/initialize.py", line 19, in <module>',
        "    from megatron.checkpointing import load_args_from_checkpoint",
        '  File "/w/Megatron-LM/megatron/checkpointing.py", line 15, in <module>',
        "    from .utils import unwrap_model",
        '  File "/w/Megatron-LM/megatron/utils.py", line 11, in <module>',
        "    import amp_C",
        "ImportError: /usr/lib/python3.10/dist-packages/amp_C.cpython-310-x86_64-linux-gnu.so: "
        "undefined symbol: _ZN3c106detail14torchCheckFailEPKcS2_j",
    )
    assert diagnosis.category is Category.ScriptError


def test_an_object_store_refusing_the_job_s_credentials_is_the_job_s_to_fix() -> None:
    """Access denied is the job's IAM role or keys, for its owner: no retry, no storage fault.
    The store failing the request itself (throttling, 5xx) is a storage fault."""
    job = job_info(nodes=("gpu001",), gpus_per_node=8)
    denied = diagnosed(
        "botocore.exceptions.ClientError: An error occurred (AccessDenied) when "
        "calling the CreateMultipartUpload operation: Access Denied"
    )
    assert denied.category is Category.ScriptError
    assert not plan_remediation(denied, job).restart
    throttled = diagnosed(
        "botocore.exceptions.ClientError: An error occurred (SlowDown) when calling "
        "the PutObject operation: Please reduce your request rate."
    )
    assert throttled.category is Category.StorageError


# ----------------------------------------------------------------------------- symptoms


def test_symptom_only_evidence_names_no_node_to_drain() -> None:
    job = job_info(nodes=("node001", "node002"), gpus_per_node=4)
    diagnosis = diagnose([LogSource.from_lines("x.log", [timeout(5)])])
    assert diagnosis.category is Category.NCCLTimeout
    assert diagnosis.root_cause_host == "rank 5"  # where it was seen, for the report
    assert diagnosis.symptom_only
    plan = plan_remediation(diagnosis, job)
    assert plan.drain == () and plan.locate and plan.restart
    assert any("is a symptom" in reason for reason in plan.reasons)


def test_a_gloo_peer_that_went_away_names_no_node_to_drain() -> None:
    """Gloo reports a peer whose process exited ("closed by peer", "reset by peer") the same
    way whether its machine died or it raised an error: alone, the peer goes to the pair test;
    beside the peer's own error, that error is the cause."""
    job = job_info(nodes=("gpu001", "gpu002"), gpus_per_node=4)
    for line in (
        "[rank2]: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
        "peer [10.0.0.1]:23260",
        "[gloo/transport/tcp/pair.cc:566] Read error [10.0.0.1]:21925: Connection reset by peer",
    ):
        alone = diagnose([LogSource.from_lines("rank2.log", [line])])
        assert alone.category is Category.NodeFailure and alone.symptom_only
        assert alone.confidence < DEFAULT_CONFIDENCE_FLOOR
        assert plan_remediation(alone, job).drain == ()
        with_error = diagnose(
            [
                LogSource.from_lines(
                    "rank0.log",
                    ["[rank0]: datasets.table.CastError: Couldn't cast", "[rank0]: title: string"],
                ),
                LogSource.from_lines("rank2.log", [line]),
            ]
        )
        assert with_error.category is Category.ScriptError


def test_a_preempted_job_names_no_node_to_drain() -> None:
    """The scheduler took the job's node for another job: the job stopped, but the node is
    healthy, so the preemption line names none to drain even where it prints the host."""
    job = job_info(nodes=("learnfair0293", "learnfair0294"), gpus_per_node=8)
    for line in (
        "submitit WARNING (2022-07-12 04:18:45,881) - Caught signal SIGHUP on learnfair0293: "
        "this job is preempted.",
        "slurmstepd: error: *** STEP 1234.0 ON learnfair0293 CANCELLED AT "
        "2024-03-01T10:00:00 DUE TO PREEMPTION ***",
    ):
        diagnosis = diagnose([LogSource.from_lines("slurm-1234.out", [line])])
        assert diagnosis.category is Category.NodeFailure, line
        assert diagnosis.root_cause_host is None, line
        assert plan_remediation(diagnosis, job).drain == (), line


def test_a_lone_sigkill_is_a_suspected_host_oom_that_acts_on_nothing() -> None:
    """One task SIGKILLed while srun lived to report it is how the OOM killer kills; scancel,
    preemption and KillWait signal the whole step. So: host OOM, below the confidence floor,
    and the plan changes and resubmits nothing until a human confirms. A kernel OOM line
    proves it; a scheduler's exit code 137 alone and srun's clean-up after a task's own error
    exit are no memory kill at all."""
    killed = "srun: error: node003: task 5: Killed"
    alone = diagnose([LogSource.from_lines("slurm-42.out", [killed])])
    assert alone.category is Category.HostOOM and alone.confidence < DEFAULT_CONFIDENCE_FLOOR
    assert alone.root_cause_host == "node003"
    plan = plan_remediation(alone, job_info(nodes=("node003",)))
    assert plan.action is Action.investigate and plan.page_oncall
    assert plan.drain == () and not plan.restart and not plan.spec_changes
    oom = "slurmstepd: error: Detected 1 oom_kill event in StepId=42.0. Some of the step tasks"
    proven = diagnose([LogSource.from_lines("slurm-42.out", [oom, killed])])
    assert proven.category is Category.HostOOM
    assert proven.confidence >= DEFAULT_CONFIDENCE_FLOOR
    assert "killed-alone" in [e.signature for e in proven.evidence]
    assert plan_remediation(proven, job_info(nodes=("node003",))).restart
    evicted = "Warning  Evicted  pod/trainer-0  The node was low on resource: memory."
    assert diagnose([LogSource.from_lines("k.log", [evicted])]).category is Category.HostOOM
    progress = [LogSource.from_lines("slurm-42.out", ["step 10 | loss: 2.0"])]
    assert diagnose(progress, exit_code=137).category is not Category.HostOOM
    status = ["slurmstepd: error: task 0 exited with exit code 137"]
    assert diagnose([LogSource.from_lines("s.out", status)]).category is not Category.HostOOM
    cleanup = ["srun: error: node001: task 0: Exited with exit code 1", killed]
    assert diagnose([LogSource.from_lines("c.out", cleanup)]).category is not Category.HostOOM
    # Ray lists the OOM killer among a vanished worker's possible causes: a guess, not a kill.
    guess = (
        "Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a "
        "connection error code 2. End of file. There are some potential root causes. (1) The "
        "process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop "
        "--force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other "
        "unexpected errors."
    )
    assert diagnose([LogSource.from_lines("r.log", [guess])]).category is not Category.HostOOM


# ----------------------------------------------------------------------------- classes


def test_hang_detectors_name_a_hang_unless_a_collective_timed_out_first() -> None:
    monitor = (
        "[rank1]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 1] Heartbeat monitor timed out! "
        "Process will be terminated after dumping debug info. workMetaList_.size()=103"
    )
    assert diagnose([LogSource.from_lines("a.log", [monitor])]).category is Category.Hang
    # The heartbeat monitor also fires when the watchdog hangs aborting a collective that
    # timed out: then the timeout is what happened, and the report says why.
    diagnosis = diagnose([LogSource.from_lines("a.log", [monitor, timeout(2)])])
    assert diagnosis.category is Category.NCCLTimeout
    (rival,) = [r for r in diagnosis.rivals if r.signature == "heartbeat-monitor"]
    assert "aftermath of nccl-watchdog-timeout" in rival.reason
    barrier = "RuntimeError: [Rank 0]: Ranks 3 failed to pass monitoredBarrier in 30000 ms"
    diagnosis = diagnose([LogSource.from_lines("b.log", [barrier])])
    assert diagnosis.category is Category.Hang
    assert diagnosis.root_cause_host == "rank 3"  # the rank that never arrived


def test_a_stack_dump_is_a_hang_unless_a_crash_explains_it() -> None:
    dump = [
        'Thread 4888 (idle): "MainThread"',
        "    backward (torch/autograd/__init__.py:289)",
        "Thread 8287 (active)",
        "    all_gather_into_tensor (torch/distributed/distributed_c10d.py:2709)",
    ]
    assert diagnose([LogSource.from_lines("spy.txt", dump)]).category is Category.Hang
    crash = [
        "Fatal Python error: Segmentation fault",
        "",
        "Thread 0x00007f57caf71740 (most recent call first):",
        '  File "train.py", line 95 in step',
    ]
    crashed = diagnose([LogSource.from_lines("crash.txt", crash)])
    assert crashed.category is Category.Unknown  # a crash, not a hang; its cause a human's
    assert crashed.evidence[0].signature == "segfault"


def test_a_debugger_stack_in_nccl_or_a_device_sync_is_a_hang_unless_a_crash_explains_it() -> None:
    """gdb / pstack frames of a process waiting in NCCL or on the device, and cuda-gdb's
    running NCCL kernel: someone attached to a stuck job. Beside a crash, the crash wins."""
    frames = [
        "#0  0x00007f6939a424f3 in cuStreamSynchronize () from /usr/lib/libcuda.so.1",
        "#1  0x00007f6b2e8057cb in ncclGroupEnd () from /usr/local/cuda/lib64/libnccl.so.2",
    ]
    kernels = [
        "(cuda-gdb) info cuda kernels",
        "*      0      -   0 52162520 Active 0x00000001 (1,1,1) (64,1,1) ncclAllReduceRingKernel()",
    ]
    for dump in (frames, kernels):
        assert diagnose([LogSource.from_lines("gdb.txt", dump)]).category is Category.Hang
    crash = ["Program received signal SIGSEGV, Segmentation fault.", *frames]
    crashed = diagnose([LogSource.from_lines("gdb.txt", crash)])
    assert crashed.category is Category.Unknown and crashed.evidence[0].signature == "segfault"


def test_a_log_that_just_stops_is_a_hang_with_no_node_to_drain() -> None:
    quiet = [
        f"gpu1505:22060:22171 [0] NCCL INFO Channel {i:02d}/0 : 0[0] -> 1[0] via NET/IB/0"
        for i in range(8)
    ]
    diagnosis = diagnose([LogSource.from_lines("gpu1505.log", quiet)])
    assert diagnosis.category is Category.Hang
    assert diagnosis.symptom_only and diagnosis.confidence < 0.5
    assert diagnosis.root_cause_host == "gpu1505"  # where it stopped, not proof of a fault
    plan = plan_remediation(diagnosis, job_info(nodes=("gpu1505", "gpu1506")))
    assert plan.locate and plan.drain == ()
    ended = [*quiet, "RuntimeError: something else broke"]
    assert diagnose([LogSource.from_lines("x.log", ended)]).category is not Category.Hang
    # glog's INFO lines (XLA, libtpu) are ordinary output too; a node shut down is no silence.
    glog = [f"I0515 20:03:2{i}.569316  343449 flash_attention.cc:1908] dry run" for i in range(4)]
    assert diagnose([LogSource.from_lines("tpu.log", glog)]).category is Category.Hang
    verbose = [f"[rank{i}]:V0731 00:56:29.066000 1323 stage.py:1354] receiving" for i in range(2)]
    assert diagnose([LogSource.from_lines("pp.log", verbose)]).category is Category.Hang
    stopped = [*glog, "2020-06-16 21:26:07,014 INFO commands.py:136 -- kill_node: Shutdown worker"]
    assert diagnose([LogSource.from_lines("ray.log", stopped)]).category is not Category.Hang
    # NCCL probing for its optional plugins at start-up is routine; a report's "..." says nothing.
    probing = [
        "g046:23932:23932 [0] NCCL INFO NET/Plugin : Plugin load (libnccl-net.so) returned 2 : "
        "libnccl-net.so: cannot open shared object file: No such file or directory",
        "g046:23932:23932 [0] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v4 symbol.",
        *quiet,
        "...",
    ]
    assert diagnose([LogSource.from_lines("g046.log", probing)]).category is Category.Hang
    # A Python warning printed on the first pass through a code path is no ending either.
    warned = [
        "Epoch 0:   0%|          | 0/410 [00:00<?, ?it/s]",
        "/opt/torch/utils/checkpoint.py:460: UserWarning: torch.utils.checkpoint: please pass in "
        "use_reentrant=True or use_reentrant=False explicitly.",
        "  warnings.warn(",
    ]
    assert diagnose([LogSource.from_lines("train.log", warned)]).category is Category.Hang
    # Ranks checking in, and the log ends there: the rest of the members never came.
    waiting = [f"initializing ddp: GLOBAL_RANK: {r}, MEMBER: {r + 1}/8" for r in range(4)]
    assert diagnose([LogSource.from_lines("lightning.log", waiting)]).category is Category.Hang
    ray = [f"(BaseWorkerMixin pid=30{i}, ip=10.0.0.{i}) Device: cuda:0" for i in range(4)]
    assert diagnose([LogSource.from_lines("ray.log", ray)]).category is Category.Hang
    # A short level tag ("[I]"), and a run that ends on Weights & Biases' summary: training was
    # over and the job never got out.
    writing = [
        "23:05:22.723 [I] [process=0] /jax/checkpoint/write/blocking_bytes_per_sec: 847.4 MiB/s",
        "23:05:22.727 [I] Array name: 'opt_state.1.0.nu.linear.value', global shape: (18, 16384)",
    ]
    assert diagnose([LogSource.from_lines("pi0.log", writing)]).category is Category.Hang
    summary = ["wandb: Run history:", "wandb:        metrics/mAP_0.5 ▁▁▁▁▁▂▁▂▃▄▃▃▄▄▄▅▆▆▆▅▆▇▇▇"]
    assert diagnose([LogSource.from_lines("yolo.log", summary)]).category is Category.Hang
    # PyTorch loading the extension it built, and nothing after: a stale build lock it waits on.
    loading = [
        "Building extension module dvr...",
        "ninja: no work to do.",
        "Loading extension module dvr...",
    ]
    assert diagnose([LogSource.from_lines("train.log", loading)]).category is Category.Hang
    written = [*summary, "wandb: ERROR Run initialization has timed out after 90.0 sec."]
    assert diagnose([LogSource.from_lines("yolo.log", written)]).category is not Category.Hang


def test_a_fabric_that_cannot_register_memory_is_the_network_not_host_memory() -> None:
    efa = [
        "libfabric:718892:1658904526::efa:mr:efa_mr_regattr():632<warn> Unable to register MR: "
        "Cannot allocate memory",
        "libfabric:718892:1658904526::efa:eq:efa_eq_write_error():662<warn> Writing error "
        "Cannot allocate memory to EQ.",
    ]
    diagnosis = diagnose([LogSource.from_lines("rank0.log", efa)])
    assert diagnosis.category is Category.NetworkError
    (host_memory,) = [r for r in diagnosis.rivals if r.category is Category.HostOOM]
    assert host_memory.reason.startswith("not counted: the aftermath of fabric-memory-registration")
    queue = [
        "libfabric:17778:1732779731::efa:cq:efa_cq_ibv_cq_ex_open_with_ibv_create_cq_ex():92<warn> "
        "Unable to create extended CQ: Cannot allocate memory",
        "algo-1:17778:17848 [5] nccl_net_ofi_create_plugin:259 NCCL WARN NET/OFI aws-ofi-nccl "
        "initialization failed",
    ]
    assert diagnose([LogSource.from_lines("r.log", queue)]).category is Category.NetworkError
    alone = diagnose(
        [LogSource.from_lines("rank0.log", ["OSError: [Errno 12] Cannot allocate memory"])]
    )
    assert alone.category is Category.HostOOM


def test_loss_scale_collapse_is_a_loss_spike_and_a_settled_warmup_is_not() -> None:
    overflow = [
        f"[2024-09-11 17:52:{i:02d},030] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] "
        f"OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {2 ** (20 - i)}, reducing to "
        f"{2 ** (19 - i)}"
        for i in range(6)
    ]
    diagnosis = diagnose([LogSource.from_lines("a.log", overflow)])
    assert diagnosis.category is Category.LossSpike
    assert diagnosis.evidence[0].signature == "loss-scale-collapse"
    fairseq = [f"| WARNING: overflow detected, setting loss scale to: {0.5**k}" for k in (9, 10)]
    assert diagnose([LogSource.from_lines("f.log", fairseq)]).category is Category.LossSpike
    paddle = [
        line
        for k in range(5)
        for line in (
            f"[ WARNING] - optimizer not run, scale_before: {2.0 ** (15 - k)}, "
            f"scale_after: {2.0 ** (14 - k)}",
            f"[    INFO] - loss: 2.0{k}, learning_rate: 0.0, global_step: {18 + k}",
        )
    ]
    assert diagnose([LogSource.from_lines("p.log", paddle)]).category is Category.LossSpike
    # Paddle's AMP scaler, between its own loss lines
    amp = [
        line
        for k in range(5)
        for line in (
            f"Found inf or nan, current scale is: {0.5 ** (9 + k)}, decrease to: "
            f"{0.5 ** (9 + k)}*0.5",
            f"[2022/07/11 09:17:31] ppocr INFO: epoch: [2/1200], global_step: {100 + k}, "
            "loss: 5.235338",
        )
    ]
    assert diagnose([LogSource.from_lines("amp.log", amp)]).category is Category.LossSpike
    settled = [
        *overflow,
        *(
            f" iteration {i} | lm loss: 2.1E+00 | loss scale: 16384.0 | grad norm: 0.8 |"
            for i in range(10)
        ),
    ]
    assert diagnose([LogSource.from_lines("b.log", settled)]).category is not Category.LossSpike
    # A shorter fall the log still ends in: a suspicion, below the floor (nothing rolled back).
    # Each of these lines is a fall of its own ("Attempted 2^20, reducing to 2^19"): two are two.
    falling = diagnose([LogSource.from_lines("s.log", overflow[:2])])
    assert falling.category is Category.LossSpike
    assert falling.evidence[0].signature == "loss-scale-falling"
    assert falling.confidence < DEFAULT_CONFIDENCE_FLOOR
    once = diagnose([LogSource.from_lines("o.log", overflow[:1])])
    assert once.category is not Category.LossSpike
    # Paddle's two lines from 0.25 down to 0.0625: two falls, the first stated in its own line.
    short = [
        "[ WARNING] - optimizer not run, scale_before: 0.25, scale_after: 0.125",
        "[    INFO] - loss: 2.09252715, learning_rate: 0.0, global_step: 18",
        "[ WARNING] - optimizer not run, scale_before: 0.125, scale_after: 0.0625",
        "[    INFO] - loss: 2.04623556, learning_rate: 0.0, global_step: 19",
    ]
    assert diagnose([LogSource.from_lines("q.log", short)]).category is Category.LossSpike


def test_a_gradient_norm_that_blows_up_is_a_loss_spike_a_human_looks_at() -> None:
    """The gradient norm jumping twentyfold in a log that then goes on in ordinary output: the
    instability before a loss spike, below the floor (nothing is rolled back unasked). A clip
    threshold ("max_grad_norm") is a setting, and a norm that jitters is no blow-up."""
    steady = [f"{{'loss': 0.09{k}, 'grad_norm': {3 + k % 3}.5, 'epoch': 0.03}}" for k in range(8)]
    blowup = [*steady, "{'loss': 0.1045, 'grad_norm': 237.627, 'epoch': 0.03}", *steady[:3]]
    diagnosis = diagnose([LogSource.from_lines("trainer.log", blowup)])
    assert diagnosis.category is Category.LossSpike
    assert diagnosis.evidence[0].signature == "grad-norm-spike"
    assert diagnosis.evidence[0].line == 9
    assert diagnosis.confidence < DEFAULT_CONFIDENCE_FLOOR
    plan = plan_remediation(diagnosis, job_info(nodes=("gpu001",), gpus_per_node=8))
    assert plan.action is Action.investigate and plan.page_oncall
    jitter = [*steady, "{'loss': 0.1, 'grad_norm': 19.0, 'epoch': 0.03}", "max_grad_norm: 500.0"]
    assert diagnose([LogSource.from_lines("t.log", jitter)]).category is not Category.LossSpike


def _fall(scale: int, rank: int) -> str:
    """DeepSpeed's line for one halving of the loss scale, as one rank prints it."""
    return (
        f"[Rank {rank}] [deepspeed] OVERFLOW! Skipping step. Attempted loss scale: {scale}, "
        f"reducing to {scale // 2}\n"
    )


def test_a_loss_scale_fall_read_across_block_boundaries_is_counted_once() -> None:
    """A log is read in blocks: a block that starts with another rank's copy of the last fall
    must not restate the scale before it (a fake rise would cut the collapse short)."""
    text = "".join(_fall(scale, r) for scale in (65536, 32768, 16384, 8192) for r in range(4))
    cut = text.rfind("[Rank 2]")
    blocks = [text[:cut].encode(), (text[cut:] + _fall(4096, 0)).encode()]
    source = LogSource(name="rank0.log", open_blocks=lambda: iter(blocks))
    collapse = find_scale_collapse(scan_source(source, 0, load_catalogue()).scale_points)
    assert collapse is not None and collapse.deep
    assert (collapse.start, collapse.end, collapse.drops) == (65536, 2048, 5)
    floor = "Exception: Current loss scale already at minimum - cannot decrease scale anymore."
    assert diagnose([LogSource.from_lines("c.log", [floor])]).category is Category.LossSpike


def test_the_last_loss_scale_reading_carries_over_blocks_that_print_none() -> None:
    """Blocks of loss lines with no scale reading between two falls (sampled and fully read
    ones alike) must not make the next block's restated fall look like a fall of its own."""
    falls = "".join(_fall(scale, r) for scale in (65536, 32768, 16384, 8192) for r in range(4))
    quiet = "".join(f"step {i} | lm loss: 2.1E+00\n" for i in range(200))
    last = _fall(8192, 1) + _fall(4096, 0)
    # The falls in a sampled block, then in a block read again in full at the end.
    for texts in (
        [falls, quiet, quiet, quiet, quiet, last],
        [quiet, quiet, quiet, falls, last],
    ):
        blocks = [text.encode() for text in texts]
        source = LogSource(name="rank0.log", open_blocks=lambda blocks=blocks: iter(blocks))
        collapse = find_scale_collapse(scan_source(source, 0, load_catalogue()).scale_points)
        assert collapse is not None and collapse.deep
        assert (collapse.start, collapse.end, collapse.drops) == (65536, 2048, 5)


def test_nan_as_frameworks_print_it() -> None:
    for line in (
        "2023-03-22 09:32:52 iter 3010: loss nan, time 1019.95ms, mfu 14.12%",
        "RuntimeError: Function 'LogSoftmaxBackward' returned nan values in its 0th output.",
        "AssertionError: Rank 11: found NaN in local grad norm in backward pass before "
        "data-parallel communication collective. Device: 3",
        "FloatingPointError: Loss became infinite or NaN at iteration=5593!",
    ):
        assert diagnose([LogSource.from_lines("n.log", [line])]).category is Category.NaNLoss


def test_node_loss_as_control_planes_report_it() -> None:
    ray = (
        "The node with node id: 75b2eec8 and ip: 10.4.4.107 has been marked dead because the "
        "detector has missed too many heartbeats from it."
    )
    diagnosis = diagnose([LogSource.from_lines("gcs.log", [ray])])
    assert diagnosis.category is Category.NodeFailure
    assert diagnosis.root_cause_host == "10.4.4.107"
    k8s = [
        "$ kubectl describe node gke-pool-6srl",
        "  Ready   Unknown   NodeStatusUnknown   Kubelet stopped posting node status.",
    ]
    diagnosis = diagnose([LogSource.from_lines("k.log", k8s)])
    assert diagnosis.category is Category.NodeFailure
    assert diagnosis.root_cause_host == "gke-pool-6srl"
    # Its peers' connection resets are its fallout, whatever their weight.
    peers = [ray, "RuntimeError: Connection reset by peer", timeout(2)]
    assert diagnose([LogSource.from_lines("j.log", peers)]).category is Category.NodeFailure


def test_a_process_stuck_in_the_kernel_waits_on_storage_unless_in_the_gpu_driver() -> None:
    stuck = [
        "[  +0.000049] task:python3.11      state:D stack:    0 pid:15277 ppid: 15257",
        "[  +0.000003]  <TASK>",
        "[  +0.000004]  __schedule+0x23d/0x590",
        "[  +0.000005]  mutex_lock+0x34/0x40",
    ]
    assert diagnose([LogSource.from_lines("dmesg", stuck)]).category is Category.StorageError
    in_driver = [*stuck, "[  +0.000005]  uvm_page_tree_get_ptes_async+0x93/0x970 [nvidia_uvm]"]
    assert diagnose([LogSource.from_lines("dmesg", in_driver)]).category is Category.Hang


def test_ib_completion_errors_place_the_side_they_belong_to() -> None:
    remote = (
        "node023:10214:10303 [0] transport/net_ib.cc:1909 NCCL WARN NET/IB : Got completion "
        "from peer 10.1.3.201<33057> with status=12 opcode=0 len=0 vendor err 129"
    )
    diagnosis = diagnose([LogSource.from_lines("job.log", [remote])])
    assert diagnosis.category is Category.NetworkError
    assert "10.1.3.201" in (diagnosis.root_cause_host or "")
    local = remote.replace("status=12", "status=4")
    diagnosis = diagnose([LogSource.from_lines("job.log", [local])])
    assert diagnosis.root_cause_host == "node023 GPU 0"


def test_the_report_says_why_the_winner_beat_each_rival() -> None:
    sources = [
        LogSource.from_lines(
            "rank-00000.node001.err", ["RuntimeError: Connection reset by peer", timeout(0)]
        ),
        LogSource.from_lines(
            "node002-dmesg.log", ["NVRM: Xid (PCI:0000:3b:00): 74, pid=9, NVLink fatal error"]
        ),
    ]
    diagnosis = diagnose(sources)
    job = job_info(nodes=("node001", "node002"))
    plan = plan_remediation(diagnosis, job)
    assert plan.action is Action.isolate_and_retry and plan.drain == ("node002",)
    text = triage_report(
        job=job,
        diagnosis=diagnosis,
        plan=plan,
        actions=[],
        checkpoint=None,
        new_job=None,
        diagnostics=None,
        dry_run=True,
    )
    assert "## Why this diagnosis" in text
    assert "| NetworkError |" in text and "fallout of NVLinkError" in text
    assert "| NCCLTimeout |" in text


def test_the_desync_report_names_the_cascades_initiator_but_drains_nothing() -> None:
    report = [
        timeout(0, 241),
        "[rank0]:[E515 18:36:47.343377708 ProcessGroupNCCL.cpp:1937] Rank 0",
        "         - [0] Timeout at collective: ALLREDUCE, #315",
        "         - To our best knowledge, the lagging/dead/mismatched ranks that caused the "
        "desync are:",
        "             [7] finished collective #182, but didn't join collective #183 (count from 1)",
        *(timeout(r, 241) for r in (1, 2, 3)),
    ]
    diagnosis = diagnose([LogSource.from_lines("rank-00000.out", report)])
    assert diagnosis.category is Category.NCCLTimeout
    assert diagnosis.root_cause_host == "rank 7"
    assert diagnosis.symptom_only
    plan = plan_remediation(diagnosis, job_info(nodes=("node001", "node002"), gpus_per_node=4))
    assert plan.drain == () and plan.locate


SAVING = (
    "INFO:torchtune.utils._logging:Saving checkpoint. This may take some time. "
    "Retrieving full model state dict..."
)


def _job_saving(after_save: list[str]) -> list[LogSource]:
    steps = [f"step {i} | loss: {2.0 - i / 100:.3f}" for i in range(1, 30)]
    return [
        LogSource.from_lines("rank-00000.node000.out", [*steps, SAVING, *after_save]),
        *(
            LogSource.from_lines(f"rank-{r:05d}.node00{r}.err", [*steps, timeout(r)])
            for r in (1, 2, 3)
        ),
    ]


def test_timeouts_while_a_rank_still_saves_a_checkpoint_are_the_saves() -> None:
    # Rank 0 began a save and printed nothing after it; the others waited in a barrier until
    # the watchdog fired: the checkpoint save, on rank 0's node, a human's to look at.
    diagnosis = diagnose(_job_saving(["INFO: Getting full model state dict took 109.51 secs"]))
    assert diagnosis.category is Category.CheckpointError
    assert diagnosis.root_cause_host == "node000"
    assert not diagnosis.symptom_only
    assert any(e.signature == "checkpoint-save-unfinished" for e in diagnosis.evidence)


def test_a_save_that_finished_or_training_that_went_on_explains_no_timeout() -> None:
    for after in (["INFO: Saved checkpoint to /ckpt/step_30"], ["step 30 | loss: 1.700"]):
        assert diagnose(_job_saving(after)).category is Category.NCCLTimeout
    # a save alone, with nothing waiting on it, is no failure either
    alone = [LogSource.from_lines("rank-00000.node000.out", ["step 1 | loss: 2.0", SAVING])]
    assert diagnose(alone, heartbeat_age_s=5).category is not Category.CheckpointError


def test_ranks_timed_out_in_different_collectives_is_the_codes_divergence() -> None:
    """At one sequence number rank 0 waits in a gradient all-reduce while rank 1 has gone on
    to a 1-element one (an evaluation only it runs): a code path, not a node; the job goes
    to its owner, nothing is pair-tested or retried. The same collective everywhere, or a
    coalesced group whose size differs by rank, is a plain timeout."""
    diverged = timeout(1).replace("NumelIn=1048576, NumelOut=1048576", "NumelIn=1, NumelOut=1")
    sources = [
        LogSource.from_lines("rank-00000.node000.out", [timeout(0)]),
        LogSource.from_lines("rank-00001.node001.out", [diverged]),
    ]
    diagnosis = diagnose(sources)
    assert diagnosis.category is Category.ScriptError
    assert diagnosis.evidence[0].signature == "collectives-mismatched"
    plan = plan_remediation(diagnosis, job_info(nodes=("node000", "node001")))
    assert plan.action is Action.notify_owner and not plan.drain and not plan.locate
    other_op = timeout(1).replace("OpType=ALLREDUCE", "OpType=_ALLGATHER_BASE")
    assert diagnose([*sources[:1], LogSource.from_lines("b.out", [other_op])]).category is (
        Category.ScriptError
    )
    same = [LogSource.from_lines(f"rank-0000{r}.node00{r}.out", [timeout(r)]) for r in (0, 1)]
    assert diagnose(same).category is Category.NCCLTimeout
    coalesced = [
        LogSource.from_lines(
            f"r{r}.out",
            [timeout(r).replace("ALLREDUCE, NumelIn=1048576", f"COALESCED, NumelIn={r + 5}")],
        )
        for r in (0, 1)
    ]
    assert diagnose(coalesced).category is Category.NCCLTimeout
    # A line a terminal cut inside the operation's name names no other collective.
    cut = timeout(1).replace("OpType=ALLREDUCE,", "OpType=ALLRED[451/1919]\nUCE,")
    assert diagnose([*sources[:1], LogSource.from_text("c.out", cut)]).category is (
        Category.NCCLTimeout
    )


def test_a_gpu_fault_on_one_node_outranks_the_reset_its_peer_saw() -> None:
    """The peer's socket reset is printed first, but it is what node B's dying process did to
    the connection: a witness's line explains nothing away (nccl #629)."""
    lines = [
        "nodea:46841:46987 [0] include/socket.h:428 NCCL WARN Net : Call to recv from "
        "10.0.0.2<36048> failed : Connection reset by peer",
        "nodeb:104934:104934 [1] init.cc:204 NCCL WARN Cuda failure 'an illegal memory access "
        "was encountered'",
        "nodeb: Test NCCL failure common.cu:497 'unhandled cuda error'",
    ]
    diagnosis = diagnose([LogSource.from_lines("nccl-tests.out", lines)])
    assert diagnosis.category is Category.CUDAError
    assert (diagnosis.root_cause_host or "").startswith("nodeb")


def test_a_ranks_own_bug_outranks_the_nccl_errors_of_its_peers() -> None:
    """Rank 0 dies of a KeyError; its peers' communicators then fail ("remote process exited"),
    whichever is printed first: the bug goes to its owner, no node is suspected."""
    sources = [
        LogSource.from_lines(
            "rank-00001.node002.err",
            [
                "[2026-12-02 14:00:01] torch.distributed.DistBackendError: NCCL error in: "
                "ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, "
                "NCCL version 2.21.5",
                "ncclRemoteError: A call failed possibly due to a network error or a remote "
                "process exiting prematurely.",
            ],
        ),
        LogSource.from_lines(
            "rank-00000.node001.err",
            [
                "[2026-12-02 14:00:02] Traceback (most recent call last):",
                '  File "train.py", line 88, in <module>',
                '    batch = sample["input_ids"]',
                "KeyError: 'input_ids'",
            ],
        ),
    ]
    diagnosis = diagnose(sources)
    assert diagnosis.category is Category.ScriptError
    (nccl,) = [r for r in diagnosis.rivals if r.category is Category.NCCLError]
    assert nccl.reason.startswith("fallout of ScriptError")


def test_a_collective_that_timed_out_inside_a_checkpoint_save_is_the_save() -> None:
    """PyTorch's watchdog prints the stack of the collective that timed out: called from
    Megatron's async checkpoint finalisation, the ranks were waiting on a checkpoint save, not
    on a broken fabric (verl #2238). The same timeout called from the training step stays one."""

    def lines(frame: str) -> list[str]:
        return [
            "[rank5]:[E627 12:26:40.073493187 ProcessGroupNCCL.cpp:629] [Rank 5] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=29, OpType=ALLREDUCE, NumelIn=1, "
            "NumelOut=1, Timeout(ms)=600000) ran for 600014 milliseconds before timing out.",
            "[rank5]:[E627 12:26:40.074084476 ProcessGroupNCCL.cpp:664] Stack trace of the "
            "failed collective: ",
            "#0 all_reduce from /usr/local/lib/python3.10/dist-packages/torch/distributed/"
            "distributed_c10d.py:2806",
            frame,
        ]

    saving = "#2 sync_all_async_calls from /usr/local/lib/python3.10/dist-packages/megatron/core/"
    saving += "dist_checkpointing/strategies/async_utils.py:149"
    training = "#2 train_step from /workspace/megatron/training/training.py:640"
    assert diagnose([LogSource.from_lines("rank5.err", lines(saving))]).category is (
        Category.CheckpointError
    )
    assert diagnose([LogSource.from_lines("rank5.err", lines(training))]).category is (
        Category.NCCLTimeout
    )
