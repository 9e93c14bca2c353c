"""The simulated scheduler: Slurm's semantics (allocate, drain with reason, exclude, NODE_FAIL)
over the simulated cluster, with jobs that are real processes running the simulated trainer.

State lives in ``<sim_home>/scheduler.json`` under a file lock, so the CLI, the intake and
every flow-run process see one scheduler.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainmedic.adapters.scheduler.base import Scheduler, with_run_id
from trainmedic.core import validate
from trainmedic.core.errors import InputError, JobNotFound, SchedulerError
from trainmedic.core.files import locked, read_json, write_json_atomic
from trainmedic.core.models import JobInfo, JobSpec, JobState, NodeInfo, NodePlace, NodeState
from trainmedic.sim.cluster import SimCluster
from trainmedic.sim.hardware import NodeFault

# A job without a partition or account gets these, as Slurm gives the default partition and
# the user's default account. One pool of nodes serves every partition a spec names.
DEFAULT_PARTITION = "gpu"
DEFAULT_ACCOUNT = "default"
JOB_FAULTS = ("hang", "script", "dataloader", "oom", "die_while_saving")
DATA_FAULTS = ("spike", "nan")


def check_reason(reason: str) -> str:
    if not reason.strip():
        raise InputError("reason", reason, "a drain or cancel needs a reason")
    return validate.safe_text(reason, "reason")


class SimScheduler(Scheduler):
    name = "sim"

    def __init__(self, sim_home: Path) -> None:
        self.home = Path(sim_home)
        self.cluster = SimCluster(self.home)
        self.state_path = self.home / "scheduler.json"
        self.lock_path = self.home / "scheduler.lock"
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # ------------------------------------------------------------------ state

    def _load(self) -> dict[str, Any]:
        if not self.cluster.exists:
            raise SchedulerError(
                f"no simulated cluster under {self.home}: run `trainmedic sim create` first"
            )
        state = read_json(self.state_path) or {"next_id": 1001, "jobs": {}, "drained": {}}
        return state

    def _save(self, state: dict[str, Any]) -> None:
        write_json_atomic(self.state_path, state)

    def _alive(self, pid: int) -> bool:
        child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"

    def _refresh(self, state: dict[str, Any]) -> None:
        for record in state["jobs"].values():
            if record["state"] != JobState.RUNNING:
                continue
            exit_info = read_json(Path(record["job_dir"]) / "exit.json")
            if exit_info is not None:
                record.update(
                    state=exit_info["state"],
                    exit_code=exit_info["exit_code"],
                    reason=exit_info.get("reason", ""),
                    ended_at=exit_info["time"],
                )
            elif not self._alive(record["pid"]):
                record.update(
                    state=JobState.FAILED,
                    exit_code=None,
                    ended_at=time.time(),
                    reason="job process vanished without an exit record",
                )
        for record in sorted(state["jobs"].values(), key=lambda r: int(r["job_id"])):
            if record["state"] == JobState.PENDING:
                self._try_start(state, record)

    def _busy_nodes(self, state: dict[str, Any]) -> set[str]:
        return {
            n for r in state["jobs"].values() if r["state"] == JobState.RUNNING for n in r["nodes"]
        }

    def _try_start(self, state: dict[str, Any], record: dict[str, Any]) -> None:
        spec = JobSpec.model_validate(record["spec"])
        unavailable = (
            self._busy_nodes(state)
            | set(state["drained"])
            | set(spec.exclude)
            | self._held_nodes(state)
        )
        free = [
            s.name
            for s in self.cluster.statuses()
            if s.name not in unavailable and s.fault is not NodeFault.down
        ]
        if len(free) < spec.nodes:
            record["reason"] = f"Resources: needs {spec.nodes} nodes, {len(free)} available"
            return
        nodes = free[: spec.nodes]
        job_dir = Path(record["job_dir"])
        job_dir.mkdir(parents=True, exist_ok=True)
        (job_dir / "spec.json").write_text(spec.model_dump_json(indent=1))
        argv = [
            sys.executable,
            "-m",
            "trainmedic.sim.job",
            "--job-dir",
            str(job_dir),
            "--checkpoint-dir",
            record["checkpoint_dir"],
            "--nodes",
            ",".join(nodes),
            "--nodes-dir",
            str(self.cluster.nodes_dir),
            "--data-faults",
            str(self.home / "data" / f"{spec.name}.json"),
        ]
        with (job_dir / "slurm.out").open("ab") as out:
            child = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        self._children[child.pid] = child
        record.update(
            state=JobState.RUNNING, nodes=nodes, pid=child.pid, reason="", started_at=time.time()
        )

    def _info(self, record: dict[str, Any]) -> JobInfo:
        job_dir = Path(record["job_dir"])
        ended = record.get("ended_at")
        return JobInfo(
            job_id=record["job_id"],
            name=record["spec"]["name"],
            state=JobState(record["state"]),
            nodes=tuple(record["nodes"]),
            exit_code=record.get("exit_code"),
            reason=record.get("reason", ""),
            log_dir=str(job_dir / "logs"),
            checkpoint_dir=record["checkpoint_dir"],
            heartbeat_path=str(job_dir / "heartbeat"),
            spec=JobSpec.model_validate(record["spec"]),
            submitted_at=datetime.fromtimestamp(record["submitted_at"], UTC),
            started_at=(
                datetime.fromtimestamp(record["started_at"], UTC)
                if record.get("started_at")
                else None
            ),
            ended_at=datetime.fromtimestamp(ended, UTC) if ended else None,
            resubmission_of=record.get("resubmission_of"),
            partition=record.get("partition", DEFAULT_PARTITION),
            account=record.get("account", DEFAULT_ACCOUNT),
            comment=record.get("comment", ""),
        )

    # ------------------------------------------------------------------ interface

    def submit(self, spec: JobSpec, *, resubmission_of: str | None = None) -> JobInfo:
        for node in spec.exclude:
            self.cluster.check_node(node, "exclude")
        with locked(self.lock_path):
            state = self._load()
            job_id = str(state["next_id"])
            state["next_id"] += 1
            checkpoint_dir = spec.checkpoint_dir or str(self.home / "checkpoints" / spec.name)
            spec = with_run_id(spec).model_copy(update={"checkpoint_dir": checkpoint_dir})
            record = {
                "job_id": job_id,
                "spec": spec.model_dump(mode="json"),
                "state": JobState.PENDING,
                "nodes": [],
                "pid": None,
                "exit_code": None,
                "reason": "",
                "job_dir": str(self.home / "jobs" / job_id),
                "checkpoint_dir": checkpoint_dir,
                "submitted_at": time.time(),
                "resubmission_of": resubmission_of,
                # Fixed at submission, as Slurm records them; older records read as defaults.
                "partition": spec.partition or DEFAULT_PARTITION,
                "account": spec.account or DEFAULT_ACCOUNT,
                "comment": spec.comment,
            }
            state["jobs"][job_id] = record
            self._refresh(state)
            self._save(state)
            return self._info(record)

    def job(self, job_id: str) -> JobInfo:
        job_id = validate.job_id(job_id)
        with locked(self.lock_path):
            state = self._load()
            self._refresh(state)
            self._save(state)
            if job_id not in state["jobs"]:
                raise JobNotFound(f"job_id={job_id!r}: no such job in the simulated scheduler")
            return self._info(state["jobs"][job_id])

    def jobs(self) -> list[JobInfo]:
        with locked(self.lock_path):
            state = self._load()
            self._refresh(state)
            self._save(state)
            records = sorted(state["jobs"].values(), key=lambda r: int(r["job_id"]))
            return [self._info(r) for r in records]

    def cancel_steps_on(self, job_id: str, node: str, reason: str) -> list[str]:
        """A simulated job is one process spanning its nodes (no steps to tell apart): what it
        runs on ``node`` stops only by stopping it, and only when ``node`` is one of its own."""
        try:
            info = self.job(job_id)
        except JobNotFound:  # gone, or never this scheduler's: nothing of it runs anywhere
            return []
        if info.state.finished or node not in info.nodes:
            return []
        return [info.job_id] if self.cancel(info.job_id, reason) else []

    def cancel(self, job_id: str, reason: str) -> bool:
        check_reason(reason)
        info = self.job(job_id)
        if info.state.finished:
            return False
        with locked(self.lock_path):
            state = self._load()
            record = state["jobs"][info.job_id]
            if record["state"] == JobState.PENDING:
                record.update(state=JobState.CANCELLED, reason=reason, ended_at=time.time())
                self._save(state)
                return True
            pid = record["pid"]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while self._alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        with locked(self.lock_path):
            state = self._load()
            record = state["jobs"][info.job_id]
            self._refresh(state)
            record.update(state=JobState.CANCELLED, reason=reason)
            record.setdefault("ended_at", time.time())
            self._save(state)
        return True

    def nodes(self) -> list[NodeInfo]:
        with locked(self.lock_path):
            state = self._load()
            self._refresh(state)
            busy = self._busy_nodes(state)
            result = []
            failed = set(state.get("failed", []))
            for status in self.cluster.statuses():
                base = "ALLOCATED" if status.name in busy else "IDLE"
                if status.name in state["drained"]:
                    node_state, reason = NodeState.DRAINED, state["drained"][status.name]
                    raw = f"{base}+DRAIN" + ("+FAIL" if status.name in failed else "")
                elif status.fault is NodeFault.down:
                    node_state, reason, raw = NodeState.DOWN, "Not responding", "DOWN*"
                elif status.name in busy:
                    node_state, reason, raw = NodeState.ALLOCATED, "", base
                else:
                    node_state, reason, raw = NodeState.IDLE, "", base
                result.append(
                    NodeInfo(name=status.name, state=node_state, reason=reason, raw_state=raw)
                )
            return result

    @staticmethod
    def _held_nodes(state: dict[str, Any]) -> set[str]:
        now = time.time()
        holds = state.get("holds", {})
        return {n for hold in holds.values() if hold["until"] > now for n in hold["nodes"]}

    def hold(self, name: str, nodes: list[str], duration_s: int) -> list[str]:
        """A reservation on the idle ones among ``nodes``: placement skips them until release
        or expiry, as Slurm skips a reservation's nodes for other users' jobs."""
        for node in nodes:
            self.cluster.check_node(node)
        with locked(self.lock_path):
            state = self._load()
            self._refresh(state)
            busy = self._busy_nodes(state)
            idle = [n for n in nodes if n not in busy and n not in state["drained"]]
            if idle:
                holds = state.setdefault("holds", {})
                holds[name] = {"nodes": idle, "until": time.time() + duration_s}
                self._save(state)
            return idle

    def release(self, name: str) -> bool:
        with locked(self.lock_path):
            state = self._load()
            if name not in state.get("holds", {}):
                return False
            del state["holds"][name]
            self._save(state)
            return True

    def topology(self) -> dict[str, NodePlace]:
        return self.cluster.topology()

    def drain(self, node: str, reason: str) -> bool:
        self.cluster.check_node(node)
        check_reason(reason)
        with locked(self.lock_path):
            state = self._load()
            if node in state["drained"]:
                return False
            state["drained"][node] = reason
            self._save(state)
            return True

    def resume(self, node: str) -> bool:
        self.cluster.check_node(node)
        with locked(self.lock_path):
            state = self._load()
            if node not in state["drained"]:
                return False
            del state["drained"][node]
            state["failed"] = [n for n in state.get("failed", []) if n != node]
            self._refresh(state)
            self._save(state)
            return True

    def request_checkpoint(self, job_id: str) -> bool:
        info = self.job(job_id)
        if info.state.finished:
            return False
        # The simulated trainer polls for this file each step, as a real one handles SIGUSR1.
        (Path(info.log_dir).parent / "save_request").touch()
        return True

    # ------------------------------------------------------------------ simulation only

    def admin_drain(self, node: str, reason: str, *, fail: bool = False) -> None:
        """What a site admin's ``scontrol update NodeName=.. State=DRAIN|FAIL Reason=..``
        does: drains the node, or drains it again with the admin's reason (not idempotent
        like :meth:`drain`, which never overwrites a drain)."""
        self.cluster.check_node(node)
        check_reason(reason)
        with locked(self.lock_path):
            state = self._load()
            state["drained"][node] = reason
            if fail:
                state["failed"] = sorted({*state.get("failed", []), node})
            self._save(state)

    def reset(self) -> None:
        """A new simulated cluster, a new scheduler: its running jobs are stopped and its jobs,
        checkpoints and data faults removed, so nothing of an earlier cluster (job ids start
        again at 1001) leaks into the new one."""
        if self.state_path.exists():
            for job in self.jobs():
                if not job.state.finished:
                    self.cancel(job.job_id, "simulated cluster recreated")
        for part in ("jobs", "checkpoints", "data"):
            shutil.rmtree(self.home / part, ignore_errors=True)
        self.state_path.unlink(missing_ok=True)

    def inject_job_fault(self, job_id: str, kind: str, *, batch: int | None = None) -> None:
        """Make a running job misbehave (hang, script bug...) or poison a data batch."""
        info = self.job(job_id)
        if kind in DATA_FAULTS:
            if batch is None or batch < 1:
                raise InputError("batch", batch, f"fault {kind!r} needs the data batch (>= 1)")
            write_json_atomic(
                self.home / "data" / f"{info.name}.json", {"kind": kind, "batch": batch}
            )
            return
        if kind not in JOB_FAULTS:
            raise InputError("fault", kind, f"one of {', '.join(JOB_FAULTS + DATA_FAULTS)}")
        write_json_atomic(Path(info.log_dir).parent / "fault.json", {"kind": kind})
