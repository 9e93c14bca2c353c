"""pydantic models for everything that crosses a boundary: events, diagnoses, jobs,
checkpoints, playbook and pair-test results."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from trainmedic.core import validate
from trainmedic.core.taxonomy import Category, Layer, Remediation

NodeName = Annotated[str, AfterValidator(validate.hostname)]
JobId = Annotated[str, AfterValidator(validate.job_id)]


def utcnow() -> datetime:
    return datetime.now(UTC)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ----------------------------------------------------------------------------- scheduler


class JobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    NODE_FAIL = "NODE_FAIL"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"

    @property
    def finished(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)


class NodeState(StrEnum):
    IDLE = "IDLE"
    ALLOCATED = "ALLOCATED"
    DRAINED = "DRAINED"
    DOWN = "DOWN"


class JobSpec(Strict):
    """What to (re)submit: the scheduler-independent part of an sbatch script."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    nodes: int = Field(ge=1, le=4096)
    gpus_per_node: int = Field(default=4, ge=1, le=16)
    steps: int = Field(default=400, ge=1)
    checkpoint_every: int = Field(default=50, ge=1)
    resume_from_step: int | None = Field(default=None, ge=0)
    skip_batches: tuple[int, int] | None = None  # inclusive [first, last] data batches to skip
    num_workers: int = Field(default=4, ge=0, le=64)
    gc_interval: int | None = Field(default=None, ge=1)
    exclude: tuple[NodeName, ...] = ()
    checkpoint_dir: str | None = None  # shared across resubmissions of one training run
    # The training run's identity, given at its first submission and kept by every
    # resubmission: a checkpoint whose manifest names another run is never resumed from.
    run_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,100}$")
    owner: str = Field(default="unknown", pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    # Where it runs and who pays (sbatch --partition/--account; the scheduler's defaults when
    # None) and its free-text comment, kept by every resubmission so it stays in the scope a
    # site manages (TRAINMEDIC_MANAGED_PARTITIONS/_ACCOUNTS/_COMMENT_TAG). No "=" in the
    # comment, single spaces only: scontrol prints it among its Key=value words.
    partition: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    account: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    comment: str = Field(
        default="", max_length=200, pattern=r"^([A-Za-z0-9_.,:/@#+-]+( [A-Za-z0-9_.,:/@#+-]+)*)?$"
    )


class JobInfo(Strict):
    job_id: JobId
    name: str
    state: JobState
    nodes: tuple[NodeName, ...]
    exit_code: int | None = None
    reason: str = ""
    log_dir: str
    checkpoint_dir: str
    heartbeat_path: str
    spec: JobSpec
    submitted_at: datetime
    # When it began to run (None: still queued, or the scheduler does not say): the start of
    # the window in which a node's kernel lines and counters can be this job's failure.
    started_at: datetime | None = None
    ended_at: datetime | None = None
    resubmission_of: str | None = None
    # Submitted through trainmedic (its spec known): only such jobs are remediated.
    managed: bool = True
    # As the scheduler reports them ("" where it does not say, e.g. Slurm's Account=(null)):
    # which jobs a site lets trainmedic touch is decided on these, not on the spec's wishes.
    partition: str = ""
    account: str = ""
    comment: str = ""

    @property
    def window_start(self) -> datetime:
        """Since when a node's kernel lines and counters can be this job's: its start (the
        queue time before it is another story), or its submission where no start is known."""
        return self.started_at or self.submitted_at


class NodePlace(Strict):
    """Where a node sits in the fabric: its rack and leaf switch (declared in the inventory,
    or the scheduler's own topology where it knows it)."""

    rack: str | None = None
    switch: str | None = None


class NodeInfo(Strict):
    name: NodeName
    state: NodeState
    reason: str = ""
    raw_state: str = ""  # the scheduler's own word, e.g. Slurm's IDLE+DRAIN or DOWN*+FAIL


# ----------------------------------------------------------------------------- events


class JobEvent(Strict):
    """A failure/anomaly report about one job, from the scheduler or the training framework."""

    kind: Literal[
        "job.failed",
        "job.node_fail",
        "job.timeout",
        "job.loss_spike",
        "job.nan_loss",
        "job.hung",
        "job.slow",
    ]
    job_id: JobId
    occurred: datetime = Field(default_factory=utcnow)
    nodes: tuple[NodeName, ...] = ()
    exit_code: int | None = Field(default=None, ge=-255, le=255)
    reason: str = Field(default="", max_length=512)
    step: int | None = Field(default=None, ge=0)


# ----------------------------------------------------------------------------- diagnosis


class Evidence(Strict):
    file: str
    line: int = Field(ge=0)
    text: str
    signature: str
    host: str | None = None
    category: Category | None = None
    # `host` is the far end of a connection that broke, named by the other end (a refused
    # connect, "closed by remote peer"): where to look first, never proof for a drain.
    far_end: bool = False


class Rival(Strict):
    """Another explanation the logs offered, and why the winner beat it."""

    category: Category
    score: float = Field(ge=0.0, le=1.0)
    signature: str
    where: str  # file:line of its most decisive line
    reason: str


class Diagnosis(Strict):
    category: Category
    layer: Layer
    root_cause_host: str | None = None
    confidence: float = Field(ge=0.0, le=1.0)
    evidence: tuple[Evidence, ...] = ()
    remediation: Remediation
    source: Literal["rules", "telemetry", "llm", "learned", "human"] = "rules"
    # The winning evidence is only what every other rank sees (collective timeouts, aborts,
    # a stall inferred from silence): it never proves which host to drain.
    symptom_only: bool = False
    rivals: tuple[Rival, ...] = ()


# ----------------------------------------------------------------------------- telemetry


class GpuTelemetry(Strict):
    """One GPU's DCGM readings. The counters (uncorrectable ECC, NVLink errors) and the last
    Xid are their increase over the job's window (``diagnosis.freshness``), or, with
    ``lifetime``, what one scrape shows: totals since the GPU began counting, which are the
    node's history and never evidence of a failure."""

    host: str
    gpu: int
    temperature_c: float | None = None
    xid_last: int = 0
    ecc_dbe_total: float = 0.0
    nvlink_errors_total: float = 0.0
    gpu_utilization: float | None = None
    lifetime: bool = False


# ----------------------------------------------------------------------------- checkpoints


class Checkpoint(Strict):
    step: int = Field(ge=0)
    path: str
    valid: bool
    problem: str = ""
    loss: float | None = None
    batch: int | None = None  # last data batch consumed before this checkpoint


# ----------------------------------------------------------------------------- ansible


class HostOutcome(StrEnum):
    ok = "ok"
    failed = "failed"
    unreachable = "unreachable"
    skipped = "skipped"


class PlaybookResult(Strict):
    playbook: str
    status: str
    rc: int
    hosts: dict[str, HostOutcome]
    facts: dict[str, dict[str, object]] = Field(default_factory=dict)
    check_mode: bool = False
    private_data_dir: str

    @property
    def failed_hosts(self) -> list[str]:
        return [h for h, o in self.hosts.items() if o is not HostOutcome.ok]


class PairResult(Strict):
    nodes: tuple[NodeName, NodeName] | tuple[NodeName, NodeName, NodeName]
    ok: bool
    busbw_gbps: float | None = None
    error: str = ""
    attempts: int = 1
    # The test never started, or was cut off from outside (a killed playbook, an overloaded
    # controller): neither a pass nor a failure of the nodes.
    undetermined: bool = False


class ActionRecord(BaseModel):
    """One action a runbook took (or refused, or only planned in a dry run)."""

    what: str
    target: str
    outcome: str
    changed: bool = False


class IsolationOutcome(BaseModel):
    """What the shared isolation step decided and did."""

    mode: Literal["none", "auto", "approval"]
    decided_by: str  # policy, a human's answer, timeout, dry run
    candidates: list[str]
    approved: list[str]
    drained: list[str]
    already_drained: list[str]
    reasons: list[str]
    ignored: list[str] = []
    evidence: dict[str, dict[str, object]] = {}
    actions: list[ActionRecord] = []
