"""The production scheduler: Slurm through its command-line tools.

Every call is ``subprocess.run`` with an argument list, a timeout and no shell; every value
that reaches an argument (job ids, node names, reasons) is validated first, so a hostile event
can at worst be rejected with :class:`InputError`. Tested against Slurm 22.05 (Debian 12):
``squeue --json`` there ignores its filters, so single-job lookups use ``scontrol show job -o``
and finished jobs the controller has purged come from accounting (``sacct`` through
slurmdbd, as most sites run it with ``JobCompType=jobcomp/none``); only where accounting is
off, from the job-completion log (``sacct -c``); where both are off, only live jobs are known.

Layout under ``root`` (must be on a filesystem the compute nodes share)::

    runs/<name>-<utc>-<hex>/    one directory per submission, made complete BEFORE sbatch
        spec.json  meta.json  job.sh  heartbeat  logs/slurm-<id>.out  logs/rank-*.out
    jobs/<job id> -> ../runs/<name>-<utc>-<hex>      the job dir, keyed by Slurm's id
    checkpoints/<spec.name>/    default checkpoint dir, shared by resubmissions

Why this is race-free: the id is only known once sbatch returns, so nothing the job needs is
keyed by it. The batch script has its run directory's absolute path baked in and finds spec
and meta there, already written. The ``jobs/<id>`` link is created twice, by the adapter as
soon as sbatch prints the id and by the script when it starts, each time by an atomic rename,
both pointing at the same target; whichever runs first wins nothing. Job ids are recycled (a
reinstalled controller starts at 1 again), so a link is never trusted on its own: the job's
``--comment trainmedic:<run>`` (its first word; the spec's own comment follows) names its run,
and a job whose comment names another run (or none: another user's job) is not the one the
link points at. Only a job-completion record, which has no comment, falls back to the link,
and only when that run was submitted right before Slurm's submit time.

The training command: by default the simulated trainer ``python -m trainmedic.sim.job``
with this interpreter; pass ``command=["srun", "python", "train.py"]`` (or set
``TRAINMEDIC_SLURM_COMMAND``) for a real one. The command runs in the job dir with
``TRAINMEDIC_JOB_ID``, ``TRAINMEDIC_JOB_DIR``, ``TRAINMEDIC_LOG_DIR``, ``TRAINMEDIC_SPEC``,
``TRAINMEDIC_CHECKPOINT_DIR``, ``TRAINMEDIC_HEARTBEAT`` and ``TRAINMEDIC_NODES``
(comma-separated hostnames) exported; its exit status is the job's.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import math
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from trainmedic.adapters.scheduler.base import Scheduler, with_run_id
from trainmedic.adapters.scheduler.slurm_parse import (
    ACCOUNTING_FIELDS,
    COMMENT_PREFIX,
    JOBCOMP_FIELDS,
    PARTITION_RE,
    RUN_RE,
    SlurmJob,
    node_list,
    parse_node_line,
    parse_sacct,
    parse_scontrol_job,
    parse_squeue_json,
    parse_topology,
    validate_reason,
)
from trainmedic.core import validate
from trainmedic.core.errors import ConfigError, InputError, JobNotFound, SchedulerError
from trainmedic.core.models import JobInfo, JobSpec, JobState, NodeInfo, NodePlace, NodeState
from trainmedic.core.settings import Settings

__all__ = ["SlurmScheduler"]


# What the submitter's environment hands a job: enough for a login-like shell, nothing of the
# controller's own configuration or secrets.
DEFAULT_EXPORT = tuple(str(Settings.model_fields["slurm_export"].default).split(","))
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HISTORY_DISABLED = {
    "accounting": "accounting storage is disabled",
    "jobcomp": "job completion is disabled",
}
log = logging.getLogger(__name__)
# Clock differences between the submitting host and slurmctld, and second-rounded times.
LINK_SLACK = timedelta(seconds=5)


class SlurmScheduler(Scheduler):
    """Slurm via sbatch/squeue/scontrol/scancel/sacct. See the module docstring for layout."""

    name = "slurm"

    def __init__(
        self,
        root: Path,
        *,
        partition: str | None = None,
        timeout_s: float = 30.0,
        command: Sequence[str] | None = None,
        python: str | None = None,
        gpus: bool = False,
        sbatch_args: Sequence[str] = (),
        slurm_conf: Path | None = None,
        history: timedelta = timedelta(days=7),
        export: Sequence[str] = DEFAULT_EXPORT,
    ) -> None:
        """
        root: shared state dir (job dirs, logs, default checkpoints).
        partition: ``--partition``; Slurm's default partition when None.
        timeout_s: wall-clock bound on every Slurm CLI call.
        command: training command argv; None runs the simulated trainer.
        python: interpreter for the simulated trainer (default: this one).
        gpus: request ``--gpus-per-node=<spec.gpus_per_node>`` (needs GRES configured).
        sbatch_args: site-specific extra sbatch arguments from trusted configuration.
        slurm_conf: exported as SLURM_CONF to every call; inherited from the environment if None.
        history: how far back :meth:`jobs` reads the job history.
        export: the only variables of the submitter's environment the job gets (sbatch
            ``--export``; Slurm's own SLURM_* always): never the controller's whole environment.
        """
        if partition is not None and not PARTITION_RE.match(partition):
            raise InputError("partition", partition, "letters, digits and _.- only")
        if not 0 < timeout_s <= 3600:
            raise ConfigError(f"slurm timeout_s={timeout_s!r}: want 0 < timeout_s <= 3600")
        if command is not None and (not command or not all(isinstance(c, str) for c in command)):
            raise ConfigError(f"slurm command={command!r}: want a non-empty list of strings")
        self.root = Path(root).absolute()
        self.partition = partition
        self.timeout_s = timeout_s
        self.command = tuple(command) if command is not None else None
        self.python = python or sys.executable
        self.gpus = gpus
        self.sbatch_args = tuple(sbatch_args)
        self.history = history
        self.slurm_conf = slurm_conf
        for name in export:
            if not _ENV_NAME_RE.match(name):
                raise ConfigError(f"slurm export={name!r}: want an environment variable name")
        self.export = tuple(export)
        # Which history sources Slurm said are disabled (asked once per adapter).
        self._history_off: dict[str, bool] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> SlurmScheduler:
        """The adapter as the installation's settings (``TRAINMEDIC_SLURM_*``) configure it.
        The training command is split shell-style once here and never run through a shell."""
        try:
            text = settings.slurm_command.strip()
            command = shlex.split(text) if text else None
        except ValueError as exc:
            raise ConfigError(f"TRAINMEDIC_SLURM_COMMAND: {exc}") from exc
        return cls(
            settings.slurm_root or settings.home / "slurm",
            partition=settings.slurm_partition or None,
            timeout_s=settings.slurm_timeout_s,
            command=command,
            gpus=settings.slurm_gpus,
            slurm_conf=settings.slurm_conf,
            export=[n.strip() for n in settings.slurm_export.split(",") if n.strip()],
        )

    # ------------------------------------------------------------------------ subprocess

    def _env(self) -> dict[str, str]:
        # Read at call time: sbatch hands this environment to the job (--export=ALL default).
        env = dict(os.environ)
        if self.slurm_conf is not None:
            env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    def _call(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        """Run a Slurm CLI; non-zero exit is returned, not raised (callers read stderr)."""
        try:
            return subprocess.run(
                args,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise SchedulerError(
                f"{shlex.join(args)}: no answer within {self.timeout_s:g}s"
            ) from exc
        except OSError as exc:  # FileNotFoundError: Slurm client tools not installed
            raise SchedulerError(f"{shlex.join(args)}: cannot run ({exc})") from exc

    def _check(self, args: list[str]) -> str:
        proc = self._call(args)
        if proc.returncode != 0:
            raise SchedulerError(self._failure(args, proc))
        return proc.stdout

    @staticmethod
    def _failure(args: list[str], proc: subprocess.CompletedProcess[str]) -> str:
        detail = (proc.stderr or proc.stdout or "").strip().replace("\n", " | ")[:500]
        return f"{shlex.join(args)}: exit {proc.returncode}: {detail or 'no output'}"

    # ------------------------------------------------------------------------ submission

    def _job_link(self, job_id: str) -> Path:
        return self.root / "jobs" / job_id

    def _checkpoint_dir(self, spec: JobSpec) -> Path:
        if spec.checkpoint_dir:
            path = Path(spec.checkpoint_dir)
            return path if path.is_absolute() else self.root / path
        return self.root / "checkpoints" / spec.name

    def _script(self, run_dir: Path, checkpoint_dir: Path, run_id: str) -> str:
        q = shlex.quote
        link_dir = self.root / "jobs"
        target = Path("..") / "runs" / run_dir.name
        if self.command is None:
            argv = [self.python, "-m", "trainmedic.sim.job", "--job-dir", '"$TRAINMEDIC_JOB_DIR"',
                    "--checkpoint-dir", '"$TRAINMEDIC_CHECKPOINT_DIR"', "--nodes",
                    '"$TRAINMEDIC_NODES"']  # fmt: skip
            command = " ".join(a if a.startswith('"$') else q(a) for a in argv)
            # The trainer is this package: make it importable even when not pip-installed.
            pythonpath = str(Path(__file__).resolve().parents[3])
            prelude = f'export PYTHONPATH={q(pythonpath)}"${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        else:
            command = shlex.join(self.command)
            prelude = ""
        return f"""#!/bin/bash
# Generated by trainmedic (SlurmScheduler.submit). Values are baked in, shell-quoted.
set -euo pipefail
run_dir={q(str(run_dir))}
# Make jobs/<id> point here (atomic rename; the submitter does the same, same target).
tmp_link={q(str(link_dir))}/.link-"$SLURM_JOB_ID".$$
ln -sfn {q(str(target))} "$tmp_link"
mv -Tf "$tmp_link" {q(str(link_dir))}/"$SLURM_JOB_ID"
export TRAINMEDIC_JOB_ID="$SLURM_JOB_ID"
export TRAINMEDIC_JOB_DIR="$run_dir"
export TRAINMEDIC_LOG_DIR="$run_dir/logs"
export TRAINMEDIC_SPEC="$run_dir/spec.json"
export TRAINMEDIC_HEARTBEAT="$run_dir/heartbeat"
export TRAINMEDIC_CHECKPOINT_DIR={q(str(checkpoint_dir))}
# The training run's identity: a checkpoint hook writes it into each manifest.
export TRAINMEDIC_RUN_ID={q(run_id)}
TRAINMEDIC_NODES=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)
export TRAINMEDIC_NODES
mkdir -p "$TRAINMEDIC_LOG_DIR" "$TRAINMEDIC_CHECKPOINT_DIR"
cd "$run_dir"
{prelude}exec {command}
"""

    def submit(self, spec: JobSpec, *, resubmission_of: str | None = None) -> JobInfo:
        if resubmission_of is not None:
            resubmission_of = validate.job_id(resubmission_of, "resubmission_of")
        for node in spec.exclude:
            validate.hostname(node, "exclude")
        spec = with_run_id(spec)
        submitted_at = datetime.now(UTC)
        run = f"{spec.name}-{submitted_at:%Y%m%dT%H%M%S}-{secrets.token_hex(4)}"
        run_dir = self.root / "runs" / run
        checkpoint_dir = self._checkpoint_dir(spec)
        try:
            (run_dir / "logs").mkdir(parents=True)
            (self.root / "jobs").mkdir(parents=True, exist_ok=True)
            checkpoint_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "spec.json").write_text(spec.model_dump_json())
            meta = {
                "run": run,
                "submitted_at": submitted_at.isoformat(),
                "resubmission_of": resubmission_of,
                "checkpoint_dir": str(checkpoint_dir),
            }
            (run_dir / "meta.json").write_text(json.dumps(meta))
            script = run_dir / "job.sh"
            script.write_text(self._script(run_dir, checkpoint_dir, spec.run_id or run))
            script.chmod(0o755)
        except OSError as exc:
            raise SchedulerError(f"cannot prepare job directory {run_dir}: {exc}") from exc

        # The comment names the run first (how a job is known as ours, see _run_dir); the
        # spec's own comment follows, so a site's tag in it is there for admission to see.
        comment = f"{COMMENT_PREFIX}{run}" + (f" {spec.comment}" if spec.comment else "")
        args = ["sbatch", "--parsable", "--job-name", spec.name, "--nodes", str(spec.nodes),
                "--output", str(run_dir / "logs" / "slurm-%j.out"), "--chdir", str(run_dir),
                "--comment", comment,
                "--export", ",".join(self.export) if self.export else "NONE"]  # fmt: skip
        # The spec's partition (kept by resubmissions) before the installation's default.
        partition = spec.partition or self.partition
        if partition:
            args += ["--partition", partition]
        if spec.account:
            args += ["--account", spec.account]
        if spec.exclude:
            args += ["--exclude", ",".join(spec.exclude)]
        if self.gpus:
            args += [f"--gpus-per-node={spec.gpus_per_node}"]
        args += [*self.sbatch_args, str(script)]
        try:
            out = self._check(args).strip()
        except SchedulerError:
            shutil.rmtree(run_dir, ignore_errors=True)  # never submitted: leave no orphan
            raise
        # --parsable prints "<id>" or "<id>;<cluster>".
        job_id = validate.job_id(out.split(";", 1)[0].strip(), "sbatch output")
        self._link(job_id, run)
        try:
            return self.job(job_id)
        except JobNotFound:  # purged already: only if MinJobAge is tiny; report what we know
            job = SlurmJob(
                job_id, spec.name, JobState.PENDING, (), None, "", submitted_at, None,
                comment=comment, partition=partition or "", account=spec.account or "",
            )  # fmt: skip
            return self._info(job, run_dir)

    def _link(self, job_id: str, run: str) -> None:
        link = self._job_link(job_id)
        tmp = link.with_name(f".link-{job_id}.{os.getpid()}.{secrets.token_hex(2)}")
        try:
            os.symlink(Path("..") / "runs" / run, tmp)
            os.replace(tmp, link)
        except OSError as exc:
            raise SchedulerError(f"job {job_id} submitted, but cannot link {link}: {exc}") from exc

    # ------------------------------------------------------------------------ lookup

    def _run_dir(self, job: SlurmJob) -> Path | None:
        """The run directory of ``job``, if trainmedic submitted it (see the module docstring:
        the comment decides, a leftover ``jobs/<id>`` link of a recycled id never does)."""
        if job.comment.startswith(COMMENT_PREFIX):
            # The run is the comment's first word; the spec's own comment may follow.
            run = job.comment.removeprefix(COMMENT_PREFIX).split(" ", 1)[0]
            run_dir = self.root / "runs" / run
            if RUN_RE.match(run) and (run_dir / "spec.json").is_file():
                return run_dir
            return None
        if job.comment or job.source != "jobcomp":
            return None  # someone else's job, whatever a stale link says
        link = self._job_link(job.job_id)
        try:
            meta = json.loads((link / "meta.json").read_text())
            submitted = datetime.fromisoformat(meta["submitted_at"])
        except (OSError, ValueError, KeyError):
            return None
        if job.submitted_at is None or not (
            submitted - LINK_SLACK
            <= job.submitted_at
            <= submitted + timedelta(seconds=self.timeout_s) + LINK_SLACK
        ):
            return None
        return link.resolve()

    def _info(self, job: SlurmJob, run_dir: Path | None = None) -> JobInfo:
        run_dir = run_dir or self._run_dir(job)
        meta: dict[str, Any] = {}
        if run_dir is not None:
            try:
                spec = JobSpec.model_validate_json((run_dir / "spec.json").read_text())
                meta = json.loads((run_dir / "meta.json").read_text())
            except (OSError, ValueError) as exc:
                raise SchedulerError(f"job {job.job_id}: unreadable {run_dir}: {exc}") from exc
            link = self._job_link(job.job_id)
            # The id's link names the run dir for humans; a stale one (recycled id) is not used.
            job_dir = link if link.resolve() == run_dir.resolve() else run_dir
            checkpoint_dir = Path(meta.get("checkpoint_dir") or self._checkpoint_dir(spec))
        else:
            # Not submitted through trainmedic: describe it as far as Slurm can.
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", job.name)[:64] or f"job{job.job_id}"
            owner = re.sub(r"[^A-Za-z0-9_.@-]", "_", job.user)[:64] or "unknown"
            spec = JobSpec(name=name, nodes=max(1, min(job.node_count, 4096)), owner=owner)
            job_dir = self._job_link(job.job_id)
            checkpoint_dir = self._checkpoint_dir(spec)
        reason = job.reason
        cancel = run_dir / "cancel.json" if run_dir is not None else None
        if job.state is JobState.CANCELLED and cancel is not None and cancel.is_file():
            with contextlib.suppress(OSError, ValueError):
                reason = str(json.loads(cancel.read_text()).get("reason", reason))
        submitted = meta.get("submitted_at")
        return JobInfo(
            job_id=job.job_id,
            name=spec.name,
            state=job.state,
            nodes=job.nodes,
            exit_code=job.exit_code,
            reason=reason,
            log_dir=str(job_dir / "logs"),
            checkpoint_dir=str(checkpoint_dir),
            heartbeat_path=str(job_dir / "heartbeat"),
            spec=spec,
            submitted_at=(
                datetime.fromisoformat(submitted)
                if submitted
                else job.submitted_at or datetime.now(UTC)
            ),
            started_at=job.started_at,
            ended_at=job.ended_at,
            resubmission_of=meta.get("resubmission_of"),
            managed=run_dir is not None,
            partition=job.partition,
            account=job.account,
            comment=job.comment,
        )

    def _slurm_job(self, job_id: str) -> SlurmJob:
        args = ["scontrol", "show", "job", "-o", job_id]
        proc = self._call(args)
        if proc.returncode == 0 and proc.stdout.strip():
            return parse_scontrol_job(proc.stdout.strip().splitlines()[0])
        if "invalid job id" not in (proc.stderr + proc.stdout).lower():
            raise SchedulerError(self._failure(args, proc))
        # Purged from the controller (MinJobAge): the job-completion log still has it.
        for job in self._sacct(["-j", job_id]):
            if job.job_id == job_id:
                return job
        raise JobNotFound(f"job {job_id}: unknown to Slurm (neither scontrol nor sacct -c)")

    def _sacct(self, selection: list[str]) -> list[SlurmJob]:
        """Finished jobs from the site's job history: accounting (slurmdbd) where the site has
        it, else the job-completion log, else none (then only live jobs are known)."""
        delimiter = "\x1f"  # not in any job name or node list Slurm accepts
        for source, flags, fields in (
            ("accounting", ["-X"], ACCOUNTING_FIELDS),
            ("jobcomp", ["-c"], JOBCOMP_FIELDS),
        ):
            if self._history_off.get(source):
                continue
            args = ["sacct", *flags, "-P", "-n", f"--delimiter={delimiter}",
                    "-o", ",".join(fields), *selection]  # fmt: skip
            proc = self._call(args)
            said = (proc.stdout + proc.stderr).lower()
            if _HISTORY_DISABLED[source] in said:
                # Slurm says so on stdout or stderr, with exit status 0 or 1 by version.
                self._history_off[source] = True
                log.info("slurm: %s is disabled at this site", source)
                continue
            if proc.returncode != 0:
                raise SchedulerError(self._failure(args, proc))
            return parse_sacct(proc.stdout, delimiter, fields)
        return []

    def job(self, job_id: str) -> JobInfo:
        return self._info(self._slurm_job(validate.job_id(job_id)))

    def jobs(self) -> list[JobInfo]:
        live = {j.job_id: j for j in parse_squeue_json(self._check(["squeue", "--json"]))}
        since = datetime.now().astimezone() - self.history  # sacct reads local time
        old = self._sacct(["-S", since.strftime("%Y-%m-%dT%H:%M:%S")])
        merged = {**{j.job_id: j for j in old}, **live}
        infos = [self._info(j) for j in merged.values()]
        return sorted(infos, key=lambda i: (i.submitted_at, _id_key(i.job_id)))

    # ------------------------------------------------------------------------ control

    def cancel(self, job_id: str, reason: str) -> bool:
        job_id, reason = validate.job_id(job_id), validate_reason(reason)
        current = self._slurm_job(job_id)
        if current.state.finished:
            return False
        run_dir = self._run_dir(current)
        if run_dir is not None:
            # scancel takes no reason; keep ours where job() will find it.
            record = {"reason": reason, "at": datetime.now(UTC).isoformat()}
            try:
                (run_dir / "cancel.json").write_text(json.dumps(record))
            except OSError as exc:
                raise SchedulerError(f"job {job_id}: cannot record cancel reason: {exc}") from exc
        self._check(["scancel", job_id])
        return True

    def cancel_steps_on(self, job_id: str, node: str, reason: str) -> list[str]:
        """``scancel`` of each step of ``job_id`` whose nodes include ``node``: the job's own
        steps only (``squeue --steps --jobs``), never another job, and not the ``extern`` step
        (Slurm's own, on every node, ends with the job)."""
        job_id, node = validate.job_id(job_id), validate.hostname(node)
        validate_reason(reason)
        listing = self._call(["squeue", "--steps", "--jobs", job_id, "-h", "-o", "%i|%N"])
        if listing.returncode != 0:  # the job is gone: nothing of it runs anywhere
            return []
        cancelled = []
        for line in listing.stdout.splitlines():
            step, _, nodelist = line.strip().partition("|")
            owner, _, name = step.partition(".")
            if owner != job_id or not name or name == "extern":
                continue
            if node in node_list(nodelist):
                self._check(["scancel", "--quiet", step])
                cancelled.append(step)
        return cancelled

    def request_checkpoint(self, job_id: str) -> bool:
        job = self.job(job_id)
        if job.state.finished:
            return False
        # Megatron/NeMo-style jobs save on SIGUSR1 (Slurm's usual pre-emption signal); it
        # goes to the batch step and every job step.
        self._check(["scancel", "--signal=USR1", "--full", job.job_id])
        return True

    def _node(self, node: str) -> NodeInfo:
        args = ["scontrol", "show", "node", "-o", node]
        proc = self._call(args)
        if proc.returncode != 0 or not proc.stdout.strip():
            raise SchedulerError(self._failure(args, proc))
        return parse_node_line(proc.stdout.strip().splitlines()[0])

    def nodes(self) -> list[NodeInfo]:
        out = self._check(["scontrol", "show", "node", "-o"])
        return [parse_node_line(line) for line in out.splitlines() if line.strip()]

    def drain(self, node: str, reason: str) -> bool:
        node, reason = validate.hostname(node), validate_reason(reason)
        if self._node(node).state is NodeState.DRAINED:
            return False
        self._check(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
        return True

    def topology(self) -> dict[str, NodePlace]:
        """The leaf switch of each node from the topology/tree plugin; empty without one
        (``scontrol`` then says there is no topology information and exits non-zero)."""
        proc = self._call(["scontrol", "show", "topology"])
        if proc.returncode != 0:
            return {}
        return parse_topology(proc.stdout)

    def hold(self, name: str, nodes: list[str], duration_s: int) -> list[str]:
        """A Slurm reservation for this user on the idle ones among ``nodes``. Without
        IGNORE_JOBS slurmctld refuses a reservation on a node that runs a job, so a node that
        took a job since we looked is never taken from it: we look again and retry once."""
        name = validate.hold_name(name)
        wanted = {validate.hostname(n) for n in nodes}
        minutes = max(1, math.ceil(duration_s / 60))
        for _ in range(2):
            idle = sorted(
                n.name for n in self.nodes() if n.name in wanted and n.state is NodeState.IDLE
            )
            if not idle:
                return []
            args = [
                "scontrol",
                "create",
                "reservation",
                f"ReservationName={name}",
                f"Nodes={','.join(idle)}",
                "StartTime=now",
                f"Duration={minutes}",
                f"Users={getpass.getuser()}",
                # An incident's hold and a pair test's hold may cover the same node.
                "Flags=OVERLAP",
            ]
            proc = self._call(args)
            if proc.returncode == 0:
                return idle
            log.warning("hold %s: %s", name, self._failure(args, proc))
        raise SchedulerError(self._failure(args, proc))

    def release(self, name: str) -> bool:
        name = validate.hold_name(name)
        proc = self._call(["scontrol", "delete", f"ReservationName={name}"])
        if proc.returncode == 0:
            return True
        said = (proc.stderr + proc.stdout).lower()
        if "reservation is invalid" in said or "invalid reservation" in said:  # none: done
            return False
        raise SchedulerError(self._failure(["scontrol", "delete", f"ReservationName={name}"], proc))

    def resume(self, node: str) -> bool:
        node = validate.hostname(node)
        if self._node(node).state is not NodeState.DRAINED:
            return False
        self._check(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        return True


def _id_key(job_id: str) -> tuple[int, int]:
    base, _, task = job_id.partition("_")
    return int(base), int(task or -1)
