"""Every setting of trainmedic, in one place: read from the environment (prefix
``TRAINMEDIC_``) or a ``.env`` file. No domain imports: the domain reads its settings here.

The embedded default needs nothing: a local Prefect server on SQLite under ``home``, the
simulated scheduler and the simulated inventory. Production sets the variables documented in
the README (scheduler=slurm, a real inventory, PREFECT_API_URL, a PostgreSQL database URL).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, AliasChoices, Field, HttpUrl, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parents[2]
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_.,:/@#+-]{1,64}$")


def _name_list(value: str) -> str:
    """A comma-separated list of scheduler names (partitions, accounts); blanks around the
    commas are ignored. A value no name Slurm reports can equal (a ";" for a ",", quotes)
    would put every job out of scope without a word: it is refused at start instead."""
    bad = [n.strip() for n in value.split(",") if n.strip() and not _NAME_RE.match(n.strip())]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a name (1-64 letters, digits, _.-; comma-separated)")
    return value


def _comment_tag(value: str) -> str:
    # One word of what a job's comment may hold (trainmedic.core.models.JobSpec.comment).
    if value and not _TAG_RE.match(value):
        raise ValueError("want one word of 1-64 letters, digits and _.,:/@#+- (or empty)")
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAINMEDIC_", env_file=".env", extra="ignore")

    home: Path = Field(default=REPO_ROOT / ".trainmedic", description="state directory")
    cluster: str = Field(
        default="default",
        pattern=r"^[a-z0-9][a-z0-9-]{0,39}$",
        description="this cluster's name: its guard lock and records on a Prefect server that "
        "several clusters share are its own (one breaker, one drain record per cluster)",
    )
    scheduler: Literal["sim", "slurm"] = "sim"
    inventory: Path = Field(default=REPO_ROOT / "inventories" / "sim")
    playbook_dir: Path = Field(default=REPO_ROOT / "playbooks")

    # Embedded Prefect server (ignored when PREFECT_API_URL points elsewhere).
    server_host: str = "127.0.0.1"
    server_port: int = Field(default=4200, ge=1, le=65535)
    server_auth: SecretStr | None = Field(
        default=None,
        description="user:password: basic auth on the Prefect API (server and every client)",
    )
    database_url: str | None = Field(
        default=None,
        description="PREFECT_SERVER_DATABASE_CONNECTION_URL, e.g. "
        "postgresql+asyncpg://prefect:***@db/prefect; SQLite under home when unset",
    )
    warm_worker: bool = Field(
        default=True,
        description="flow runs fork from a warm interpreter (adapters/warm_worker.py); "
        "false: Prefect's process worker, one new Python process per run",
    )

    # The simulated cluster: its DCGM exporter (started by `trainmedic up` on the sim), the
    # simulated trainer's seconds per step, a pair test's duration, and how long a test
    # with a lost peer hangs (the real one never finishes). The last two are the simulated
    # fabric's: written to the cluster's cluster.json when it is made (trainmedic.sim.fabric).
    sim_exporter_port: int = Field(default=9400, ge=1, le=65535)
    sim_step_seconds: float = Field(default=0.05, gt=0, le=3600)
    sim_test_seconds: float = Field(default=0.5, ge=0, le=3600)
    sim_hang_seconds: float = Field(default=3600, ge=0, le=86_400)

    # Slurm (scheduler=slurm). The training command is split shell-style once, never run
    # through a shell; sbatch arguments beyond these come from trusted site configuration.
    slurm_root: Path | None = Field(default=None, description="job dirs; <home>/slurm if unset")
    slurm_partition: str | None = None
    slurm_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    slurm_command: str = Field(default="", description="training command; sim trainer if empty")
    slurm_gpus: bool = Field(default=False, description="request --gpus-per-node (needs GRES)")
    slurm_export: str = Field(
        default="PATH,HOME,USER,LANG,LC_ALL,TZ",
        description="the only variables of the submitter's environment a job gets (sbatch "
        "--export; comma-separated names, empty for none)",
    )
    slurm_conf: Path | None = Field(
        default=None, validation_alias=AliasChoices("TRAINMEDIC_SLURM_CONF", "SLURM_CONF")
    )

    # The optional LLM fallback of the diagnosis (off unless url and model are set). Its key
    # from the environment or, better, from the Prefect Secret block named here.
    llm_url: str = ""
    llm_model: str = ""
    llm_api_key: SecretStr | None = None
    llm_api_key_block: str | None = None
    llm_timeout_s: float = Field(default=20.0, gt=0, le=600)

    # The diagnosis: a site's own signatures and Xid overrides, in a TOML file of the
    # signatures.toml format (trainmedic/diagnosis/data/README.md), merged once at first use.
    signatures_overlay: Path | None = Field(
        default=None,
        description="site overlay of signatures.toml (extra or replaced "
        "signatures, extra prefilter anchors, Xid code -> category overrides)",
    )

    # Telemetry (Prometheus text format, DCGM exporter metric names). One scrape's counters
    # are lifetime totals and never evidence; a Prometheus server (its base URL) gives their
    # increase over a failed job's window (its values at the job's start against now).
    telemetry_url: HttpUrl | None = None
    telemetry_query_url: HttpUrl | None = Field(
        default=None, description="Prometheus base URL, e.g. http://prometheus:9090"
    )
    http_timeout_s: float = Field(default=10.0, gt=0, le=300)

    # Playbooks. SSH host keys are checked against trainmedic's own known_hosts file (the
    # site fills it, e.g. from its SSH CA or `ssh-keyscan` at node install); turning the check
    # off is a deliberate setting, never a default.
    playbook_timeout_s: int = Field(default=600, ge=5, le=86_400)
    ansible_forks: int = Field(default=16, ge=1, le=512)
    ssh_host_key_checking: bool = True
    ssh_known_hosts: Path | None = Field(default=None, description="<home>/ssh/known_hosts")

    # Isolation policy (trainmedic.decisions.guard.IsolationPolicy): who may be drained unasked.
    drain_auto_approve_max: int = Field(default=1, ge=0, le=64)
    drain_max_share: float = Field(default=0.05, ge=0.0, le=1.0)
    drain_max_per_hour: int = Field(default=4, ge=0, le=10_000)
    drain_min_drainable: int = Field(default=1, ge=0, le=64)
    approval_timeout_s: int = Field(default=1800, ge=10, le=7 * 86_400)

    # Which events start a remediation: older ones are stale; owners limits the jobs managed.
    event_max_age_s: int = Field(default=3600, ge=60, le=7 * 86_400)
    managed_owners: str = Field(
        default="", description="comma-separated job owners trainmedic manages; empty: all"
    )
    # The scheduler's own scope of a job (Slurm's partition, account, comment): a site lets
    # trainmedic touch one team's partitions or accounts, or only jobs tagged in their comment.
    managed_partitions: Annotated[str, AfterValidator(_name_list)] = Field(
        default="", description="comma-separated partitions trainmedic manages; empty: all"
    )
    managed_accounts: Annotated[str, AfterValidator(_name_list)] = Field(
        default="", description="comma-separated accounts trainmedic manages; empty: all"
    )
    managed_comment_tag: Annotated[str, AfterValidator(_comment_tag)] = Field(
        default="", description="text the job's comment must contain; empty: no requirement"
    )
    # The intake (`trainmedic watch`, a service `trainmedic up` starts): seconds between polls.
    intake_interval_s: float = Field(default=5.0, gt=0, le=3600)
    # A failure whose event the server accepted but that no runbook took up this long after
    # (the server dropped the automation's action under load) is reported again, once. 0: never.
    intake_redeliver_after_s: float = Field(default=300.0, ge=0, le=86_400)
    # On-call: with a webhook URL (it usually holds a token: environment, never argv),
    # `trainmedic up` installs the notification automations sending to block notify_block.
    webhook_url: SecretStr | None = None
    notify_block: str = Field(default="trainmedic-oncall", pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")

    # A node drained lemon_drains times within lemon_window_days is a lemon: restore refuses it
    # without --force (the server keeps a week of actions, hence the window's limit).
    lemon_drains: int = Field(default=3, ge=2, le=100)
    lemon_window_days: float = Field(default=7.0, gt=0, le=7.0)
    # repair-node: resets and reboots wait for a human unless this is false; the
    # repair_escalate_after-th repair of one fault on one node within repair_window_days is
    # not made (hardware inspection instead); burn-in runs `dcgmi diag -r burn_in_dcgm_level`
    # (1 quick, 2 medium, 3 long, 4 extended; 0: a site without DCGM, the pair test only)
    # before the pair test.
    repair_approval: bool = True
    repair_escalate_after: int = Field(default=2, ge=1, le=10)
    repair_window_days: float = Field(default=7.0, gt=0, le=30.0)
    burn_in_dcgm_level: int = Field(default=2, ge=0, le=4)
    # The fleet report's racks: for nodes neither the inventory (trainmedic_rack) nor the
    # scheduler places, consecutive nodes (by name), this many to a rack. Its incident plots:
    # the steps either side of each failure, for the newest report_max_incident_plots.
    nodes_per_rack: int = Field(default=4, ge=1, le=1024)
    report_incident_steps: int = Field(default=60, ge=5, le=100_000)
    report_max_incident_plots: int = Field(default=12, ge=0, le=200)

    # Storms (trainmedic.decisions.incidents): failures that end within incident_window_s of
    # each other and share a node or leaf switch are one incident. A run that sees another
    # such failure already waits incident_settle_s for the rest before claiming them; a job
    # whose nodes overlap an undecided incident waits up to incident_wait_s for its decision
    # before it is resubmitted. incident_window_s 0: every failure is handled on its own.
    incident_window_s: float = Field(default=120.0, ge=0, le=3600)
    incident_settle_s: float = Field(default=3.0, ge=0, le=300)
    incident_wait_s: float = Field(default=600.0, ge=0, le=86_400)
    # A leaf switch is suspected (its nodes held out of placement, on-call paged) when every
    # tested node behind it failed its pair tests: at least switch_suspect_min_nodes, and at
    # least switch_suspect_share of the nodes behind it. The hold lasts switch_hold_s.
    switch_suspect_min_nodes: int = Field(default=3, ge=2, le=1024)
    switch_suspect_share: float = Field(default=0.5, gt=0.0, le=1.0)
    switch_hold_s: int = Field(default=4 * 3600, ge=60, le=7 * 86_400)

    # Circuit breaker (trainmedic.decisions.guard): destructive actions per window before it opens.
    breaker_limit: int = Field(default=20, ge=1, le=100_000)
    breaker_window_s: int = Field(default=3600, ge=60, le=7 * 86_400)

    # Recovery policy.
    retry_budget: int = Field(default=3, ge=0, le=50)
    crash_loop_after: int = Field(
        default=3, ge=2, le=50, description="N failed attempts in a row, whatever the diagnosis"
    )
    hang_timeout_s: float = Field(default=600, gt=0, le=86_400)
    # Below this diagnosis confidence no automatic destructive action: the plan pair-tests
    # instead of draining, and asks a human before a rollback
    # (trainmedic.decisions.remediation.DEFAULT_CONFIDENCE_FLOOR is the same default).
    confidence_floor: float = Field(default=0.5, ge=0.0, le=1.0)
    # Fail-slow: a running job whose last slow_recent_steps steps take slow_step_factor times
    # its own earlier steps (medians), slow for slow_min_s in all, raises job.slow (the
    # watchdog checks every minute).
    slow_step_factor: float = Field(default=2.0, gt=1.0, le=100)
    slow_recent_steps: int = Field(default=20, ge=3, le=10_000)
    slow_min_s: float = Field(default=60.0, ge=0, le=86_400)
    # Its pair test is stricter than a plain locate's (0.5): the job already showed a slow
    # node, and a throttled GPU costs a pair ~30 % of its bandwidth, not half.
    slow_pair_ratio: float = Field(default=0.8, gt=0.0, le=1.0)
    verify_timeout_s: float = Field(default=120.0, gt=0)
    # A resubmission still queued after this long is reported: it never started.
    pending_timeout_s: float = Field(default=6 * 3600.0, gt=0, le=7 * 86_400)
    # How long a fresh resubmission may stay PENDING before it counts as queued (a scheduler
    # cycle: Slurm starts a job that fits within seconds).
    queue_grace_s: float = Field(default=10.0, ge=0, le=600)

    @property
    def known_hosts(self) -> Path:
        return self.ssh_known_hosts or self.home / "ssh" / "known_hosts"

    @property
    def sim_home(self) -> Path:
        return self.home / "sim"

    @property
    def prefect_home(self) -> Path:
        return self.home / "prefect"

    @property
    def api_url(self) -> str:
        return f"http://{self.server_host}:{self.server_port}/api"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
