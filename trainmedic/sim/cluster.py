"""Simulated GPU nodes: their fault state, kernel log and command wrappers, and the Ansible
inventory that reaches them.

As on a real node, the kernel log is a ring buffer that lives until the node reboots
(``kern.log``: one record a line, the time it was logged and the message; ``dmesg`` prints
it in the format asked for), and the GPUs' error counters (``hardware.json``, read by the
simulated nvidia-smi and DCGM exporter) are not wound back by a repair: the aggregate ECC
count lives in the GPU's InfoROM and the NVLink error counters keep counting; only the
volatile ECC count starts again when the driver reloads (a reboot or a GPU reset), and DCGM
forgets the last Xid when it restarts with the node."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, Field

from trainmedic.core import validate
from trainmedic.core.errors import InputError
from trainmedic.core.files import read_json, write_json_atomic
from trainmedic.core.models import NodePlace
from trainmedic.core.settings import REPO_ROOT

MAX_NODES = 1024
COMMANDS = ("nvidia-smi", "dmesg", "all_gather_perf", "dcgmi", "reboot", "boot-id")


# A file in a node's directory: its kernel log is refused to an unprivileged reader.
KERNEL_LOG_RESTRICTED = "dmesg_restrict"
KERNEL_LOG = "kern.log"
HARDWARE = "hardware.json"
DRIVER = "550.127.05"


class NodeFault(StrEnum):
    healthy = "healthy"
    xid79 = "xid79"  # GPU fallen off the bus
    ecc = "ecc"  # uncorrectable ECC (Xid 48, row remap Xid 63): a GPU reset remaps the row
    # Uncorrectable ECC and the row remap failed (Xid 48, Xid 64): out of spare rows, no
    # reset or reboot fixes it (NVIDIA's RMA policy).
    rowremap = "rowremap"
    nvlink = "nvlink"  # NVLink fatal error (Xid 74)
    slow = "slow"  # degraded link: works, at a fraction of the bandwidth
    down = "down"  # unreachable: no ssh, no scheduler heartbeat
    # Its fabric link is gone (its leaf switch died, or its NIC port): ssh, GPUs and the
    # scheduler are fine, but collectives with other nodes fail (NCCL timeouts, pair tests).
    link = "link"
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
    if fault is NodeFault.rowremap:
        return [
            f"{head}48, pid={pid}, name=python, An uncorrectable double bit error (DBE) has "
            "been detected on GPU in the framebuffer at partition 0, subpartition 0.",
            f"{head}64, pid={pid}, name=python, Row Remapping: Failed to remap row, no spare "
            "rows left in bank.",
        ]
    if fault is NodeFault.nvlink:
        return [
            f"{head}74, pid={pid}, name=python, NVLink: fatal error detected on link 3"
            "(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"
        ]
    if fault is NodeFault.overheat:
        return [f"{head}62, pid={pid}, name=python, Internal micro-controller halt (thermal)"]
    return []


def gpu_temperature(gpu: int, *, hot: bool) -> int:
    """A GPU's temperature (C): 41 C and up when cool, 96 C when overheating (throttling)."""
    return 96 if hot else 41 + gpu


class GpuCounters(BaseModel):
    """One GPU's error counters as NVML/DCGM report them."""

    ecc_dbe_volatile: int = 0  # since the driver was loaded (nvidia-smi's "volatile")
    ecc_dbe_aggregate: int = 0  # the GPU's lifetime (InfoROM): survives resets and reboots
    nvlink_crc_flit: int = 0  # NVLink flow-control CRC errors: keep counting
    xid_last: int = 0  # DCGM's last Xid; forgotten when DCGM restarts (a reboot)


class Hardware(BaseModel):
    """A node's boot time and its GPUs' counters."""

    booted: float = Field(default_factory=time.time)
    gpus: list[GpuCounters] = Field(default_factory=list)

    def gpu(self, index: int) -> GpuCounters:
        while len(self.gpus) <= index:
            self.gpus.append(GpuCounters())
        return self.gpus[index]


# What each fault adds to the faulty GPU's counters, and the Xid DCGM reports for it.
XID_OF = {
    NodeFault.xid79: 79,
    NodeFault.ecc: 48,
    NodeFault.rowremap: 64,
    NodeFault.nvlink: 74,
    NodeFault.overheat: 62,
}
# Faults that crash a rank on the faulty GPU (the others slow the job or cut it off).
GPU_FAULTS = (NodeFault.xid79, NodeFault.ecc, NodeFault.rowremap, NodeFault.nvlink)
MEMORY_FAULTS = (NodeFault.ecc, NodeFault.rowremap)
# What clears each fault, as on real hardware. A GPU reset (nvidia-smi -r) applies a pending
# row remap and retrains NVLinks; a GPU lost from the bus needs the OS to find it again (a
# reboot); a failed row remap, a bad cable, a dead switch port, cooling and a dead node need
# hands on the hardware (SimCluster.repair).
CLEARED_BY_RESET = (NodeFault.ecc, NodeFault.nvlink)
CLEARED_BY_REBOOT = (NodeFault.ecc, NodeFault.nvlink, NodeFault.xid79)
ECC_PER_FAULT = 2
NVLINK_CRC_PER_FAULT = 1843


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
                "created": time.time(),
            },
        )
        return self.write_inventory(inventory_dir or REPO_ROOT / "inventories" / "sim")

    def _create_node(self, name: str) -> None:
        node_dir = self.nodes_dir / name
        bin_dir = node_dir / "bin"
        bin_dir.mkdir(parents=True)
        write_json_atomic(node_dir / "state.json", NodeStatus(name=name).model_dump())
        boot(node_dir, time.time())
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
        if not (self.nodes_dir / name / "state.json").exists():
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
        write_json_atomic(node_dir / "state.json", status.model_dump())
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
        write_json_atomic(node_dir / "state.json", status.model_dump())
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


def node_status(node_dir: Path) -> NodeStatus:
    data = read_json(node_dir / "state.json")
    if data is None:
        return NodeStatus(name=node_dir.name, fault=NodeFault.down)
    return NodeStatus.model_validate(data)


def read_hardware(node_dir: Path) -> Hardware:
    data = read_json(node_dir / HARDWARE)
    return Hardware() if data is None else Hardware.model_validate(data)


def boot(node_dir: Path, at: float) -> None:
    """The node (re)boots at ``at``: an empty ring buffer with the boot lines, DCGM restarted,
    the driver loaded (volatile ECC counts start again); lifetime counters are kept."""
    hardware = read_hardware(node_dir)
    hardware.booted = at
    for counters in hardware.gpus:
        counters.ecc_dbe_volatile = 0
        counters.xid_last = 0
    write_json_atomic(node_dir / HARDWARE, hardware.model_dump())
    (node_dir / KERNEL_LOG).write_text("")
    append_kernel_log(
        node_dir,
        [
            "Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103) #49-Ubuntu SMP",
            f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {DRIVER}",
        ],
        at=at,
    )


def append_kernel_log(node_dir: Path, lines: list[str], *, at: float | None = None) -> None:
    """Log kernel lines at ``at`` (default now): one ``<epoch seconds> <message>`` record a
    line, as the ring buffer keeps a time with each message."""
    if not lines:
        return
    stamp = time.time() if at is None else at
    with (node_dir / KERNEL_LOG).open("a") as handle:
        for line in lines:
            handle.write(f"{stamp:.6f} {line}\n")


def kernel_records(node_dir: Path) -> list[tuple[float, str]]:
    """The ring buffer: (epoch seconds, message), oldest first."""
    try:
        text = (node_dir / KERNEL_LOG).read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        stamp, _, message = line.partition(" ")
        try:
            records.append((float(stamp), message))
        except ValueError:  # a ring buffer of an older simulator: the time is lost
            records.append((0.0, line))
    return records


def reset_gpu(node_dir: Path, gpu: int, *, at: float | None = None) -> bool:
    """``nvidia-smi -r`` on one GPU: the driver reinitialises it (the volatile ECC count starts
    again, the kernel logs the reset) and the faults a reset clears are gone. False: the GPU
    is lost from the bus and cannot be reset."""
    status = node_status(node_dir)
    if status.fault is NodeFault.xid79 and status.gpu == gpu:
        return False
    at = time.time() if at is None else at
    hardware = read_hardware(node_dir)
    hardware.gpu(gpu).ecc_dbe_volatile = 0
    write_json_atomic(node_dir / HARDWARE, hardware.model_dump())
    append_kernel_log(node_dir, [f"NVRM: GPU at {pci_bus_id(gpu)} has been reset."], at=at)
    if status.gpu == gpu and status.fault in CLEARED_BY_RESET:
        write_json_atomic(
            node_dir / "state.json", NodeStatus(name=status.name, since=at).model_dump()
        )
    return True


def reboot(node_dir: Path, *, at: float | None = None) -> None:
    """The node reboots: a new boot (empty ring buffer, DCGM restarted, the driver reloaded)
    and the faults a reboot clears are gone; the others are still there after it, and their
    Xid lines come back as the driver finds the fault again."""
    status = node_status(node_dir)
    at = time.time() if at is None else at
    boot(node_dir, at)
    if status.fault in CLEARED_BY_REBOOT:
        write_json_atomic(
            node_dir / "state.json", NodeStatus(name=status.name, since=at).model_dump()
        )
    elif status.fault is not NodeFault.healthy:
        append_kernel_log(node_dir, xid_lines(status.fault, status.gpu), at=at + 1)
