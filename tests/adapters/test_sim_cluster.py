"""The simulated hardware behaves like the real tools for each fault."""

import re
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from trainmedic.adapters.telemetry import parse_prometheus_text
from trainmedic.core.errors import InputError
from trainmedic.sim.cluster import SimCluster
from trainmedic.sim.hardware import NodeFault


def run(
    cluster: SimCluster, node: str, *argv: str, timeout: float = 10
) -> subprocess.CompletedProcess:
    binary = cluster.nodes_dir / node / "bin" / argv[0]
    return subprocess.run(
        [str(binary), *argv[1:]], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def cluster(tmp_path: Path) -> SimCluster:
    c = SimCluster(tmp_path / "sim")
    c.create(4, gpus_per_node=2, inventory_dir=tmp_path / "inv")
    return c


def test_create_writes_inventory_with_every_node(cluster: SimCluster, tmp_path: Path) -> None:
    hosts = (tmp_path / "inv" / "hosts.yml").read_text()
    for name in ("node001", "node002", "node003", "node004"):
        assert name in hosts
    assert (tmp_path / "inv" / "group_vars" / "all.yml").exists()


def test_healthy_nvidia_smi_query(cluster: SimCluster) -> None:
    done = run(
        cluster,
        "node001",
        "nvidia-smi",
        "--query-gpu=index,temperature.gpu",
        "--format=csv,noheader",
    )
    assert done.returncode == 0
    assert done.stdout.splitlines() == ["0, 41", "1, 42"]


def test_xid79_loses_the_gpu(cluster: SimCluster) -> None:
    cluster.inject("node002", "xid79", gpu=1)
    done = run(cluster, "node002", "nvidia-smi")
    assert done.returncode == 15
    assert "GPU is lost" in done.stdout
    kernel = run(cluster, "node002", "dmesg", "-T").stdout
    assert "NVRM: Xid (PCI:0000:3b:00): 79" in kernel and "fallen off the bus" in kernel


def test_ecc_shows_in_query_and_kernel_log(cluster: SimCluster) -> None:
    cluster.inject("node003", NodeFault.ecc)
    done = run(
        cluster,
        "node003",
        "nvidia-smi",
        "--query-gpu=index,ecc.errors.uncorrected.volatile.total",
        "--format=csv,noheader",
    )
    assert done.stdout.splitlines()[0] == "0, 2"
    assert ": 48," in run(cluster, "node003", "dmesg").stdout


def test_allgather_reports_busbw_like_nccl_tests(cluster: SimCluster) -> None:
    healthy = run(
        cluster, "node001", "all_gather_perf", "-b", "1G", "-e", "1G", "--hosts", "node001,node002"
    )
    assert healthy.returncode == 0
    assert "# Avg bus bandwidth    : " in healthy.stdout
    busbw = float(healthy.stdout.split("Avg bus bandwidth    :")[1].split()[0])
    cluster.inject("node002", "slow")
    slow = run(cluster, "node001", "all_gather_perf", "--hosts", "node001,node002")
    slow_bw = float(slow.stdout.split("Avg bus bandwidth    :")[1].split()[0])
    assert slow_bw < busbw / 4


def test_allgather_with_broken_peer_fails_with_nccl_error(cluster: SimCluster) -> None:
    cluster.inject("node004", "nvlink")
    done = run(cluster, "node003", "all_gather_perf", "--hosts", "node003,node004")
    assert done.returncode == 1
    assert "Test NCCL failure" in done.stdout


def test_allgather_with_down_peer_hangs(cluster: SimCluster) -> None:
    cluster.inject("node004", "down")
    with pytest.raises(subprocess.TimeoutExpired):
        run(cluster, "node003", "all_gather_perf", "--hosts", "node003,node004", timeout=1.5)


def test_down_node_refuses_commands(cluster: SimCluster) -> None:
    cluster.inject("node001", "down")
    assert run(cluster, "node001", "nvidia-smi").returncode == 255


def test_repair_returns_node_to_healthy(cluster: SimCluster) -> None:
    cluster.inject("node001", "ecc")
    cluster.repair("node001")
    assert cluster.status("node001").fault is NodeFault.healthy


@pytest.mark.parametrize(
    ("node", "fault", "field"),
    [
        ("node999", "ecc", "node"),
        ("node001", "melted", "fault"),
        ("node001;id", "ecc", "node"),
    ],
)
def test_inject_rejects_bad_input(cluster: SimCluster, node: str, fault: str, field: str) -> None:
    with pytest.raises(InputError) as info:
        cluster.inject(node, fault)
    assert info.value.field == field


def test_create_bounds(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="nodes"):
        SimCluster(tmp_path).create(1025)


WEEK = 7 * 24 * 3600


def test_dmesg_prints_times_as_util_linux_does(cluster: SimCluster) -> None:
    cluster.inject("node001", "xid79", gpu=1)
    iso = run(cluster, "node001", "dmesg", "--time-format", "iso").stdout.splitlines()[-1]
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}[+-]\d\d:\d\d NVRM: Xid ", iso)
    at = datetime.fromisoformat(iso.split(" ")[0].replace(",", "."))
    assert abs((datetime.now(UTC) - at).total_seconds()) < 30
    ctime = run(cluster, "node001", "dmesg", "-T").stdout.splitlines()[-1]
    assert re.match(r"^\[\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\] NVRM: Xid ", ctime)
    since_boot = run(cluster, "node001", "dmesg").stdout.splitlines()[-1]
    assert re.match(r"^\[ *\d+\.\d{6}\] NVRM: Xid ", since_boot)
    assert run(cluster, "node001", "dmesg", "-t").stdout.splitlines()[-1].startswith("NVRM: Xid")
    bad = run(cluster, "node001", "dmesg", "--time-format", "rfc")
    assert bad.returncode == 1 and "unknown time format" in bad.stderr


def gpu_counters(cluster: SimCluster, node: str, gpu: int) -> dict[str, float]:
    from trainmedic.sim.exporter import render_metrics

    values = {}
    for name, labels, value in parse_prometheus_text(render_metrics(cluster)):
        if labels["Hostname"] == node and labels["gpu"] == str(gpu):
            values[name.removeprefix("DCGM_FI_DEV_")] = value
    return values


def test_a_reboot_clears_the_ring_buffer_and_the_counters_keep_counting(
    cluster: SimCluster,
) -> None:
    last_week = time.time() - WEEK
    cluster.inject("node002", "ecc", gpu=1, at=last_week)
    cluster.inject("node002", "nvlink", gpu=1, at=last_week + 60)
    before = gpu_counters(cluster, "node002", 1)
    assert before["ECC_DBE_AGG_TOTAL"] == 2 and before["NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] > 0

    cluster.repair("node002", at=last_week + 3600)  # rebooted last week

    kernel = run(cluster, "node002", "dmesg", "--time-format", "iso").stdout
    assert "NVRM: Xid" not in kernel  # the ring buffer started empty at the boot
    assert "NVRM: loading NVIDIA UNIX x86_64 Kernel Module" in kernel
    after = gpu_counters(cluster, "node002", 1)
    assert after["ECC_DBE_AGG_TOTAL"] == 2  # the GPU's lifetime count (InfoROM)
    assert after["NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] == before["NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"]
    assert after["ECC_DBE_VOL_TOTAL"] == 0  # since the driver loaded
    assert after["XID_ERRORS"] == 0  # DCGM restarted with the node
    query = "--query-gpu=index,ecc.errors.uncorrected.volatile.total,"
    query += "ecc.errors.uncorrected.aggregate.total"
    smi = run(cluster, "node002", "nvidia-smi", query, "--format=csv,noheader").stdout
    assert smi.splitlines()[1] == "1, 0, 2"

    cluster.inject("node002", "ecc", gpu=1)  # counting on from there
    assert gpu_counters(cluster, "node002", 1)["ECC_DBE_AGG_TOTAL"] == 4


def test_a_gpu_reset_keeps_the_old_xid_lines_and_counters(cluster: SimCluster) -> None:
    last_week = time.time() - WEEK
    cluster.inject("node003", "ecc", at=last_week)
    cluster.repair("node003", reboot=False, at=last_week + 3600)  # nvidia-smi -r, no reboot
    assert cluster.status("node003").fault is NodeFault.healthy
    lines = run(cluster, "node003", "dmesg", "--time-format", "iso").stdout.splitlines()
    xid = next(line for line in lines if ": 48," in line)
    at = datetime.fromisoformat(xid.split(" ")[0].replace(",", "."))
    assert abs(at.timestamp() - last_week) < 1  # still there, with last week's time
    assert "has been reset" in lines[-1]
    counters = gpu_counters(cluster, "node003", 0)
    assert counters["ECC_DBE_AGG_TOTAL"] == 2 and counters["ECC_DBE_VOL_TOTAL"] == 0
    assert counters["XID_ERRORS"] == 48  # DCGM's last Xid, from last week
