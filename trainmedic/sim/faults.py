"""A simulated node's fault: what the node's state says is wrong with it.

Kept apart from :mod:`trainmedic.sim.hardware` (pydantic models, counters, kernel log) and free
of anything but the standard library: the simulated fabric reads it once per pair test, in a
process of its own on this machine, where the real all_gather_perf would run on the nodes.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

STATE = "state.json"


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


# Faults that crash a rank on the faulty GPU (the others slow the job or cut it off).
GPU_FAULTS = (NodeFault.xid79, NodeFault.ecc, NodeFault.rowremap, NodeFault.nvlink)


def read_fault(node_dir: Path) -> NodeFault:
    """The node's fault from its state file (written whole, atomically); no state file is a
    node that is gone."""
    try:
        data = json.loads((node_dir / STATE).read_text())
    except FileNotFoundError:
        return NodeFault.down
    return NodeFault(data.get("fault", NodeFault.healthy))
