"""A simulated pre-training job: ``python -m trainmedic.sim.job --job-dir DIR ...``.

It does what a Megatron/torchrun job does on the outside: per-rank stdout/stderr, a heartbeat,
periodic checkpoints with a manifest, a loss curve, and it dies the way real jobs die when a
node's hardware fails (the broken rank reports a CUDA error, every other rank an NCCL watchdog
timeout), when a bad data batch sends the loss off, or it hangs without a word.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TextIO

from trainmedic.adapters.checkpoints import MANIFEST, checkpoint_dirname, sha256_file, verify
from trainmedic.core.files import read_json, write_json_atomic
from trainmedic.core.models import JobSpec
from trainmedic.core.settings import get_settings
from trainmedic.sim.faults import GPU_FAULTS, NodeFault
from trainmedic.sim.hardware import node_status

SHARD_BYTES = 64 * 1024
NCCL_TIMEOUT_MS = 600_000


# A thermally throttled or slow GPU makes every collective wait for it.
SLOW_FACTOR = 4


def loss_at(batch: int, poisoned_from: int | None) -> float:
    """The trainer's loss at ``batch``; from a poisoned batch on, diverged."""
    rng = random.Random(batch)  # noqa: S311 - a reproducible loss curve, not a secret
    loss = 2.1 + 6.0 * math.exp(-batch / 80.0) + rng.uniform(-0.04, 0.04)
    if poisoned_from is not None and batch >= poisoned_from:
        # Diverged: the loss jumps and never comes back, as in the study's spikes.
        loss += 7.5 + 0.02 * (batch - poisoned_from)
    return loss


def now() -> datetime:
    return datetime.now(UTC)


def stamp(at: datetime | None = None) -> str:
    return (at or now()).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.job_dir = Path(args.job_dir)
        self.spec = JobSpec.model_validate_json((self.job_dir / "spec.json").read_text())
        self.ckpt_dir = Path(args.checkpoint_dir)
        self.nodes = [n for n in args.nodes.split(",") if n]
        self.nodes_dir = Path(args.nodes_dir) if args.nodes_dir else None
        self.data_faults = Path(args.data_faults) if args.data_faults else None
        self.step_seconds = get_settings().sim_step_seconds
        self.log_dir = self.job_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        g = self.spec.gpus_per_node
        self.ranks = [(r, self.nodes[r // g], r % g) for r in range(len(self.nodes) * g)]
        self._out: dict[int, TextIO] = {}
        self._err: dict[int, TextIO] = {}
        self.seq = 0

    # ------------------------------------------------------------------ files

    def out(self, rank: int) -> TextIO:
        if rank not in self._out:
            host = self.ranks[rank][1]
            self._out[rank] = (self.log_dir / f"rank-{rank:05d}.{host}.out").open("a", buffering=1)
        return self._out[rank]

    def err(self, rank: int) -> TextIO:
        if rank not in self._err:
            host = self.ranks[rank][1]
            self._err[rank] = (self.log_dir / f"rank-{rank:05d}.{host}.err").open("a", buffering=1)
        return self._err[rank]

    def heartbeat(self, step: int, batch: int, loss: float) -> None:
        write_json_atomic(
            self.job_dir / "heartbeat",
            {"step": step, "batch": batch, "loss": loss, "time": time.time(), "pid": os.getpid()},
        )

    def mark_gpus_busy(self) -> None:
        # What DCGM sees as utilisation: the simulated exporter reads this marker.
        if self.nodes_dir is None:
            return
        for node in self.nodes:
            with contextlib.suppress(OSError):
                (self.nodes_dir / node / "gpu_busy").touch()

    def finish(self, state: str, exit_code: int | None, reason: str = "") -> int:
        for handle in [*self._out.values(), *self._err.values()]:
            handle.close()
        write_json_atomic(
            self.job_dir / "exit.json",
            {"state": state, "exit_code": exit_code, "reason": reason, "time": time.time()},
        )
        return exit_code if exit_code is not None else 1

    # ------------------------------------------------------------------ physics

    def node_faults(self) -> dict[str, NodeFault]:
        if self.nodes_dir is None:
            return {}
        return {n: node_status(self.nodes_dir / n).fault for n in self.nodes}

    def job_fault(self) -> dict[str, object]:
        return read_json(self.job_dir / "fault.json", {}) or {}

    def data_fault(self) -> dict[str, object]:
        return (read_json(self.data_faults, {}) or {}) if self.data_faults else {}

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        world = len(self.ranks)
        for rank, host, local in self.ranks:
            self.out(rank).write(
                f"[{stamp()}] [rank{rank}] host={host} local_rank={local} world_size={world} "
                f"num_workers={self.spec.num_workers} gc_interval={self.spec.gc_interval}\n"
                f"{host}:{os.getpid()}:{os.getpid()} [{local}] NCCL INFO Bootstrap : Using ib0\n"
            )
        start_step, batch = 0, 0
        if self.spec.resume_from_step is not None:
            loaded = self.load(self.spec.resume_from_step)
            if loaded is None:
                return self.finish("FAILED", 1, "checkpoint load failed")
            start_step, batch = loaded
        skip = self.spec.skip_batches
        poisoned_from: int | None = None
        for step in range(start_step + 1, self.spec.steps + 1):
            # Read every step: a bad batch injected into a running job takes effect.
            spike = self.data_fault()
            batch += 1
            if skip and skip[0] <= batch <= skip[1]:
                self.out(0).write(
                    f"[{stamp()}] skipping data batches {skip[0]}-{skip[1]} "
                    "(requested at resubmission)\n"
                )
                batch = skip[1] + 1
            if spike.get("kind") in ("spike", "nan") and batch == int(spike["batch"]):  # type: ignore[arg-type]
                poisoned_from = batch
            faults = self.node_faults()
            outcome = self.check_faults(faults, step)
            if outcome is not None:
                return outcome
            slow = any(f in (NodeFault.slow, NodeFault.overheat) for f in faults.values())
            step_started = time.monotonic()
            time.sleep(self.step_seconds * (SLOW_FACTOR if slow else 1))
            step_ms = 1000 * (time.monotonic() - step_started)
            loss = loss_at(batch, poisoned_from)
            nan = spike.get("kind") == "nan" and poisoned_from is not None
            shown = "nan" if nan else f"{loss:.6E}"
            grad = (
                "nan" if nan else f"{(0.8 if poisoned_from is None else 40.0 * (1 + step % 7)):.3f}"
            )
            self.out(0).write(
                f"[{stamp()}] iteration {step:8d}/{self.spec.steps:8d} | consumed samples: "
                f"{batch * 32:10d} | lm loss: {shown} | grad norm: {grad} | "
                f"elapsed time per iteration (ms): {step_ms:.1f}\n"
            )
            with (self.job_dir / "loss.csv").open("a") as handle:
                handle.write(f"{step},{batch},{'nan' if nan else round(loss, 6)}\n")
            self.heartbeat(step, batch, loss)
            if step % 10 == 1:
                self.mark_gpus_busy()
            requested = self.job_dir / "save_request"
            if (
                requested.exists()
                or step % self.spec.checkpoint_every == 0
                or (step == self.spec.steps)
            ):
                if self.save(step, batch, loss, faults) is not None:
                    return self.finish("FAILED", 1, "node failed while saving")
                if requested.exists():
                    requested.unlink()
                    self.out(0).write(f"[{stamp()}] saved checkpoint on request (SIGUSR1)\n")
        self.out(0).write(f"[{stamp()}] training finished at iteration {self.spec.steps}\n")
        return self.finish("COMPLETED", 0)

    def check_faults(self, faults: dict[str, NodeFault], step: int) -> int | None:
        job_fault = self.job_fault()
        kind = job_fault.get("kind")
        if kind == "hang":
            # Silent hang: no log line, no heartbeat, the process stays alive.
            while True:
                time.sleep(3600)
        if kind == "script":
            self.traceback(
                0,
                'File "/opt/train/pretrain.py", line 288, in get_batch',
                "    tokens = data['text_tokens']",
                "KeyError: 'text_tokens'",
            )
            return self.finish("FAILED", 1, "script error")
        if kind == "dataloader":
            self.err(0).write(
                "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed. \n"
            )
            return self.finish("FAILED", 1, "dataloader worker killed")
        if kind == "oom":
            return self.finish("FAILED", 137, "OOM killed (host)")
        broken = {n: f for n, f in faults.items() if f in GPU_FAULTS}
        down = [n for n, f in faults.items() if f is NodeFault.down]
        cut_off = [n for n, f in faults.items() if f is NodeFault.link]
        if cut_off and not broken and not down and len(self.nodes) > 1:
            # A lost fabric link: every rank's next collective times out, and no rank can
            # say whose link it was (no Xid, no failed rank named).
            failed_at = now()
            for rank, _host, _local in self.ranks:
                self.nccl_timeout(rank, step, failed_at + timedelta(milliseconds=NCCL_TIMEOUT_MS))
            return self.finish("FAILED", 1, "NCCL watchdog timeout")
        if not broken and not down:
            return None
        failed_at = now()
        for rank, host, local in self.ranks:
            fault = broken.get(host)
            if host in down:
                continue  # a dead node writes nothing at all
            gpu = node_status(self.nodes_dir / host).gpu if self.nodes_dir and fault else -1
            if fault is not None and local == gpu:
                self.hardware_error(rank, host, local, fault, failed_at)
            else:
                self.nccl_timeout(rank, step, failed_at + timedelta(milliseconds=NCCL_TIMEOUT_MS))
        culprit = next(iter(broken or dict.fromkeys(down)))
        culprit_gpu = node_status(self.nodes_dir / culprit).gpu if self.nodes_dir else 0
        reporter = next((r for r, h, _ in self.ranks if h not in down), None)
        if reporter is not None and not down:
            # torchrun names the failed rank only when its agent lived to see it fail.
            self.elastic_summary(reporter, culprit, culprit_gpu, failed_at)
        if down:
            if reporter is not None:
                # What slurmstepd writes into the job's output when a node of the job dies.
                self.err(reporter).write(
                    f"slurmstepd: error: *** STEP {self.job_dir.name}.0 ON "
                    f"{self.ranks[reporter][1]} CANCELLED AT {failed_at:%Y-%m-%dT%H:%M:%S} DUE "
                    "TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n"
                )
            return self.finish("NODE_FAIL", None, f"Node {down[0]} not responding")
        return self.finish("FAILED", 1, f"rank on {culprit} failed")

    def traceback(self, rank: int, *lines: str) -> None:
        err = self.err(rank)
        err.write(f"[rank{rank}]: Traceback (most recent call last):\n")
        err.write(f'[rank{rank}]:   File "/opt/train/pretrain.py", line 412, in <module>\n')
        for line in lines:
            indent = "  " if line.startswith("File ") else ""
            err.write(f"[rank{rank}]: {indent}{line}\n")

    def hardware_error(
        self, rank: int, host: str, local: int, fault: NodeFault, at: datetime
    ) -> None:
        pid = os.getpid()
        if fault is NodeFault.nvlink:
            self.err(rank).write(
                f"{host}:{pid}:{pid} [{local}] transport/p2p.cc:275 NCCL WARN Cuda failure "
                "'an illegal memory access was encountered'\n"
            )
            self.traceback(
                rank,
                'File "/opt/train/pretrain.py", line 530, in train_step',
                "    torch.distributed.all_reduce(grads)",
                "torch.distributed.DistBackendError: NCCL error in: "
                "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
                "unhandled cuda error",
            )
            return
        message = {
            NodeFault.xid79: "CUDA error: unspecified launch failure",
            NodeFault.ecc: "CUDA error: uncorrectable ECC error encountered",
            NodeFault.rowremap: "CUDA error: uncorrectable ECC error encountered",
        }[fault]
        self.traceback(
            rank,
            'File "/opt/train/pretrain.py", line 530, in train_step',
            "    loss.backward()",
            f"RuntimeError: {message}",
            "CUDA kernel errors might be asynchronously reported at some other API "
            "call, so the stacktrace below might be incorrect.",
        )

    def nccl_timeout(self, rank: int, step: int, at: datetime) -> None:
        seq = 40 * step + 7
        self.err(rank).write(
            f"[rank{rank}]:[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=4194304, "
            f"NumelOut=4194304, Timeout(ms)={NCCL_TIMEOUT_MS}) ran for {NCCL_TIMEOUT_MS + 17} "
            "milliseconds before timing out.\n"
            f"[rank{rank}]:[E ProcessGroupNCCL.cpp:1182] [Rank {rank}] NCCL watchdog thread "
            "terminated with exception: Watchdog caught collective operation timeout\n"
        )

    def elastic_summary(self, reporter: int, host: str, gpu: int, at: datetime) -> None:
        # torchrun's agent on a surviving node reports the first failure it observed.
        rank = next((r for r, h, local in self.ranks if h == host and local == gpu), 0)
        self.err(reporter).write(
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "============================================================\n"
            "pretrain.py FAILED\n"
            "------------------------------------------------------------\n"
            "Root Cause (first observed failure):\n"
            f"[0]:\n  time      : {at.strftime('%Y-%m-%d_%H:%M:%S')}\n  host      : {host}\n"
            f"  rank      : {rank} (local_rank: {gpu})\n  exitcode  : 1 (pid: {os.getpid()})\n"
        )

    # ------------------------------------------------------------------ checkpoints

    def save(self, step: int, batch: int, loss: float, faults: dict[str, NodeFault]) -> int | None:
        target = self.ckpt_dir / checkpoint_dirname(step)
        target.mkdir(parents=True, exist_ok=True)
        files = {}
        for shard in ("model_optim_rng.pt", "data_state.pt"):
            payload = hashlib.sha256(f"{self.spec.name}:{step}:{shard}".encode()).digest()
            data = (payload * (SHARD_BYTES // len(payload) + 1))[:SHARD_BYTES]
            (target / shard).write_bytes(data)
            files[shard] = sha256_file(target / shard)
        if self.job_fault().get("kind") == "die_while_saving":
            return 1  # the manifest, written last, never lands: a partial checkpoint
        (target / MANIFEST).write_text(
            json.dumps(
                {
                    "step": step,
                    "batch": batch,
                    "loss": loss,
                    "files": files,
                    "sizes": {name: (target / name).stat().st_size for name in files},
                    "run": self.spec.run_id,
                    "saved_at": time.time(),
                },
                indent=1,
            )
        )
        (self.ckpt_dir / "latest_checkpointed_iteration.txt").write_text(f"{step}\n")
        self.out(0).write(f"[{stamp()}] saved checkpoint at iteration {step:8d} to {target}\n")
        return None

    def load(self, step: int) -> tuple[int, int] | None:
        checkpoint = verify(self.ckpt_dir / checkpoint_dirname(step))
        if not checkpoint.valid:
            self.traceback(
                0,
                'File "/opt/train/checkpointing.py", line 311, in load_checkpoint',
                "RuntimeError: PytorchStreamReader failed reading zip archive: "
                f"failed finding central directory ({checkpoint.problem})",
            )
            return None
        self.out(0).write(
            f"[{stamp()}] loading checkpoint from {checkpoint.path} at iteration {step}\n"
        )
        return step, checkpoint.batch if checkpoint.batch is not None else step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainmedic.sim.job")
    parser.add_argument("--job-dir", required=True)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--nodes", required=True)
    parser.add_argument("--nodes-dir", help="simulated nodes' state (fault injection)")
    parser.add_argument("--data-faults", help="bad data batches of this training run")
    args = parser.parse_args(argv)
    trainer = Trainer(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(trainer.finish("CANCELLED", 143, "SIGTERM")))
    # SIGUSR1 = "save a checkpoint now", as Megatron/NeMo handle Slurm's pre-emption signal.
    signal.signal(signal.SIGUSR1, lambda *_: (trainer.job_dir / "save_request").touch())
    return trainer.run()


if __name__ == "__main__":
    sys.exit(main())
