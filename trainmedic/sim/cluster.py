"""Simulated GPU nodes: their fault state, kernel log and command wrappers, and the Ansible
inventory that reaches them."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, Field

from trainmedic.core import validate
from trainmedic.core.errors import InputError
from trainmedic.core.files import read_json, write_json_atomic
from trainmedic.core.settings import REPO_ROOT

MAX_NODES = 1024
COMMANDS = ("nvidia-smi", "dmesg", "all_gather_perf", "dcgmi")


# A file in a node's directory: its kernel log is refused to an unprivileged reader.
KERNEL_LOG_RESTRICTED = "dmesg_restrict"


class NodeFault(StrEnum):
    healthy = "healthy"
    xid79 = "xid79"  # GPU fallen off the bus
    ecc = "ecc"  # uncorrectable ECC (Xid 48, row remap Xid 63)
    nvlink = "nvlink"  # NVLink fatal error (Xid 74)
    slow = "slow"  # degraded link: works, at a fraction of the bandwidth
    down = "down"  # unreachable: no ssh, no scheduler heartbeat
    overheat = "overheat"  # thermal slowdown


class NodeStatus(BaseModel):
    name: str
    fault: NodeFault = NodeFault.healthy
    gpu: int = Field(default=0, ge=0)  # which GPU carries the fault
    since: float = Field(default_factory=time.time)


def pci_bus_id(gpu: int) -> str:
    return f"00000000:{0x1B + 0x20 * gpu:02X}:00.0"


def xid_lines(fault: NodeFault, gpu: int, pid: int = 0) -> list[str]:
    """Kernel log lines the NVIDIA driver prints for this fault (NVRM Xid format)."""
    pci = f"PCI:0000:{0x1B + 0x20 * gpu:02x}:00"
    head = f"NVRM: Xid ({pci}): "
    if fault is NodeFault.xid79:
        return [f"{head}79, pid={pid}, name=python, GPU has fallen off the bus."]
    if fault is NodeFault.ecc:
        return [
            f"{head}48, pid={pid}, name=python, An uncorrectable double bit error (DBE) has "
            "been detected on GPU in the framebuffer at partition 0, subpartition 0.",
            f"{head}63, pid={pid}, name=python, Row Remapping: New row marked for remapping, "
            "reset gpu to activate.",
        ]
    if fault is NodeFault.nvlink:
        return [
            f"{head}74, pid={pid}, name=python, NVLink: fatal error detected on link 3"
            "(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"
        ]
    if fault is NodeFault.overheat:
        return [f"{head}62, pid={pid}, name=python, Internal micro-controller halt (thermal)"]
    return []


class SimCluster:
    """The simulated cluster under ``home`` (normally ``<TRAINMEDIC_HOME>/sim``)."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.nodes_dir = self.home / "nodes"

    # ------------------------------------------------------------------ creation

    def create(
        self,
        n_nodes: int = 16,
        *,
        gpus_per_node: int = 4,
        prefix: str = "node",
        inventory_dir: Path | None = None,
    ) -> Path:
        """Create ``n_nodes`` healthy nodes and write their inventory. Returns the hosts file."""
        if not 1 <= n_nodes <= MAX_NODES:
            raise InputError("nodes", n_nodes, f"must be between 1 and {MAX_NODES}")
        if not 1 <= gpus_per_node <= 16:
            raise InputError("gpus_per_node", gpus_per_node, "must be between 1 and 16")
        validate.hostname(f"{prefix}0001", "prefix")
        width = max(3, len(str(n_nodes)))
        names = [f"{prefix}{i:0{width}d}" for i in range(1, n_nodes + 1)]
        if self.nodes_dir.exists():
            shutil.rmtree(self.nodes_dir)
        for name in names:
            self._create_node(name)
        write_json_atomic(
            self.home / "cluster.json",
            {"nodes": names, "gpus_per_node": gpus_per_node, "created": time.time()},
        )
        return self.write_inventory(inventory_dir or REPO_ROOT / "inventories" / "sim")

    def _create_node(self, name: str) -> None:
        node_dir = self.nodes_dir / name
        bin_dir = node_dir / "bin"
        bin_dir.mkdir(parents=True)
        (node_dir / "kern.log").touch()
        write_json_atomic(node_dir / "state.json", NodeStatus(name=name).model_dump())
        for command in COMMANDS:
            wrapper = bin_dir / command
            # The wrapper stands where the real binary would; the argument vector is passed
            # through untouched ("$@"), never re-parsed by a shell.
            wrapper.write_text(
                "#!/bin/sh\n"
                f'exec "{sys.executable}" -m trainmedic.sim.node --node-dir "{node_dir}" '
                f'{command} "$@"\n'
            )
            wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def write_inventory(self, inventory_dir: Path) -> Path:
        """Write ``hosts.yml`` for the sim nodes (group_vars stay in the committed tree)."""
        inventory_dir = Path(inventory_dir)
        inventory_dir.mkdir(parents=True, exist_ok=True)
        committed_vars = REPO_ROOT / "inventories" / "sim" / "group_vars"
        if not (inventory_dir / "group_vars").exists():
            shutil.copytree(committed_vars, inventory_dir / "group_vars")
        hosts = {
            name: {"trainmedic_sim_node_dir": str(self.nodes_dir / name)} for name in self.names()
        }
        inventory = {"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}
        hosts_file = inventory_dir / "hosts.yml"
        hosts_file.write_text(
            "# Generated by `trainmedic sim create`; do not edit.\n"
            + yaml.safe_dump(inventory, sort_keys=True)
        )
        return hosts_file

    # ------------------------------------------------------------------ state

    @property
    def exists(self) -> bool:
        return (self.home / "cluster.json").exists()

    def names(self) -> list[str]:
        info = read_json(self.home / "cluster.json", {"nodes": []})
        return list(info["nodes"])

    @property
    def gpus_per_node(self) -> int:
        return int(read_json(self.home / "cluster.json", {"gpus_per_node": 4})["gpus_per_node"])

    def check_node(self, name: str, field: str = "node") -> str:
        validate.hostname(name, field)
        if not (self.nodes_dir / name / "state.json").exists():
            raise InputError(field, name, "no such node in the simulated cluster")
        return name

    def status(self, name: str) -> NodeStatus:
        return node_status(self.nodes_dir / self.check_node(name))

    def statuses(self) -> list[NodeStatus]:
        return [self.status(n) for n in self.names()]

    def inject(self, name: str, fault: NodeFault | str, *, gpu: int = 0) -> NodeStatus:
        """Put a node into a fault state, as the hardware would, and log what the driver logs."""
        try:
            fault = NodeFault(fault)
        except ValueError as exc:
            allowed = ", ".join(f.value for f in NodeFault)
            raise InputError("fault", fault, f"unknown fault; one of {allowed}") from exc
        if not 0 <= gpu < self.gpus_per_node:
            raise InputError("gpu", gpu, f"node has GPUs 0..{self.gpus_per_node - 1}")
        node_dir = self.nodes_dir / self.check_node(name)
        status = NodeStatus(name=name, fault=fault, gpu=gpu)
        write_json_atomic(node_dir / "state.json", status.model_dump())
        append_kernel_log(node_dir, xid_lines(fault, gpu, pid=os.getpid()))
        return status

    def restrict_kernel_log(self, name: str, restricted: bool = True) -> None:
        """kernel.dmesg_restrict=1 on the node: its kernel log is refused without privilege
        (the simulated nodes are reached without become)."""
        flag = self.nodes_dir / self.check_node(name) / KERNEL_LOG_RESTRICTED
        if restricted:
            flag.touch()
        else:
            flag.unlink(missing_ok=True)

    def repair(self, name: str) -> NodeStatus:
        """What the hardware team does: swap the part; the node comes back healthy."""
        node_dir = self.nodes_dir / self.check_node(name)
        status = NodeStatus(name=name)
        write_json_atomic(node_dir / "state.json", status.model_dump())
        append_kernel_log(node_dir, ["NVRM: loading NVIDIA UNIX x86_64 Kernel Module (repaired)"])
        return status


def node_status(node_dir: Path) -> NodeStatus:
    data = read_json(node_dir / "state.json")
    if data is None:
        return NodeStatus(name=node_dir.name, fault=NodeFault.down)
    return NodeStatus.model_validate(data)


def append_kernel_log(node_dir: Path, lines: list[str]) -> None:
    if not lines:
        return
    stamp = datetime.now(UTC).strftime("%a %b %d %H:%M:%S %Y")
    with (node_dir / "kern.log").open("a") as handle:
        for line in lines:
            handle.write(f"[{stamp}] {line}\n")
