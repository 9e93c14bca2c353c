"""Run playbooks through ansible-runner and return structured results.

Every run gets its own private data directory under ``<home>/ansible/`` (kept: it is the
record of what ran, with Ansible's own event log). Targets are validated hostnames that must be
in the inventory, and extra vars are built only from validated values, so nothing a user or a
log line wrote can reach a shell or a Jinja template.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ansible_runner
import yaml

from trainmedic.core import validate
from trainmedic.core.errors import ConfigError, InputError, PlaybookError, PlaybookTimeout
from trainmedic.core.models import HostOutcome, NodePlace, PlaybookResult
from trainmedic.core.settings import REPO_ROOT, Settings, get_settings

SAFE_VAR_TYPES = (bool, int, float)


class Inventory:
    """The hosts of a static YAML inventory directory (``hosts.yml`` + ``group_vars``)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def hosts(self) -> set[str]:
        return set(self._host_vars())

    def places(self) -> dict[str, NodePlace]:
        """The fabric as the site declares it: each host's ``trainmedic_rack`` and
        ``trainmedic_switch`` (hosts that declare neither are left out)."""
        places = {}
        for host, hostvars in self._host_vars().items():
            rack, switch = hostvars.get("trainmedic_rack"), hostvars.get("trainmedic_switch")
            if rack or switch:
                places[host] = NodePlace(
                    rack=str(rack) if rack else None, switch=str(switch) if switch else None
                )
        return places

    def _host_vars(self) -> dict[str, Mapping[str, Any]]:
        files = [self.path] if self.path.is_file() else sorted(self.path.glob("*.y*ml"))
        if not files:
            raise ConfigError(
                f"inventory {self.path}: no hosts file (run `trainmedic sim create`?)"
            )
        found: dict[str, Mapping[str, Any]] = {}
        for file in files:
            try:
                _collect_hosts(yaml.safe_load(file.read_text()) or {}, found)
            except yaml.YAMLError as exc:
                raise ConfigError(f"inventory {file}: not valid YAML: {exc}") from exc
        return found

    def check(self, targets: Sequence[str], field: str = "nodes") -> list[str]:
        known = self.hosts()
        checked = []
        for target in targets:
            validate.hostname(target, field)
            if target not in known:
                raise InputError(field, target, f"not in the inventory {self.path}")
            checked.append(target)
        return checked


def _collect_hosts(group: Mapping[str, Any], found: dict[str, Mapping[str, Any]]) -> None:
    for key, value in group.items():
        if key == "hosts" and isinstance(value, Mapping):
            for host, hostvars in value.items():
                own = hostvars if isinstance(hostvars, Mapping) else {}
                merged = {**found.get(host, {}), **own}
                found[host] = merged
        elif isinstance(value, Mapping):
            _collect_hosts(value, found)


def playbook_vars(extravars: Mapping[str, object], hosts: Sequence[str]) -> dict[str, object]:
    """The run's extra vars: the caller's, restricted, and the target pattern. The pattern is
    built from inventory hostnames only (checked by the caller) and grows with the run: 128
    pair tests in one run name 128 leaders, past the free-text limit of a variable."""
    return {**_safe_extravars(extravars), "trainmedic_target": ":".join(hosts)}


def _safe_extravars(extravars: Mapping[str, object]) -> dict[str, object]:
    safe: dict[str, object] = {}
    for key, value in extravars.items():
        if not key.startswith("trainmedic_"):
            raise InputError("extravars", key, "only trainmedic_* variables may be passed")
        if isinstance(value, str):
            # Strings reaching Ansible are limited to a charset that cannot open a Jinja
            # expression or a shell construct.
            if not validate.SAFE_TEXT_RE.match(value):
                raise InputError(key, value, "contains characters not allowed in playbook vars")
        elif isinstance(value, list | tuple):
            for item in value:
                if not isinstance(item, str | int) or (
                    isinstance(item, str) and not validate.SAFE_TEXT_RE.match(item)
                ):
                    raise InputError(key, item, "not allowed in playbook vars")
            safe[key] = list(value)
            continue
        elif not isinstance(value, SAFE_VAR_TYPES):
            raise InputError(key, value, f"type {type(value).__name__} not allowed")
        safe[key] = value
    return safe


RUN_MARKER = "TRAINMEDIC_PLAYBOOK_RUN"


def kill_marked_processes(run_id: str) -> int:
    """SIGKILL every process whose environment carries this run's marker.

    ansible-runner stops ansible-playbook at its timeout, but the forks and the commands they
    started (a hung allgather) are orphaned and live on, holding GPUs and ports.
    """
    wanted = f"{RUN_MARKER}={run_id}".encode()
    killed = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if wanted in environ.split(b"\0"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
    return killed


def run_playbook(
    playbook: str,
    targets: Sequence[str],
    extravars: Mapping[str, object] | None = None,
    *,
    check: bool = False,
    timeout_s: int | None = None,
    settings: Settings | None = None,
    tolerate_unreachable: bool = True,
) -> PlaybookResult:
    """Run ``playbooks/<playbook>`` on ``targets``; raise PlaybookError if it could not run."""
    settings = settings or get_settings()
    playbook_path = (settings.playbook_dir / playbook).resolve()
    if playbook_path.parent != settings.playbook_dir.resolve() or not playbook_path.is_file():
        raise InputError("playbook", playbook, f"no such playbook in {settings.playbook_dir}")
    inventory = Inventory(settings.inventory)
    hosts = inventory.check(targets)
    if not hosts:
        raise InputError("nodes", list(targets), "no target node")
    variables = playbook_vars(extravars or {}, hosts)

    stamp = time.strftime("%Y%m%dT%H%M%S")
    run_id = uuid.uuid4().hex[:8]
    private = settings.home / "ansible" / f"{stamp}-{playbook_path.stem}-{run_id}"
    private.mkdir(parents=True)
    bin_dir = str(Path(sys.executable).parent)
    envvars = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        # The project's ansible.cfg (interpreter discovery on the nodes: a GPU node's Python is
        # not the controller's), whatever directory ansible-runner runs in.
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "ANSIBLE_CONNECTION_PLUGINS": str(REPO_ROOT / "playbooks" / "connection_plugins"),
        "ANSIBLE_HOST_KEY_CHECKING": str(settings.ssh_host_key_checking),
        "ANSIBLE_TIMEOUT": "10",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_NOCOLOR": "1",
        # Inherited by every process of the run (forks, modules, the commands they start):
        # after a timeout, this is how the leftovers are found.
        RUN_MARKER: run_id,
    }
    if settings.ssh_host_key_checking:
        # An unknown or changed host key fails the connection (UNREACHABLE), never a prompt.
        envvars["ANSIBLE_SSH_EXTRA_ARGS"] = (
            f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={settings.known_hosts}"
        )
    try:
        runner = ansible_runner.run(
            private_data_dir=str(private),
            playbook=str(playbook_path),
            inventory=str(settings.inventory),
            extravars=variables,
            limit=",".join(hosts),
            forks=settings.ansible_forks,
            cmdline="--check --diff" if check else None,
            envvars=envvars,
            timeout=timeout_s or settings.playbook_timeout_s,
            quiet=True,
            suppress_env_files=False,
            fact_cache_type="memory",
        )
    except Exception as exc:  # ansible-runner raises bare exceptions for setup problems
        raise PlaybookError(f"{playbook}: ansible-runner could not start: {exc}") from exc

    stats = runner.stats or {}
    outcomes: dict[str, HostOutcome] = {}
    for host in hosts:
        if host in (stats.get("dark") or {}):
            outcomes[host] = HostOutcome.unreachable
        elif host in (stats.get("failures") or {}):
            outcomes[host] = HostOutcome.failed
        elif host in (stats.get("ok") or {}) or host in (stats.get("changed") or {}):
            outcomes[host] = HostOutcome.ok
        else:
            outcomes[host] = HostOutcome.skipped
    if runner.status == "timeout":
        killed = kill_marked_processes(run_id)
        if killed:
            logging.getLogger(__name__).warning(
                "%s timed out: killed %d leftover processes", playbook, killed
            )
        raise PlaybookTimeout(
            f"{playbook}: timed out after {timeout_s or settings.playbook_timeout_s} s"
        )
    if not stats and runner.rc != 0:
        stdout = (private / "artifacts").rglob("stdout")
        tail = "".join(p.read_text()[-2000:] for p in stdout)
        raise PlaybookError(f"{playbook}: ansible-playbook failed (rc={runner.rc}): {tail.strip()}")
    facts: dict[str, dict[str, object]] = {host: {} for host in hosts}
    for event in runner.events:
        # Facts set by the playbook (set_fact) travel in the runner_on_ok events: that is the
        # playbook's structured output, no stdout scraping.
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_ok" and data.get("host") in facts:
            facts[data["host"]].update((data.get("res") or {}).get("ansible_facts") or {})
    result = PlaybookResult(
        playbook=playbook,
        status=runner.status,
        rc=runner.rc,
        hosts=outcomes,
        facts=facts,
        check_mode=check,
        private_data_dir=str(private),
    )
    if not tolerate_unreachable and HostOutcome.unreachable in outcomes.values():
        raise PlaybookError(f"{playbook}: unreachable: {', '.join(result.failed_hosts)}")
    return result
