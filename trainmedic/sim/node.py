"""Simulated node commands: ``python -m trainmedic.sim.node --node-dir DIR COMMAND ARGS...``.

Each behaves like the real tool on a node in the given fault state: same output format, same
exit codes, and the same way of failing (nvidia-smi on a lost GPU exits 15; dcgmi diag fails
the NVLink test on a node with an NVLink fault). The pair test, all_gather_perf, is
:mod:`trainmedic.sim.fabric`.
"""

from __future__ import annotations

import hashlib
import sys
from datetime import datetime
from pathlib import Path

from trainmedic.sim.fabric import CLUSTER, GPU_NAME
from trainmedic.sim.faults import NodeFault
from trainmedic.sim.hardware import (
    KERNEL_LOG_RESTRICTED,
    MEMORY_FAULTS,
    Hardware,
    NodeStatus,
    gpu_temperature,
    kernel_records,
    node_status,
    pci_bus_id,
    read_hardware,
    reboot,
    reset_gpu,
)

LOST_GPU_RC = 15


def _gpus(node_dir: Path) -> int:
    cluster = node_dir.parent.parent / CLUSTER
    try:
        import json

        return int(json.loads(cluster.read_text())["gpus_per_node"])
    except (OSError, ValueError, KeyError):
        return 4


def _unreachable(status: NodeStatus) -> int:
    print(f"ssh: connect to host {status.name} port 22: No route to host", file=sys.stderr)
    return 255


# ----------------------------------------------------------------------------- nvidia-smi


def nvidia_smi(node_dir: Path, argv: list[str]) -> int:
    status = node_status(node_dir)
    if status.fault is NodeFault.down:
        return _unreachable(status)
    if "-r" in argv or "--gpu-reset" in argv:
        return gpu_reset(node_dir, argv)
    gpus = _gpus(node_dir)
    if status.fault is NodeFault.xid79:
        print(
            f"Unable to determine the device handle for GPU{pci_bus_id(status.gpu)}: "
            "GPU is lost.  Reboot the system to recover this GPU"
        )
        return LOST_GPU_RC
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    hardware = read_hardware(node_dir)
    rows = [_gpu_row(status, hardware, gpu) for gpu in range(gpus)]
    if query is None:
        print(f"{'GPU':<4}{'Name':<24}{'Bus-Id':<18}{'Temp':>6}{'Uncorr. ECC':>13}")
        for row in rows:
            print(
                f"{row['index']:<4}{row['name']:<24}{row['pci.bus_id']:<18}"
                f"{row['temperature.gpu']:>5}C{row['ecc.errors.uncorrected.volatile.total']:>13}"
            )
        return 0
    fields = [f.strip() for f in query.split(",")]
    unknown = [f for f in fields if f not in rows[0]]
    if unknown:
        print(f'Field "{unknown[0]}" is not a valid field to query.', file=sys.stderr)
        return 2
    for row in rows:
        print(", ".join(str(row[f]) for f in fields))
    return 0


def _gpu_row(status: NodeStatus, hardware: Hardware, gpu: int) -> dict[str, object]:
    faulty = gpu == status.gpu
    hot = faulty and status.fault is NodeFault.overheat
    return {
        "index": gpu,
        "name": GPU_NAME,
        "pci.bus_id": pci_bus_id(gpu),
        "temperature.gpu": gpu_temperature(gpu, hot=hot),
        "utilization.gpu": 0,
        "ecc.errors.uncorrected.volatile.total": hardware.gpu(gpu).ecc_dbe_volatile,
        "ecc.errors.uncorrected.aggregate.total": hardware.gpu(gpu).ecc_dbe_aggregate,
        "clocks_throttle_reasons.hw_thermal_slowdown": "Active" if hot else "Not Active",
    }


# ----------------------------------------------------------------------------- dmesg


DMESG_FORMATS = ("raw", "ctime", "iso", "notime")


def dmesg(node_dir: Path, argv: list[str]) -> int:
    """util-linux dmesg: seconds since boot by default, ``-T``/``--ctime`` local wall time,
    ``--time-format iso`` ISO 8601 with the zone, ``-t``/``--notime`` none."""
    status = node_status(node_dir)
    if status.fault is NodeFault.down:
        return _unreachable(status)
    style = _dmesg_style(argv)
    if style is None:
        return 1
    if (node_dir / KERNEL_LOG_RESTRICTED).exists():
        # kernel.dmesg_restrict=1 and no privilege: util-linux dmesg's own words and status.
        print("dmesg: read kernel buffer failed: Operation not permitted", file=sys.stderr)
        return 1
    booted = read_hardware(node_dir).booted
    for at, message in kernel_records(node_dir):
        print(_dmesg_line(style, at, booted, message))
    return 0


def _dmesg_style(argv: list[str]) -> str | None:
    style = "raw"
    args = iter(argv)
    for arg in args:
        if arg in ("-T", "--ctime"):
            style = "ctime"
        elif arg in ("-t", "--notime"):
            style = "notime"
        elif arg == "--time-format" or arg.startswith("--time-format="):
            value = arg.split("=", 1)[1] if "=" in arg else next(args, "")
            if value not in DMESG_FORMATS or value == "raw":
                print(f"dmesg: unknown time format: {value}", file=sys.stderr)
                return None
            style = value
        else:
            print(f"dmesg: unrecognized option '{arg}'", file=sys.stderr)
            print("Try 'dmesg --help' for more information.", file=sys.stderr)
            return None
    return style


def _dmesg_line(style: str, at: float, booted: float, message: str) -> str:
    local = datetime.fromtimestamp(at).astimezone()
    if style == "ctime":
        return f"[{local:%a %b} {local.day:2d} {local:%H:%M:%S %Y}] {message}"
    if style == "iso":
        zone = local.strftime("%z")
        return f"{local:%Y-%m-%dT%H:%M:%S},{local.microsecond:06d}{zone[:3]}:{zone[3:]} {message}"
    if style == "notime":
        return message
    return f"[{max(at - booted, 0.0):12.6f}] {message}"


# ----------------------------------------------------------------------------- dcgmi


def dcgmi(node_dir: Path, argv: list[str]) -> int:
    """``dcgmi diag -r LEVEL``: level 1 the quick deployment checks (a lost GPU fails them),
    2 adds the PCIe, memory and NVLink tests, 3 and 4 the targeted stress that finds a GPU
    that overheats. Exit 1 when a test fails, as dcgmi does."""
    status = node_status(node_dir)
    if status.fault is NodeFault.down:
        return _unreachable(status)
    level = 1
    if "-r" in argv and argv.index("-r") + 1 < len(argv):
        value = argv[argv.index("-r") + 1]
        if value not in ("1", "2", "3", "4"):
            print(f"Error: invalid run level '{value}'", file=sys.stderr)
            return 2
        level = int(value)
    fails = {
        "Deployment": status.fault is NodeFault.xid79,
        "PCIe": status.fault is NodeFault.xid79,
        "Memory": status.fault in MEMORY_FAULTS,
        "NVLink": status.fault is NodeFault.nvlink,
        "Targeted Stress": status.fault is NodeFault.overheat,
    }
    tests = ["Deployment"] + (["PCIe", "Memory", "NVLink"] if level >= 2 else [])
    tests += ["Targeted Stress"] if level >= 3 else []
    verdicts = {test: (f"Fail - GPU: {status.gpu}" if fails[test] else "Pass") for test in tests}
    print("+---------------------------+------------------------------------------------+")
    print("| Diagnostic                | Result                                         |")
    print("+===========================+================================================+")
    for test, verdict in verdicts.items():
        print(f"| {test:<25} | {verdict:<46} |")
    print("+---------------------------+------------------------------------------------+")
    return 1 if any(v.startswith("Fail") for v in verdicts.values()) else 0


# ----------------------------------------------------------------------------- repairs


def gpu_reset(node_dir: Path, argv: list[str]) -> int:
    """``nvidia-smi -r [-i GPU]``: GPU ids are indexes or PCI bus ids."""
    gpus = _gpus(node_dir)
    ids = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-i", "--id")]
    targets: list[int] = []
    for ident in ids or [str(g) for g in range(gpus)]:
        found = next(
            (g for g in range(gpus) if ident in (str(g), pci_bus_id(g), pci_bus_id(g)[4:])), None
        )
        if found is None:
            print(f"No devices were found matching the identifier {ident!r}", file=sys.stderr)
            return 6
        targets.append(found)
    rc = 0
    for gpu in targets:
        if reset_gpu(node_dir, gpu):
            print(f"GPU {pci_bus_id(gpu)} was successfully reset.")
        else:
            print(f"Unable to reset GPU {pci_bus_id(gpu)}: GPU is lost.", file=sys.stderr)
            rc = LOST_GPU_RC
    if rc == 0:
        print("All done.")
    return rc


def reboot_command(node_dir: Path, argv: list[str]) -> int:
    """``reboot``: the node goes down and comes back (at once, in the simulation)."""
    status = node_status(node_dir)
    if status.fault is NodeFault.down:
        return _unreachable(status)
    reboot(node_dir)
    return 0


def boot_id(node_dir: Path, argv: list[str]) -> int:
    """What ``cat /proc/sys/kernel/random/boot_id`` tells: a new value after each boot."""
    status = node_status(node_dir)
    if status.fault is NodeFault.down:
        return _unreachable(status)
    booted = read_hardware(node_dir).booted
    print(hashlib.sha256(f"{status.name}-{booted:.6f}".encode()).hexdigest()[:32])
    return 0


COMMANDS = {
    "nvidia-smi": nvidia_smi,
    "dmesg": dmesg,
    "dcgmi": dcgmi,
    "reboot": reboot_command,
    "boot-id": boot_id,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] != "--node-dir" or argv[2] not in COMMANDS:
        print(
            "usage: python -m trainmedic.sim.node --node-dir DIR COMMAND [ARGS...]", file=sys.stderr
        )
        return 2
    node_dir, command, rest = Path(argv[1]), argv[2], argv[3:]
    return COMMANDS[command](node_dir, rest)


if __name__ == "__main__":
    sys.exit(main())
