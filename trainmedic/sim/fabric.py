"""The simulated fabric's allgather test: ``python -m trainmedic.sim.fabric --node-dir DIR
all_gather_perf ARGS...``, nccl-tests' ``all_gather_perf`` across ``--hosts a,b[,c]``.

It behaves as the real test does for the group's faults: a dead link fails with NCCL's IB
errors, a broken GPU with its CUDA error, a slow or hot node completes at a fraction of the
bus bandwidth, and a peer that is gone hangs the bootstrap until the test is killed.

Only the standard library, by design: a real test runs on the nodes, this one on the
controller's CPUs, once per pair test (132 processes for a locate over 256 nodes). With the
pydantic models and settings imported, each cost ~0.3 s of CPU, more than the Ansible
orchestration the locate benchmark measures; now ~0.03 s. Its timing (how long a test takes,
how long a hung one hangs) is the simulated hardware's, fixed in ``cluster.json`` when the
cluster is made (:meth:`trainmedic.sim.cluster.SimCluster.create`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from trainmedic.sim.faults import GPU_FAULTS, NodeFault, read_fault

GPU_NAME = "NVIDIA H100 80GB HBM3"
HEALTHY_BUSBW_GBPS = 46.0
SLOW_FACTOR = 0.12
OVERHEAT_FACTOR = 0.7
CLUSTER = "cluster.json"
# What a fault makes the test print on the broken rank (CUDA's error string).
GPU_ERRORS = {
    NodeFault.xid79: "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    NodeFault.ecc: "uncorrectable ECC error encountered",
    NodeFault.rowremap: "uncorrectable ECC error encountered",
    NodeFault.nvlink: "an illegal memory access was encountered",
}


def fabric_timing(home: Path) -> tuple[float, float]:
    """(seconds a test takes, seconds a hung test hangs) of the cluster under ``home``: as
    recorded when it was made, or the settings' for a cluster made before they were."""
    try:
        info = json.loads((home / CLUSTER).read_text())
        return float(info["test_seconds"]), float(info["hang_seconds"])
    except (OSError, ValueError, KeyError):
        from trainmedic.core.settings import get_settings

        settings = get_settings()
        return settings.sim_test_seconds, settings.sim_hang_seconds


def _jitter(seed: str, spread: float = 0.03) -> float:
    digest = hashlib.sha256(seed.encode()).digest()
    return 1.0 + spread * ((digest[0] / 255.0) * 2 - 1)


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def all_gather_perf(node_dir: Path, argv: list[str]) -> int:
    """nccl-tests ``all_gather_perf`` across ``--hosts a,b``; run on the first host."""
    parser = argparse.ArgumentParser(prog="all_gather_perf")
    parser.add_argument("-b", "--minbytes", default="1G")
    parser.add_argument("-e", "--maxbytes", default="1G")
    parser.add_argument("-f", "--stepfactor", default="2")
    parser.add_argument("-g", "--ngpus", type=int, default=1)
    parser.add_argument("--hosts", required=True)
    args, _ = parser.parse_known_args(argv)
    hosts = [h for h in args.hosts.split(",") if h]
    faults = {host: read_fault(node_dir.parent / host) for host in hosts}
    seconds, hang_seconds = fabric_timing(node_dir.parent.parent)
    size = _parse_size(args.maxbytes)
    nranks = len(hosts) * args.ngpus

    print(
        f"# nThread 1 nGpus {args.ngpus} minBytes {size} maxBytes {size} step: 2(factor) "
        "warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n# Using devices"
    )
    for rank, host in enumerate(hosts):
        if faults[host] is not NodeFault.down:
            print(
                f"#  Rank {rank:2d} Group  0 Pid {os.getpid():6d} on {host:>10} device  0 "
                f"[0x1b] {GPU_NAME}"
            )
    sys.stdout.flush()

    if NodeFault.down in faults.values():
        # Bootstrap never completes with a peer that is gone: the real test hangs here.
        time.sleep(hang_seconds)
        return 1
    broken = [h for h in hosts if faults[h] in GPU_FAULTS]
    time.sleep(seconds)
    cut_off = [h for h in hosts if faults[h] is NodeFault.link]
    if cut_off and not broken:
        for host in cut_off:
            # What NCCL's IB transport reports once its retries to a dead port run out.
            print(
                f"{host}: NCCL WARN NET/IB : Got completion from peer with error 12, "
                "opcode 0, len 0, vendor err 129 (Recv)\n"
                f"{host}: Test NCCL failure common.cu:1279 'remote process exited or "
                "there was a network error'"
            )
        return 1
    if broken:
        for host in broken:
            print(
                f"{host}: Test NCCL failure common.cu:1279 '{GPU_ERRORS[faults[host]]}'\n"
                f" .. {host} pid {os.getpid()}: Test failure common.cu:1100"
            )
        return 1

    factor = 1.0
    for fault in faults.values():
        if fault is NodeFault.slow:
            factor = min(factor, SLOW_FACTOR)
        elif fault is NodeFault.overheat:
            factor = min(factor, OVERHEAT_FACTOR)
    busbw = HEALTHY_BUSBW_GBPS * factor * _jitter(",".join(sorted(hosts)))
    algbw = busbw * nranks / max(nranks - 1, 1)
    time_us = size / (algbw * 1e3)
    print("#")
    print(
        "#                                                              out-of-place"
        "                       in-place"
    )
    print(
        "#       size         count      type   redop    root     time   algbw   busbw"
        " #wrong     time   algbw   busbw #wrong"
    )
    print(
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
        "            (us)  (GB/s)  (GB/s)"
    )
    print(
        f"{size:>12d}  {size // 4 // nranks:>12d}     float    none      -1 {time_us:8.1f} "
        f"{algbw:7.2f} {busbw:7.2f}      0 {time_us:8.1f} {algbw:7.2f} {busbw:7.2f}      0"
    )
    print("# Out of bounds values : 0 OK")
    print(f"# Avg bus bandwidth    : {busbw:.4f}")
    print("#")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] != "--node-dir" or argv[2] != "all_gather_perf":
        print(
            "usage: python -m trainmedic.sim.fabric --node-dir DIR all_gather_perf [ARGS...]",
            file=sys.stderr,
        )
        return 2
    return all_gather_perf(Path(argv[1]), argv[3:])


if __name__ == "__main__":
    sys.exit(main())
