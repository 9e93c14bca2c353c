"""Parsers for what the Slurm tools print (``scontrol -o``, ``squeue --json``, ``sacct -P``)
and the validation of values sent to them. Pure: no subprocess, tested on recorded output of
Slurm 22.05 and later spellings."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainmedic.core import validate
from trainmedic.core.errors import InputError, SchedulerError
from trainmedic.core.models import JobState, NodeInfo, NodePlace, NodeState

__all__ = [
    "ACCOUNTING_FIELDS",
    "JOBCOMP_FIELDS",
    "SlurmJob",
    "job_state",
    "node_list",
    "node_state",
    "parse_exit_code",
    "parse_kv_line",
    "parse_node_line",
    "parse_sacct",
    "parse_scontrol_job",
    "parse_squeue_json",
    "parse_topology",
    "validate_reason",
]

COMMENT_PREFIX = "trainmedic:"
REASON_RE = re.compile(r"^[A-Za-z0-9 _.,:/@#+()-]{1,200}$")
RUN_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
PARTITION_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_KEY_RE = re.compile(r"^[A-Z][A-Za-z0-9_:/]*=")
_REASON_STAMP_RE = re.compile(r"\s*\[[^\[\]]*@[^\[\]]*\]\s*$")
_NO_NODES = {"", "(null)", "None", "None assigned", "(None)"}
# The job name is last in both: a delimiter inside it is then harmless. Partition and account
# decide whether a job is in the scope a site manages (trainmedic.decisions.admission).
ACCOUNTING_FIELDS = (
    "jobid", "state", "exitcode", "nodelist", "submit", "start", "end", "user", "partition",
    "account", "comment", "jobname",
)  # fmt: skip
# The job-completion log (``sacct -c``) has no comment field (it does keep partition and account).
JOBCOMP_FIELDS = (
    "jobid", "state", "exitcode", "nodelist", "submit", "start", "end", "user", "partition",
    "account", "jobname",
)  # fmt: skip

# Slurm job states (squeue/scontrol/sacct spelling) -> ours. COMPLETING stays "not finished"
# because the epilog may still turn a node bad; CONFIGURING means nodes are still booting.
_JOB_STATES: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED,
    "NODE_FAIL": JobState.NODE_FAIL,
    "BOOT_FAIL": JobState.NODE_FAIL,
    "TIMEOUT": JobState.TIMEOUT,
    "DEADLINE": JobState.TIMEOUT,
    "CANCELLED": JobState.CANCELLED,
    "PREEMPTED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
}
_SHORT_STATES = {
    "PD": "PENDING", "CF": "CONFIGURING", "R": "RUNNING", "CG": "COMPLETING", "CD": "COMPLETED",
    "F": "FAILED", "OOM": "OUT_OF_MEMORY", "NF": "NODE_FAIL", "BF": "BOOT_FAIL", "TO": "TIMEOUT",
    "DL": "DEADLINE", "CA": "CANCELLED", "PR": "PREEMPTED", "S": "SUSPENDED", "ST": "STOPPED",
}  # fmt: skip


# ----------------------------------------------------------------------------- parsing


def validate_reason(value: str, field: str = "reason") -> str:
    """Reasons end up in slurm.conf-like key=value arguments and in admins' terminals."""
    if not isinstance(value, str) or not REASON_RE.match(value) or value != value.strip():
        raise InputError(
            field,
            value,
            "1-200 characters of letters, digits, space and _.,:/@#+()- "
            "(no leading/trailing space, quotes, $, `, ;, =, brackets or newlines)",
        )
    return value


def job_state(raw: str | Sequence[str]) -> JobState:
    """Map a Slurm job state ("CANCELLED by 0", "RUNNING", ["FAILED"], "CD") to ours."""
    if not isinstance(raw, str):  # squeue --json from 23.02 on gives a list of flags
        raw = next(iter(raw), "")
    word = raw.strip().split(" ", 1)[0].split("+", 1)[0].upper()
    word = _SHORT_STATES.get(word, word)
    try:
        return _JOB_STATES[word]
    except KeyError:
        raise SchedulerError(f"unknown Slurm job state {raw!r}") from None


def node_state(raw: str) -> NodeState:
    """Map ``State=`` of ``scontrol show node`` (``IDLE+DRAIN``, ``DOWN*+DRAIN``, ``MIXED``...).

    A drain flag wins over everything: the node is out because someone (maybe us) said so,
    and ``resume`` is the way back, even when it is also down.
    """
    parts = [p.strip().upper() for p in raw.split("+") if p.strip()]
    if not parts:
        raise SchedulerError(f"empty Slurm node state {raw!r}")
    # sinfo-style suffixes: only "*" (not responding) changes availability; "~" (powered
    # off, power saving), "#", "%", "!", "@", "^", "$", "-" are transitions of a usable node.
    words = [p.rstrip("*~#!%$@^-") for p in parts]
    base, flags = words[0], set(words[1:])
    if {base, *flags} & {"DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING"}:
        return NodeState.DRAINED
    if base in {"DOWN", "FUTURE", "UNKNOWN", "ERROR"} or "NOT_RESPONDING" in flags:
        return NodeState.DOWN
    if any(p.endswith("*") for p in parts):
        return NodeState.DOWN
    if (
        base in {"ALLOCATED", "ALLOC", "MIXED", "MIX", "COMPLETING", "COMP"}
        or "COMPLETING" in flags
    ):
        return NodeState.ALLOCATED
    if base == "IDLE":
        return NodeState.IDLE
    raise SchedulerError(f"unknown Slurm node state {raw!r}")


def parse_kv_line(line: str, *, tail_key: str | None = None) -> dict[str, str]:
    """Parse one ``scontrol show ... -o`` line into ``{Key: value}``.

    Values may contain spaces (``OS=Linux 6.1 #1 SMP``): a word that does not start with
    ``Key=`` continues the previous value. ``tail_key`` names a field Slurm prints last whose
    free text may itself contain ``Key=``-looking words (a node's ``Reason=``).
    """
    fields: dict[str, str] = {}
    body = line.strip()
    if tail_key is not None:
        match = re.search(rf"(?:^|\s){re.escape(tail_key)}=(.*)$", body)
        if match is not None:
            fields[tail_key] = match[1].strip()
            body = body[: match.start()]
    key: str | None = None
    for word in body.split():
        if _KEY_RE.match(word):
            key, _, value = word.partition("=")
            fields[key] = value
        elif key is not None:
            fields[key] = f"{fields[key]} {word}"
    return fields


def parse_topology(text: str) -> dict[str, NodePlace]:
    """``scontrol show topology`` (topology/tree): each leaf switch line names its nodes
    (``SwitchName=s0 Level=0 LinkSpeed=1 Nodes=gpu[001-008]``); upper levels name switches
    only. Node -> its leaf switch; the rack is not Slurm's to know."""
    places: dict[str, NodePlace] = {}
    for line in text.splitlines():
        fields = parse_kv_line(line)
        if "SwitchName" in fields and fields.get("Nodes"):
            for node in validate.expand_nodelist(fields["Nodes"], "Nodes"):
                places[node] = NodePlace(switch=fields["SwitchName"])
    return places


def parse_node_line(line: str) -> NodeInfo:
    fields = parse_kv_line(line, tail_key="Reason")
    try:
        name, state = fields["NodeName"], fields["State"]
    except KeyError as exc:
        raise SchedulerError(f"scontrol show node: no {exc.args[0]}= in {line[:200]!r}") from None
    reason = _REASON_STAMP_RE.sub("", fields.get("Reason", "")).strip()
    return NodeInfo(
        name=name,
        state=node_state(state),
        reason="" if reason == "none" else reason,
        raw_state=state,
    )


def parse_exit_code(raw: str | int | Mapping[str, Any] | None) -> int | None:
    """``"3:0"`` (scontrol/sacct), a raw wait status (squeue --json 22.05) or a 23.x object.

    Killed by a signal reads as 128+signal, like a shell would report it.
    """
    if raw is None or raw == "":
        return None
    if isinstance(raw, Mapping):  # data_parser 0.0.39+: {"status": ..., "return_code": ...}
        signal = raw.get("signal") or {}
        sig = signal.get("id") if isinstance(signal, Mapping) else None
        if isinstance(sig, int) and sig > 0:
            return 128 + sig
        code = raw.get("return_code")
        return code if isinstance(code, int) else None
    if isinstance(raw, int):
        if raw & 0x7F:
            return 128 + (raw & 0x7F)
        return (raw >> 8) & 0xFF
    code, _, sig = raw.partition(":")
    try:
        code_i, sig_i = int(code), int(sig or 0)
    except ValueError:
        raise SchedulerError(f"unparseable Slurm exit code {raw!r}") from None
    return 128 + sig_i if sig_i else code_i


@dataclass(frozen=True)
class SlurmJob:
    """What Slurm says about a job, before it is joined with the run directory."""

    job_id: str
    name: str
    state: JobState
    nodes: tuple[str, ...]
    exit_code: int | None
    reason: str
    submitted_at: datetime | None
    ended_at: datetime | None
    user: str = ""
    started_at: datetime | None = None  # None while pending (Slurm prints a projection)
    comment: str = ""
    node_count: int = 1
    # Who said it: the controller (scontrol, squeue), accounting, or the job-completion log.
    source: str = "controller"
    partition: str = ""  # where it runs (a pending job may list several: "a,b")
    account: str = ""  # "" where Slurm has none: no accounting, or Account=(null)


def node_list(expr: str | None) -> tuple[str, ...]:
    """The hosts of a Slurm node expression; none for Slurm's spellings of "no nodes"."""
    if expr is None or expr.strip() in _NO_NODES:
        return ()
    return tuple(validate.expand_nodelist(expr))


def _slurm_time(raw: Any) -> datetime | None:
    """Slurm prints local time without a zone; epoch seconds in JSON; 0/Unknown/None = unset."""
    if raw is None or raw in (0, "", "Unknown", "None", "N/A", "(null)"):
        return None
    if isinstance(raw, int):
        return datetime.fromtimestamp(raw, UTC)
    if isinstance(raw, Mapping):  # 23.x: {"set": true, "number": ...}
        return _slurm_time(raw.get("number")) if raw.get("set", True) else None
    try:
        return datetime.fromisoformat(raw).astimezone(UTC)
    except ValueError:
        return None


def _slurm_reason(raw: str | None) -> str:
    return "" if raw in (None, "None", "(null)") else str(raw)


def _slurm_name(raw: Any) -> str:
    # Slurm's spellings of "not set" for a partition or account.
    return "" if raw in (None, "", "(null)", "N/A") else str(raw)


def _started_only(state: JobState, value: Any) -> Any:
    # A pending job's start time is the scheduler's projection, not a start.
    return None if state is JobState.PENDING else value


def _finished_only(state: JobState, value: Any) -> Any:
    # Slurm fills end_time/exit_code with projections or zeros while a job is live.
    return value if state.finished else None


def parse_scontrol_job(line: str) -> SlurmJob:
    fields = parse_kv_line(line)
    try:
        job_id, state = fields["JobId"], job_state(fields["JobState"])
    except KeyError as exc:
        raise SchedulerError(f"scontrol show job: no {exc.args[0]}= in {line[:200]!r}") from None
    if fields.get("ArrayTaskId") not in (None, "", "(null)"):
        job_id = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}"
    return SlurmJob(
        job_id=validate.job_id(job_id),
        name=fields.get("JobName", ""),
        state=state,
        nodes=node_list(fields.get("NodeList")),
        exit_code=_finished_only(state, parse_exit_code(fields.get("ExitCode"))),
        reason=_slurm_reason(fields.get("Reason")),
        submitted_at=_slurm_time(fields.get("SubmitTime")),
        started_at=_started_only(state, _slurm_time(fields.get("StartTime"))),
        ended_at=_finished_only(state, _slurm_time(fields.get("EndTime"))),
        user=fields.get("UserId", "").split("(", 1)[0],
        comment=_slurm_reason(fields.get("Comment")),
        node_count=_int(fields.get("NumNodes"), 1),
        partition=_slurm_name(fields.get("Partition")),
        account=_slurm_name(fields.get("Account")),
    )


def parse_squeue_json(text: str) -> list[SlurmJob]:
    """``squeue --json``: every job the controller still holds (finished ones for MinJobAge)."""
    try:
        doc = json.loads(text)
        raw_jobs = doc["jobs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SchedulerError(f"squeue --json: unparseable output ({exc})") from exc
    jobs = []
    for raw in raw_jobs:
        state = job_state(raw["job_state"])
        job_id = str(raw["job_id"])
        task = raw.get("array_task_id")
        if isinstance(task, Mapping):
            task = task.get("number") if task.get("set") else None
        if task is not None:
            job_id = f"{raw['array_job_id']}_{task}"
        jobs.append(
            SlurmJob(
                job_id=validate.job_id(job_id),
                name=str(raw.get("name", "")),
                state=state,
                nodes=node_list(raw.get("nodes")),
                exit_code=_finished_only(state, parse_exit_code(raw.get("exit_code"))),
                reason=_slurm_reason(raw.get("state_reason")),
                submitted_at=_slurm_time(raw.get("submit_time")),
                started_at=_started_only(state, _slurm_time(raw.get("start_time"))),
                ended_at=_finished_only(state, _slurm_time(raw.get("end_time"))),
                user=str(raw.get("user_name", "")),
                comment=str(raw.get("comment") or ""),
                node_count=_int(raw.get("node_count"), 1),
                partition=_slurm_name(raw.get("partition")),
                account=_slurm_name(raw.get("account")),
            )
        )
    return jobs


def parse_sacct(
    text: str, delimiter: str = "|", fields: Sequence[str] = ACCOUNTING_FIELDS
) -> list[SlurmJob]:
    """``sacct -X -P -n -o <ACCOUNTING_FIELDS>`` (accounting), or ``sacct -c ... -o
    <JOBCOMP_FIELDS>`` (the job-completion log): one job per line, steps skipped."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(delimiter, len(fields) - 1)
        if len(parts) != len(fields):
            raise SchedulerError(f"sacct: unexpected line {line[:200]!r}")
        row = dict(zip(fields, parts, strict=True))
        if "." in row["jobid"]:  # job steps; the batch job itself carries the outcome
            continue
        state = job_state(row["state"])
        nodes = node_list(row["nodelist"])
        jobs.append(
            SlurmJob(
                job_id=validate.job_id(row["jobid"]),
                name=row["jobname"],
                state=state,
                nodes=nodes,
                exit_code=_finished_only(state, parse_exit_code(row["exitcode"])),
                reason="",
                submitted_at=_slurm_time(row["submit"]),
                started_at=_started_only(state, _slurm_time(row.get("start"))),
                ended_at=_finished_only(state, _slurm_time(row["end"])),
                user=row["user"].split("(", 1)[0],
                comment=row.get("comment", ""),
                node_count=max(len(nodes), 1),
                source="accounting" if "comment" in fields else "jobcomp",
                partition=_slurm_name(row.get("partition")),
                account=_slurm_name(row.get("account")),
            )
        )
    return jobs


def _int(raw: object, default: int) -> int:
    if isinstance(raw, Mapping):
        raw = raw.get("number")
    try:
        return int(raw)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return default


# ----------------------------------------------------------------------------- adapter
