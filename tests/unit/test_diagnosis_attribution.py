"""Who wrote a line: the prefixes that name a host, and the ones that only look like it."""

from __future__ import annotations

import pytest

from trainmedic.diagnosis import LogSource, diagnose
from trainmedic.diagnosis.attribution import (
    attribute,
    ray_task_scopes,
    shell_prompts,
    writer,
)
from trainmedic.diagnosis.xid import parse_xid_line


@pytest.mark.parametrize(
    ("line", "host", "rank", "gpu"),
    [
        ("gpu-07:1234:5678 [3] NCCL INFO NET/IB : Using [0]mlx5_0:1", "gpu-07", None, "3"),
        (
            "May 29 10:01:02 node12 kernel: NVRM: Xid (PCI:0000:3b:00): 79",
            "node12",
            None,
            "0000:3b:00",
        ),
        ("[gpu12:5]: RuntimeError: NCCL error", "gpu12", None, None),
        ("(RayWorker pid=9, ip=10.0.0.3) [rank3]: CUDA error", "10.0.0.3", 3, None),
        # an NCCL line a report quotes; a node controller's JSON naming the node it acts on
        (
            '"nid005018:47819:47913 [0] create_nccl_ofi_component:817 NCCL WARN',
            "nid005018",
            None,
            "0",
        ),
        (
            '{"msg":"Setting annotations on node","node":"aks-gpu-1249-vmss0l"}',
            "aks-gpu-1249-vmss0l",
            None,
            None,
        ),
        # ... but not a value that names no machine
        ('{"level":"info","msg":"step done","node":"worker"}', None, None, None),
        # Ray's prefix with its pid left empty, quoted as a comment in a report
        ("# (pid=, ip=10.128.0.91) E1123 04:35:32 RESOURCE_EXHAUSTED", "10.128.0.91", None, None),
        ('{"hostname": "trn-4", "msg": "device lost"}', "trn-4", None, None),
        ("[rank5]: torch.OutOfMemoryError on cuda:5", None, 5, "5"),
        # A fleet health check's per-node line
        (
            "mynode-510 | ERROR: nhc: Health check failed: check_gpu_ecc: GPU id 3",
            "mynode-510",
            None,
            None,
        ),
        # GCC's linker driver and compiler at a line's start are programs, not nodes
        ("collect2: error: ld returned 1 exit status", None, None, None),
        ("cc1plus: fatal error: Killed signal terminated program", None, None, None),
        # ... nor are the devices the kernel names: an HCA, an interface, a disk
        ("mlx5_0: couldn't register ipoib port 1; error -12", None, None, None),
        ("enp6s0f1: Link is Down", None, None, None),
        ("nvme0n1: I/O error, dev nvme0n1, sector 2048", None, None, None),
        # ... and a NIC's PCI address is no GPU
        ("cxi_core 0000:c0:00.0: cxi2[hsn2]: C_EC_UNCOR_NS: C_IXE error", None, None, None),
        ("NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.", None, None, "0000:3b:00"),
        # a row of PBS's node list names the node it is about
        (
            "x3014c0s19b0n0       offline,resv-exclusive Xid 74 -- GPUs need reseat",
            "x3014c0s19b0n0",
            None,
            None,
        ),
        (
            "x4013c0s7b0n0,down,EXECJOB_BEGIN: RECHECK 1/40 grand mdc disconnect",
            "x4013c0s7b0n0",
            None,
            None,
        ),
    ],
)
def test_attribute_reads_host_rank_and_gpu_from_the_line(
    line: str, host: str | None, rank: int | None, gpu: str | None
) -> None:
    found_host, found_rank, found_gpu, _ = attribute(line)
    assert (found_host, found_rank, found_gpu) == (host, rank, gpu)


def test_attribute_reads_an_iso_timestamp_near_the_start() -> None:
    *_, timestamp = attribute("2026-12-05T10:00:01.5 node3 kernel: NVRM: Xid 48")
    assert timestamp == 1796464801.5  # 2026-12-05 10:00:01.5 UTC
    assert attribute("no time here")[3] is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("node7: Traceback (most recent call last):", None),  # "epoch1: " reads the same
        ("192.168.13.81: Traceback (most recent call last):", "192.168.13.81"),
        ("gpu-07:1234:5678 [3] NCCL WARN Call to ibv_create_qp failed", "gpu-07"),
        ("Linux node-11 5.4.0-65-generic #73-Ubuntu SMP x86_64 GNU/Linux", "node-11"),
        ("Linux version 5.4.0-65-generic (buildd@lcy01) (gcc 9.3.0)", None),
        (
            "#  Rank  0 Group  0 Pid  21284 on deep-visionscaper3 device  0 [0x2f] AMD MI100",
            "deep-visionscaper3",
        ),
        ("EI0002: The wait execution of the Notify register times out.", None),
        (
            '4月 28 15:08:10 master-02 containerd[3862899]: level=error msg="StartContainer"',
            "master-02",
        ),
        ("Jan 30 11:58:43 node systemd[1]: nvidia-fabricmanager.service: Killing process", None),
        # journalctl under a European locale writes the month in lowercase
        (
            "nov 07 01:36:56 bernard kernel: amdgpu 0000:0a:00.0: amdgpu: ring gfx_0.0.0 timeout",
            "bernard",
        ),
        (
            "april 24 16:22:15 robin-linux-x3d kernel: NVRM: GPU 0000:01:00.0: GPU is lost",
            "robin-linux-x3d",
        ),
        (
            "Feb 14 05:03:42 000-000-00000-1-gpu-1 kernel: nvidia 0000:18:00.0: enabling device",
            "000-000-00000-1-gpu-1",
        ),
        ("Feb 14 05:03:42 12 kernel: nvidia 0000:18:00.0: enabling device", None),
        ("took 12 10:00:00 steps[3]: done", None),
        (
            "2020-06-15T14:41:33.52+02:00 ossw02 <kern.warning> kernel: LNet: Service thread",
            "ossw02",
        ),
        # a syslog line as `grep -r` prints it, after the file it was found in
        (
            "/var/log/kern.log:Aug 18 14:30:16 ubuntu kernel: Out of memory: Killed process 604639",
            "ubuntu",
        ),
        # Cray MPICH's abort names the rank's node; Kaldi's queue.pl log header names the machine
        (
            "MPICH ERROR [Rank 0] [job id 2843791.3] [Tue Feb 14 16:11:55 2023] [nid007564] - "
            "Abort(1616271) (rank 0 in comm 0): Fatal error in PMPI_Init: Other MPI error",
            "nid007564",
        ),
        ("# Running on r7n01", "r7n01"),
        # journalctl -o short-precise prints the microseconds
        (
            "Aug 10 22:40:59.880752 anthill kernel: NVRM: GPU0 _issueRpcAndWait: "
            "rpcSendMessage failed with status 0x0000000f for fn 10 sequence 759!",
            "anthill",
        ),
        # ... while a PBS node list's row was written by whoever ran pbsnodes
        ("x3014c0s19b0n0       offline,resv-exclusive Xid 74 -- GPUs need reseat", None),
        # Open MPI's signal handler names the rank's machine; a rank tag in brackets does not
        ("[bc-gpu1:01501] *** Process received signal ***", "bc-gpu1"),
        ("[bc-gpu1:01501] Signal: Segmentation fault (11)", "bc-gpu1"),
        # in a container, its id (12 hex digits, maybe a digit first) is the host name
        ("[1,1]<stderr>:[27c929c21716:87519] Signal: Aborted (6)", "27c929c21716"),
        ("[rank0:3] Signal: Segmentation fault (11)", None),
        # LSF's report of a one-host job names its machine; of a two-host job, neither
        (
            "Job was executed on host(s) <n-62-23-25>, in queue <hpc>, as user <s18> in cluster",
            "n-62-23-25",
        ),
        ("Job was executed on host(s) <4*gpu-a1>, in queue <gpu>, as user <u>", "gpu-a1"),
        ("Job was executed on host(s) <4*gpu-a1>, <4*gpu-a2>, in queue <gpu>, as user <u>", None),
        # TensorFlow's CUDA diagnostics, after cuInit failed on that machine
        (
            "2020-02-23 02:17:51.838379: I tensorflow/stream_executor/cuda/cuda_diagnostics.cc:176]"
            " hostname: nid05467",
            "nid05467",
        ),
    ],
)
def test_writer_takes_only_prefixes_that_leave_no_doubt(line: str, expected: str | None) -> None:
    assert writer(line) == expected


def test_shell_prompts_name_the_host_or_container_and_skip_localhost() -> None:
    body = (
        b"(base) alice@gpu-03:~$ nvidia-smi\n"
        b"No devices were found\n"
        b"root@3f2a9c1b7d4e:/workspace# python train.py\n"
        b"[bob@login1 ~]$ ssh gpu-2-5 nvidia-smi\n"
        b"carol@localhost:~$ python train.py\n"
    )
    assert shell_prompts(body) == [(0, "gpu-03"), (2, "3f2a9c1b7d4e"), (3, "gpu-2-5")]


def test_srun_from_a_prompt_places_what_follows_on_its_one_node_or_on_none() -> None:
    """What srun prints comes from the allocation's nodes, not from the login node whose prompt
    typed it: its one node where -w names one, no host where it names several."""
    body = (
        b"[root@bright88 mxnet]# srun -N 1 -G 4 --exclusive -w node001 bash ./run.sh\n"
        b"slurmstepd: error: pyxis: couldn't start container\n"
        b"[root@bright88 mxnet]# srun -N 2 -w node[001-002] bash ./run.sh\n"
        b"[root@bright88 mxnet]# srun -N 2 --nodelist=gpu1,gpu2 hostname\n"
        b"[root@bright88 mxnet]# sinfo\n"
    )
    assert shell_prompts(body) == [(0, "node001"), (2, None), (3, None), (4, "bright88")]


def test_a_ray_task_header_places_the_traceback_under_it_and_no_more() -> None:
    """The error a Ray task raised happened on the node its header names, whatever the
    file's own host; its traceback ends at the first blank line, and the lines after it are
    placed as before it (the header does not make that node a writer of the whole log)."""
    body = (
        b"ray::WorkerDict.actor_rollout_generate_sequences() (pid=838798, ip=10.138.0.27, "
        b"actor_id=f5aa8b4a)\n"
        b'  File "/verl/workers/fsdp_workers.py", line 446, in generate_sequences\n'
        b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    assert ray_task_scopes(body)[0] == [(0, "10.138.0.27", 4)]
    diagnosis = diagnose([LogSource.from_text("driver.log", body.decode())])
    assert diagnosis.category.value == "CUDAError"
    assert diagnosis.root_cause_host == "10.138.0.27"
    assert ray_task_scopes(b"ray::main_task() failed\n")[0] == []
    # Ray's colour codes around the task's name, kept or with the escape character lost
    for colour in (b"\x1b[39m", b"[39m", b"#033[39m"):
        coloured = body.replace(b"() (pid", b"()" + colour + b" (pid")
        assert ray_task_scopes(coloured)[0] == [(0, "10.138.0.27", 4)]
    two = b"x\n" + body + b"\ny\n" + body
    assert ray_task_scopes(two)[0] == [(1, "10.138.0.27", 4), (6, "10.138.0.27", 10)]
    # The driver's own error after the traceback is not the Ray node's.
    later = body + b"\n" + b"step 1 done\n" * 3 + b"torch.OutOfMemoryError: CUDA out of memory.\n"
    diagnosis = diagnose([LogSource.from_text("driver.log", later.decode())])
    assert diagnosis.category.value == "CUDAOutOfMemory"
    assert [e.host for e in diagnosis.evidence if e.signature == "cuda-oom"] == [None]


def test_after_a_ray_traceback_the_shell_prompt_in_force_places_the_lines_again() -> None:
    """A driver run from a shell prompt on one node: the Ray task's traceback is the task's
    node's, and the lines after it are the prompt's node's again (the last prompt before the
    traceback's end, not the first one of the block)."""
    body = (
        b"alice@login-1:~$ ssh gpu-07\n"
        b"alice@gpu-07:~$ python driver.py\n"
        b"ray::train() (pid=838798, ip=10.0.0.9, actor_id=f5aa8b4a)\n"
        b'  File "/job/train.py", line 4, in train\n'
        b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
        b"\n"
        b"torch.OutOfMemoryError: CUDA out of memory.\n"
    )
    diagnosis = diagnose([LogSource.from_text("driver.log", body.decode())])
    hosts = {e.category.value: e.host for e in diagnosis.evidence}
    assert hosts["CUDAOutOfMemory"] == "gpu-07"
    assert hosts["CUDAError"] == "10.0.0.9"


def test_ray_tracebacks_printed_back_to_back_do_not_overlap() -> None:
    """One header's traceback ends where the next header begins: a long second traceback keeps
    its own node past the point where the first one's line cap would fall."""
    frames = b'  File "/verl/workers/fsdp_workers.py", line 446, in generate_sequences\n'
    body = (
        b"ray::Actor.step() (pid=1, ip=10.0.0.1)\n"
        + frames * 100
        + b"ray::Actor.step() (pid=2, ip=10.0.0.2)\n"
        + frames * 150
        + b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    assert [(start, node, end) for start, node, end in ray_task_scopes(body)[0]] == [
        (0, "10.0.0.1", 101),
        (101, "10.0.0.2", 254),
    ]
    diagnosis = diagnose([LogSource.from_text("driver.log", body.decode())])
    assert diagnosis.root_cause_host == "10.0.0.2"


def test_a_ray_traceback_cut_by_a_block_boundary_keeps_its_node() -> None:
    """A log is read in blocks of 1 MiB: a Ray task's traceback that the boundary cuts still
    raised its error on the header's node, and lines after its blank line are the file's."""
    header = b"ray::Actor.step() (pid=7, ip=10.0.0.7)\n"
    frames = b'  File "/verl/workers/fsdp_workers.py", line 446, in generate_sequences\n' * 3
    error = b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
    blocks = [b"step 1 done\n" + header + frames, frames + error]
    source = LogSource(name="driver.log", open_blocks=lambda: iter(blocks))
    diagnosis = diagnose([source])
    assert diagnosis.category.value == "CUDAError"
    assert diagnosis.root_cause_host == "10.0.0.7"
    assert ray_task_scopes(blocks[0]) == ([(1, "10.0.0.7", 6)], ("10.0.0.7", 196))
    assert ray_task_scopes(blocks[1], ("10.0.0.7", 196), headers=False) == (
        [(0, "10.0.0.7", 5)],
        ("10.0.0.7", 192),
    )
    # The traceback ended with its blank line: the next block's error is not the node's.
    ended = [header + frames + b"\n", b"step 2 done\n" + error]
    source = LogSource(name="driver.log", open_blocks=lambda: iter(ended))
    diagnosis = diagnose([source])
    assert [e.host for e in diagnosis.evidence if e.signature == "cuda-illegal-access"] == [None]


@pytest.mark.parametrize(
    ("name", "line"),
    [
        (
            "job.err",
            "[rank" + "9" * 5000 + "]: RuntimeError: CUDA error: unspecified launch failure",
        ),
        ("job.err", "Watchdog caught collective operation timeout on rank " + "9" * 5000),
        ("kern.log", "NVRM: Xid (PCI:0000:3b:00): " + "9" * 5000 + ", pid=1, name=python"),
        (
            "rank-" + "9" * 5000 + ".node002.err",
            "RuntimeError: CUDA error: unspecified launch failure",
        ),
    ],
)
def test_a_run_of_digits_too_long_for_a_number_places_nothing(name: str, line: str) -> None:
    """A log is untrusted input: a 'rank' or Xid code thousands of digits long is no rank or
    code (int() itself refuses it), and the diagnosis goes on without it, never a traceback."""
    found = diagnose([LogSource.from_lines(name, [line])])
    assert "9" * 10 not in (found.root_cause_host or "")
    assert parse_xid_line(line) is None
