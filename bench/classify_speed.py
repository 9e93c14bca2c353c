"""Throughput of ``diagnose_paths`` on a quiet and a noisy multi-rank log vs ``grep -c -E``.

    python bench/classify_speed.py [--size-mib 512] [--ranks 8] [--repeats 3]
                                   [--noise 0.05] [--keep DIR]

Generates two sets of Megatron-style per-rank logs of the same size: a *quiet* one (progress
lines; one node loses a GPU near the end, the other ranks log collective timeouts) and a
*noisy* one, the same with a share of NCCL WARN lines (socket retries, proxy errors, IB
async events...) mixed in. For each it times, in the same run, ``LC_ALL=C grep -c -E`` over
all signature regexes (converted to ERE) and the classifier in a subprocess. Times are CPU
time (user + system), repeated: best and median are printed. The classifier's own CPU time
is measured inside the subprocess around ``diagnose_paths`` (interpreter start-up and
imports are printed apart); peak RSS comes from wait4.

Targets: the classifier within 2x of grep on both logs, noisy throughput >= 50% of quiet,
RSS < 200 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainmedic.diagnosis import site_catalogue  # noqa: E402

LINES_PER_BATCH = 4096
MIB = 1 << 20

CLASSIFY = """
import json, sys, time
t0 = time.process_time()
from trainmedic.diagnosis import diagnose_paths
t1 = time.process_time()
d = diagnose_paths(sys.argv[1:])
t2 = time.process_time()
print(json.dumps({"result": f"{d.category.value} {d.root_cause_host} {d.confidence}",
                  "import_s": t1 - t0, "classify_s": t2 - t1}))
"""


def training_line(rank: int, step: int, rng: random.Random) -> str:
    loss = 2.0 + 8.0 / (1 + step / 2000) + rng.random() * 0.05
    return (
        f"[rank{rank}]:[2026-12-02 14:{(step // 60) % 60:02d}:{step % 60:02d}] iteration "
        f"{step}/400000 | consumed samples: {step * 512} | lm loss: {loss:.6E} | "
        f"learning rate: 3.000E-05 | grad norm: {rng.random() + 0.5:.3f} | "
        f"elapsed time per iteration (ms): {800 + rng.random() * 30:.1f}\n"
    )


def nccl_warning(host: str, rank: int, rng: random.Random) -> str:
    """One NCCL WARN line of the kinds that flood a log while a fabric is flaky."""
    prefix = f"{host}:{4000 + rank}:{4100 + rng.randrange(64)} [{rank % 8}]"
    peer = f"10.0.{rng.randrange(4)}.{rng.randrange(256)}<{rng.randrange(30000, 60000)}>"
    kind = rng.randrange(6)
    if kind == 0:
        body = f"misc/socket.cc:{rng.randrange(400, 900)} NCCL WARN Call to connect returned "
        body += f"Connection refused, retrying (attempt {rng.randrange(1, 30)})"
    elif kind == 1:
        body = f"proxy.cc:{rng.randrange(1000, 1700)} NCCL WARN [Proxy Service {rank}] Failed "
        body += f"to execute operation Connect from rank {rng.randrange(64)}, retcode 3"
    elif kind == 2:
        body = f"transport/net_ib.cc:{rng.randrange(80, 200)} NCCL WARN NET/IB : Got async "
        body += f"event : GID table change on port {rng.randrange(1, 3)}"
    elif kind == 3:
        body = f"misc/socket.cc:{rng.randrange(40, 70)} NCCL WARN socketProgress: "
        body += f"Connection closed by remote peer {peer}"
    elif kind == 4:  # an address: this template is new on every line
        body = "transport/net_socket.cc:499 NCCL WARN NET/Socket : peer "
        body += f"{peer} message truncated : receiving 1048576 bytes instead of 32768. "
        body += "If you believe your socket network is in healthy state, there may be a "
        body += (
            f"mismatch in collective sizes or environment settings (opId=0x{rng.getrandbits(48):x})"
        )
    else:
        body = f"init.cc:{rng.randrange(1500, 1700)} NCCL WARN Could not find real path of "
        body += f"/sys/class/net/ib{rng.randrange(8)} (/sys/devices/pci0000:00/0000:00:01.0)"
    return f"{prefix} {body}\n"


def generate(directory: Path, size_mib: int, ranks: int, noise: float) -> list[Path]:
    rng = random.Random(7)
    per_rank = size_mib * MIB // ranks
    odds = noise / (1.0 - noise)  # a warning after this share of progress lines: `noise` of all
    faulty = ranks - 1
    paths = []
    for rank in range(ranks):
        host = f"node{rank:03d}"
        path = directory / f"rank-{rank:05d}.{host}.out"
        with path.open("w") as out:
            out.write(f"{host}:100:100 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.{rank}<0>\n")
            out.write(f"{host}:100:100 [0] NCCL INFO Channel 00/02 :    0   1\n")
            written, step = 0, 0
            while written < per_rank:
                batch = []
                for _ in range(LINES_PER_BATCH):
                    step += 1
                    if noise and rng.random() < odds:
                        batch.append(nccl_warning(host, rank, rng))
                    batch.append(training_line(rank, step, rng))
                    if step % 5000 == 0:
                        batch.append(
                            f"[rank{rank}]: saving checkpoint at iteration {step} to /ckpt\n"
                        )
                text = "".join(batch)
                out.write(text)
                written += len(text)
            if rank == faulty:
                out.write("RuntimeError: CUDA error: unspecified launch failure\n")
            else:
                out.write(
                    f"[rank{rank}]:[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught "
                    "collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, "
                    "Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n"
                )
        paths.append(path)
    dmesg = directory / f"node{faulty:03d}-dmesg.log"
    dmesg.write_text(
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=12345, name=python, GPU has fallen off the bus.\n"
    )
    paths.append(dmesg)
    return paths


def run_cpu(command: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """CPU seconds (user + system) of one subprocess, its peak RSS in bytes, its stdout."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, env=env) as process:
        assert process.stdout is not None
        output = process.stdout.read().decode()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in (0, 1):
        raise SystemExit(f"{command[0]} failed with {process.returncode}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, output


@dataclass
class Figures:
    mib: float
    grep: list[float]  # CPU seconds per run
    ours: list[float]  # the classifier's CPU seconds per run, inside its process
    total: list[float]  # the classifier's whole process, start-up included
    rss: int
    result: str
    import_s: float

    def rates(self, seconds: list[float]) -> tuple[float, float]:
        """MiB/s: best and median."""
        rates = [self.mib / s for s in seconds]
        return max(rates), statistics.median(rates)


def measure(files: list[str], ere: str, repeats: int, mib: float) -> Figures:
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)  # page cache
    grep_env = {**os.environ, "LC_ALL": "C"}
    grep = [run_cpu(["grep", "-c", "-E", ere, *files], env=grep_env)[0] for _ in range(repeats)]
    figures = Figures(mib, grep, [], [], 0, "", 0.0)
    for _ in range(repeats):
        cpu, peak, output = run_cpu([sys.executable, "-c", CLASSIFY, *files])
        report = json.loads(output)
        figures.ours.append(report["classify_s"])
        figures.total.append(cpu)
        figures.rss = max(figures.rss, peak)
        figures.result, figures.import_s = report["result"], report["import_s"]
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=512, help="size of each log set")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--noise", type=float, default=0.05, help="share of NCCL WARN lines")
    parser.add_argument("--keep", type=Path, help="generate into / reuse this directory")
    args = parser.parse_args()

    base = args.keep or Path(tempfile.mkdtemp(prefix="trainmedic-speed-"))
    ere = "|".join(f"({s.grep_pattern})" for s in site_catalogue().signatures)
    logs: dict[str, Figures] = {}
    try:
        for name, noise in (("quiet", 0.0), ("noisy", args.noise)):
            directory = base / f"{name}-{args.size_mib}m-{args.ranks}r-{noise:g}"
            directory.mkdir(parents=True, exist_ok=True)
            paths = sorted(directory.glob("*.out")) + sorted(directory.glob("*-dmesg.log"))
            if not paths:
                start = time.perf_counter()
                paths = generate(directory, args.size_mib, args.ranks, noise)
                print(
                    f"{name}: generated {len(paths)} files in {time.perf_counter() - start:.1f} s"
                )
            mib = sum(p.stat().st_size for p in paths) / MIB
            logs[name] = measure([str(p) for p in paths], ere, args.repeats, mib)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)

    print(f"CPU time, best / median of {args.repeats} runs; grep is LC_ALL=C grep -c -E")
    print(f"{'log':6s} {'MiB':>5s} {'ours MiB/s':>15s} {'grep MiB/s':>15s} {'ours/grep time':>15s}")
    for name, fig in logs.items():
        (best, median), (grep_best, grep_median) = fig.rates(fig.ours), fig.rates(fig.grep)
        print(
            f"{name:6s} {fig.mib:5.0f} {best:7.1f} /{median:6.1f} {grep_best:7.1f} /"
            f"{grep_median:6.1f} {grep_best / best:8.2f} /{grep_median / median:5.2f}"
        )
    for name, fig in logs.items():
        print(
            f"{name}: result {fig.result}; peak RSS {fig.rss / MIB:.0f} MiB; start-up and "
            f"imports {fig.import_s:.2f} s CPU; whole process {min(fig.total):.2f} s CPU (best)"
        )
    quiet, noisy = logs["quiet"].rates(logs["quiet"].ours), logs["noisy"].rates(logs["noisy"].ours)
    print(
        f"noisy/quiet throughput: {noisy[0] / quiet[0]:.2f} (best), {noisy[1] / quiet[1]:.2f} "
        f"(median); {args.noise:.0%} of the noisy log's lines are NCCL warnings"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
