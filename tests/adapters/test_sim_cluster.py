"""The simulated hardware behaves like the real tools for each fault."""

import subprocess
from pathlib import Path

import pytest

from trainmedic.core.errors import InputError
from trainmedic.sim.cluster import NodeFault, SimCluster


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
