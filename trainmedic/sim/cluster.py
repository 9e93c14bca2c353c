"""The simulated cluster: its nodes (each a directory with its hardware state, kernel log and
the command wrappers that stand where nvidia-smi, dmesg, dcgmi... would), its racks and leaf
switches, and the Ansible inventory that reaches them. What one node's hardware does lives in
:mod:`trainmedic.sim.hardware`."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from pathlib import Path

import yaml

from trainmedic.core import validate
from trainmedic.core.errors import InputError
from trainmedic.core.files import read_json, write_json_atomic
from trainmedic.core.models import NodePlace
from trainmedic.core.settings import REPO_ROOT, get_settings
from trainmedic.sim.faults import STATE, NodeFault
from trainmedic.sim.hardware import (
    ECC_PER_FAULT,
    HARDWARE,
    KERNEL_LOG_RESTRICTED,
    MEMORY_FAULTS,
    NVLINK_CRC_PER_FAULT,
    XID_OF,
    NodeStatus,
    append_kernel_log,
    boot,
    node_status,
    pci_bus_id,
    read_hardware,
    xid_lines,
)

__all__ = ["COMMANDS", "MAX_NODES", "SimCluster"]

MAX_NODES = 1024
COMMANDS = ("nvidia-smi", "dmesg", "all_gather_perf", "dcgmi", "reboot", "boot-id")


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
        nodes_per_switch: int = 8,
        inventory_dir: Path | None = None,
    ) -> Path:
        """Create ``n_nodes`` healthy nodes and write their inventory. Returns the hosts file.
        The nodes sit in racks of ``nodes_per_switch``, each behind its own leaf switch
        (``rack01``/``leaf01`` for the first ones), as a top-of-rack fabric does."""
        if not 1 <= n_nodes <= MAX_NODES:
            raise InputError("nodes", n_nodes, f"must be between 1 and {MAX_NODES}")
        if not 1 <= nodes_per_switch <= MAX_NODES:
            raise InputError("nodes_per_switch", nodes_per_switch, f"must be 1..{MAX_NODES}")
        if not 1 <= gpus_per_node <= 16:
            raise InputError("gpus_per_node", gpus_per_node, "must be between 1 and 16")
        validate.hostname(f"{prefix}0001", "prefix")
        settings = get_settings()
        width = max(3, len(str(n_nodes)))
        names = [f"{prefix}{i:0{width}d}" for i in range(1, n_nodes + 1)]
        if self.nodes_dir.exists():
            shutil.rmtree(self.nodes_dir)
        for name in names:
            self._create_node(name)
        racks = [f"{i // nodes_per_switch + 1:02d}" for i in range(len(names))]
        topology = {
            name: {"rack": f"rack{rack}", "switch": f"leaf{rack}"}
            for name, rack in zip(names, racks, strict=True)
        }
        write_json_atomic(
            self.home / "cluster.json",
            {
                "nodes": names,
                "gpus_per_node": gpus_per_node,
                "topology": topology,
                # The fabric's timing, read by every simulated pair test (trainmedic.sim.fabric).
                "test_seconds": settings.sim_test_seconds,
                "hang_seconds": settings.sim_hang_seconds,
                "created": time.time(),
            },
        )
        return self.write_inventory(inventory_dir or REPO_ROOT / "inventories" / "sim")

    def _create_node(self, name: str) -> None:
        node_dir = self.nodes_dir / name
        bin_dir = node_dir / "bin"
        bin_dir.mkdir(parents=True)
        write_json_atomic(node_dir / STATE, NodeStatus(name=name).model_dump())
        boot(node_dir, time.time())
        for command in COMMANDS:
            wrapper = bin_dir / command
            # The wrapper stands where the real binary would; the argument vector is passed
            # through untouched ("$@"), never re-parsed by a shell.
            # The pair test has a module of its own, light to start (trainmedic.sim.fabric).
            module = "fabric" if command == "all_gather_perf" else "node"
            wrapper.write_text(
                "#!/bin/sh\n"
                f'exec "{sys.executable}" -m trainmedic.sim.{module} --node-dir "{node_dir}" '
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
        places = self.topology()
        hosts = {
            name: {
                "trainmedic_sim_node_dir": str(self.nodes_dir / name),
                # The fabric, declared as a site declares it (flows.tasks.node_topology).
                **({"trainmedic_rack": places[name].rack} if name in places else {}),
                **({"trainmedic_switch": places[name].switch} if name in places else {}),
            }
            for name in self.names()
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

    def topology(self) -> dict[str, NodePlace]:
        """Node -> its rack and leaf switch (none for a cluster created before racks)."""
        info = read_json(self.home / "cluster.json", {}) or {}
        return {n: NodePlace.model_validate(p) for n, p in (info.get("topology") or {}).items()}

    def behind(self, switch: str) -> list[str]:
        """The nodes behind leaf switch ``switch``."""
        nodes = [n for n, p in self.topology().items() if p.switch == switch]
        if not nodes:
            raise InputError("switch", switch, "no such leaf switch in the simulated cluster")
        return sorted(nodes)

    def fail_switch(self, switch: str, *, at: float | None = None) -> list[str]:
        """A leaf switch dies: every node behind it loses its fabric link at once."""
        nodes = self.behind(switch)
        for node in nodes:
            self.inject(node, NodeFault.link, at=at)
        return nodes

    @property
    def gpus_per_node(self) -> int:
        return int(read_json(self.home / "cluster.json", {"gpus_per_node": 4})["gpus_per_node"])

    def check_node(self, name: str, field: str = "node") -> str:
        validate.hostname(name, field)
        if not (self.nodes_dir / name / STATE).exists():
            raise InputError(field, name, "no such node in the simulated cluster")
        return name

    def status(self, name: str) -> NodeStatus:
        return node_status(self.nodes_dir / self.check_node(name))

    def statuses(self) -> list[NodeStatus]:
        return [self.status(n) for n in self.names()]

    def inject(
        self, name: str, fault: NodeFault | str, *, gpu: int = 0, at: float | None = None
    ) -> NodeStatus:
        """Put a node into a fault state, as the hardware would: the driver logs its Xid
        lines, the GPU's error counters count. ``at``: when it happened (default now; an
        earlier time is history, e.g. a fault of last week, and the node was up by then)."""
        try:
            fault = NodeFault(fault)
        except ValueError as exc:
            allowed = ", ".join(f.value for f in NodeFault)
            raise InputError("fault", fault, f"unknown fault; one of {allowed}") from exc
        if not 0 <= gpu < self.gpus_per_node:
            raise InputError("gpu", gpu, f"node has GPUs 0..{self.gpus_per_node - 1}")
        node_dir = self.nodes_dir / self.check_node(name)
        at = time.time() if at is None else at
        status = NodeStatus(name=name, fault=fault, gpu=gpu, since=at)
        write_json_atomic(node_dir / STATE, status.model_dump())
        hardware = read_hardware(node_dir)
        hardware.booted = min(hardware.booted, at - 60)
        counters = hardware.gpu(gpu)
        if fault in MEMORY_FAULTS:
            counters.ecc_dbe_volatile += ECC_PER_FAULT
            counters.ecc_dbe_aggregate += ECC_PER_FAULT
        if fault is NodeFault.nvlink:
            counters.nvlink_crc_flit += NVLINK_CRC_PER_FAULT
        counters.xid_last = XID_OF.get(fault, counters.xid_last)
        write_json_atomic(node_dir / HARDWARE, hardware.model_dump())
        append_kernel_log(node_dir, xid_lines(fault, gpu, pid=os.getpid()), at=at)
        return status

    def restrict_kernel_log(self, name: str, restricted: bool = True) -> None:
        """kernel.dmesg_restrict=1 on the node: its kernel log is refused without privilege
        (the simulated nodes are reached without become)."""
        flag = self.nodes_dir / self.check_node(name) / KERNEL_LOG_RESTRICTED
        if restricted:
            flag.touch()
        else:
            flag.unlink(missing_ok=True)

    def repair(self, name: str, *, reboot: bool = True, at: float | None = None) -> NodeStatus:
        """What the hardware team does; the node comes back healthy. ``reboot``: the node is
        rebooted (its kernel ring buffer starts empty, DCGM forgets the last Xid); else only
        its GPUs are reset (``nvidia-smi -r``, what a row remap asks for): the kernel log
        keeps the old Xid lines. Either way the volatile ECC count starts again and the
        lifetime counters (aggregate ECC, NVLink errors) keep their counts."""
        node_dir = self.nodes_dir / self.check_node(name)
        at = time.time() if at is None else at
        old = node_status(node_dir)
        status = NodeStatus(name=name, since=at)
        write_json_atomic(node_dir / STATE, status.model_dump())
        hardware = read_hardware(node_dir)
        for counters in hardware.gpus:
            counters.ecc_dbe_volatile = 0
        write_json_atomic(node_dir / HARDWARE, hardware.model_dump())
        if reboot:
            boot(node_dir, at)
        else:
            bus = pci_bus_id(old.gpu)
            append_kernel_log(node_dir, [f"NVRM: GPU at {bus} has been reset."], at=at)
        return status
