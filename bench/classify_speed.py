"""Speed and memory of ``diagnose_paths`` on a big multi-rank log vs ``grep -c -E``.

    python bench/classify_speed.py [--size-mib 1024] [--ranks 8] [--keep DIR]

Generates mostly-normal Megatron-style per-rank logs (one node loses a GPU near the end,
the other ranks log collective timeouts), then times, in the same run, grep over all
signature regexes (converted to ERE) and the classifier in a subprocess (peak RSS from
wait4). The target is classifier time <= 2x grep time and RSS < 200 MiB.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainmedic.diagnosis import load_catalogue  # noqa: E402

LINES_PER_BATCH = 4096


def training_line(rank: int, step: int, rng: random.Random) -> str:
    loss = 2.0 + 8.0 / (1 + step / 2000) + rng.random() * 0.05
    return (
        f"[rank{rank}]:[2026-12-02 14:{(step // 60) % 60:02d}:{step % 60:02d}] iteration "
        f"{step}/400000 | consumed samples: {step * 512} | lm loss: {loss:.6E} | "
        f"learning rate: 3.000E-05 | grad norm: {rng.random() + 0.5:.3f} | "
        f"elapsed time per iteration (ms): {800 + rng.random() * 30:.1f}\n"
    )


def generate(directory: Path, size_mib: int, ranks: int) -> list[Path]:
    rng = random.Random(7)
    per_rank = size_mib * (1 << 20) // ranks
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


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    start = time.perf_counter()
    with subprocess.Popen(command, stdout=subprocess.PIPE, env=env) as process:
        assert process.stdout is not None
        output = process.stdout.read().decode()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - start
    if process.returncode not in (0, 1):
        raise SystemExit(f"{command[0]} failed with {process.returncode}")
    return elapsed, usage.ru_maxrss * 1024, output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--keep", type=Path, help="generate into / reuse this directory")
    args = parser.parse_args()

    directory = args.keep or Path(tempfile.mkdtemp(prefix="trainmedic-speed-"))
    directory.mkdir(parents=True, exist_ok=True)
    try:
        paths = sorted(directory.glob("*.out")) + sorted(directory.glob("*-dmesg.log"))
        if not paths:
            start = time.perf_counter()
            paths = generate(directory, args.size_mib, args.ranks)
            print(f"generated {len(paths)} files in {time.perf_counter() - start:.1f} s")
        total = sum(p.stat().st_size for p in paths)
        print(f"log size: {total / (1 << 20):.0f} MiB in {len(paths)} files")
        files = [str(p) for p in paths]
        ere = "|".join(f"({s.grep_pattern})" for s in load_catalogue().signatures)
        # Warm the page cache so neither side pays for the disk.
        subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)

        grep_s, _, _ = timed(["grep", "-c", "-E", ere, *files])
        grep_c_s, _, _ = timed(["grep", "-c", "-E", ere, *files], env={**os.environ, "LC_ALL": "C"})
        code = (
            "import sys; from trainmedic.diagnosis import diagnose_paths; "
            "d = diagnose_paths(sys.argv[1:]); "
            "print(d.category.value, d.root_cause_host, d.confidence)"
        )
        ours_s, rss, output = timed([sys.executable, "-c", code, *files])
        locale = os.environ.get("LC_ALL") or os.environ.get("LANG") or "default"
        print(f"classifier result: {output.strip()}")
        print(f"grep -c -E ({locale}): {grep_s:8.2f} s")
        print(f"grep -c -E (LC_ALL=C):  {grep_c_s:8.2f} s")
        print(f"trainmedic classify:    {ours_s:8.2f} s   peak RSS {rss / (1 << 20):.0f} MiB")
        print(f"ratio vs grep ({locale}): {ours_s / grep_s:.2f}")
        print(f"ratio vs grep (LC_ALL=C): {ours_s / grep_c_s:.2f}")
    finally:
        if args.keep is None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
