"""A simulated GPU node's hardware: its fault, its GPUs' error counters, its kernel ring
buffer, and what a GPU reset and a reboot do to them.

As on a real node, the kernel log is a ring buffer that lives until the node reboots
(``kern.log``: one record a line, the time it was logged and the message; ``dmesg`` prints
it in the format asked for), and the GPUs' error counters (``hardware.json``, read by the
simulated nvidia-smi and DCGM exporter) are not wound back by a repair: the aggregate ECC
count lives in the GPU's InfoROM and the NVLink error counters keep counting; only the
volatile ECC count starts again when the driver reloads (a reboot or a GPU reset), and DCGM
forgets the last Xid when it restarts with the node."""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel, Field

from trainmedic.core.files import read_json, write_json_atomic
from trainmedic.sim.faults import STATE, NodeFault

# A file in a node's directory: its kernel log is refused to an unprivileged reader.
KERNEL_LOG_RESTRICTED = "dmesg_restrict"
KERNEL_LOG = "kern.log"
HARDWARE = "hardware.json"
DRIVER = "550.127.05"


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
MEMORY_FAULTS = (NodeFault.ecc, NodeFault.rowremap)
# What clears each fault, as on real hardware. A GPU reset (nvidia-smi -r) applies a pending
# row remap and retrains NVLinks; a GPU lost from the bus needs the OS to find it again (a
# reboot); a failed row remap, a bad cable, a dead switch port, cooling and a dead node need
# hands on the hardware (SimCluster.repair).
CLEARED_BY_RESET = (NodeFault.ecc, NodeFault.nvlink)
CLEARED_BY_REBOOT = (NodeFault.ecc, NodeFault.nvlink, NodeFault.xid79)
ECC_PER_FAULT = 2
NVLINK_CRC_PER_FAULT = 1843


def node_status(node_dir: Path) -> NodeStatus:
    data = read_json(node_dir / STATE)
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
        write_json_atomic(node_dir / STATE, NodeStatus(name=status.name, since=at).model_dump())
    return True


def reboot(node_dir: Path, *, at: float | None = None) -> None:
    """The node reboots: a new boot (empty ring buffer, DCGM restarted, the driver reloaded)
    and the faults a reboot clears are gone; the others are still there after it, and their
    Xid lines come back as the driver finds the fault again."""
    status = node_status(node_dir)
    at = time.time() if at is None else at
    boot(node_dir, at)
    if status.fault in CLEARED_BY_REBOOT:
        write_json_atomic(node_dir / STATE, NodeStatus(name=status.name, since=at).model_dump())
    elif status.fault is not NodeFault.healthy:
        append_kernel_log(node_dir, xid_lines(status.fault, status.gpu), at=at + 1)
