"""The repair and burn-in playbooks, run by real ansible-runner on simulated nodes whose reset
and reboot clear what they clear on real hardware, and nothing else."""

from __future__ import annotations

import pytest

from trainmedic.adapters.ansible import run_playbook
from trainmedic.core.errors import InputError
from trainmedic.core.models import HostOutcome
from trainmedic.sim.hardware import NodeFault, kernel_records, pci_bus_id, read_hardware


def _repair(node: str, repair: str, gpus: list[str] | None = None, *, check: bool = False):  # type: ignore[no-untyped-def]
    variables: dict[str, object] = {
        "trainmedic_repair": repair,
        "trainmedic_repair_reason": "trainmedic repair-node test",
        "trainmedic_repair_gpus": gpus or [],
    }
    return run_playbook("repair_node.yml", [node], variables, check=check)


def _burn_in(node: str, level: int = 2):  # type: ignore[no-untyped-def]
    result = run_playbook("burn_in.yml", [node], {"trainmedic_burn_in_level": level})
    return result.facts[node]["trainmedic_burn_in"]


def test_gpu_reset_applies_a_pending_row_remap_and_keeps_the_kernel_history(sim) -> None:
    cluster, _ = sim
    cluster.inject("node002", "ecc", gpu=1)
    assert _burn_in("node002")["dcgmi_rc"] == 1  # Memory: Fail - GPU: 1

    result = _repair("node002", "reset_gpu", [pci_bus_id(1)])

    assert result.hosts == {"node002": HostOutcome.ok}
    assert cluster.status("node002").fault is NodeFault.healthy
    messages = [m for _, m in kernel_records(cluster.nodes_dir / "node002")]
    assert any("Xid" in m and ": 48," in m for m in messages)  # a reset keeps the ring buffer
    assert messages[-1] == f"NVRM: GPU at {pci_bus_id(1)} has been reset."
    hardware = read_hardware(cluster.nodes_dir / "node002")
    assert hardware.gpu(1).ecc_dbe_volatile == 0 and hardware.gpu(1).ecc_dbe_aggregate == 2
    assert result.facts["node002"]["trainmedic_repaired"]["reset_output"][0].endswith(
        "was successfully reset."
    )
    assert _burn_in("node002")["dcgmi_rc"] == 0


def test_a_lost_gpu_cannot_be_reset_and_a_reboot_finds_it_again(sim) -> None:
    cluster, _ = sim
    cluster.inject("node003", "xid79", gpu=2)
    booted = read_hardware(cluster.nodes_dir / "node003").booted

    failed = _repair("node003", "reset_gpu", [pci_bus_id(2)])
    assert failed.hosts == {"node003": HostOutcome.failed}
    assert cluster.status("node003").fault is NodeFault.xid79

    result = _repair("node003", "reboot")
    assert result.hosts == {"node003": HostOutcome.ok}
    assert result.facts["node003"]["trainmedic_repaired"]["rebooted"] is True
    assert cluster.status("node003").fault is NodeFault.healthy
    assert read_hardware(cluster.nodes_dir / "node003").booted > booted
    assert not any("Xid" in m for _, m in kernel_records(cluster.nodes_dir / "node003"))


def test_a_failed_row_remap_survives_reset_and_reboot(sim) -> None:
    cluster, _ = sim
    cluster.inject("node004", "rowremap")
    _repair("node004", "reset_gpu")
    _repair("node004", "reboot")
    assert cluster.status("node004").fault is NodeFault.rowremap
    # The driver finds it again after the boot: the new ring buffer has its Xid 64.
    assert any(": 64," in m for _, m in kernel_records(cluster.nodes_dir / "node004"))
    burn_in = _burn_in("node004")
    assert burn_in["dcgmi_rc"] == 1 and any("Memory" in x and "Fail" in x for x in burn_in["dcgmi"])


def test_check_mode_repairs_nothing(sim) -> None:
    cluster, _ = sim
    cluster.inject("node005", "xid79")
    booted = read_hardware(cluster.nodes_dir / "node005").booted
    result = _repair("node005", "reboot", check=True)
    assert result.check_mode and result.hosts == {"node005": HostOutcome.ok}
    assert cluster.status("node005").fault is NodeFault.xid79
    assert read_hardware(cluster.nodes_dir / "node005").booted == booted
    _repair("node005", "reset_gpu", check=True)
    assert cluster.status("node005").fault is NodeFault.xid79


def test_burn_in_level_decides_what_is_tested(sim) -> None:
    cluster, _ = sim
    cluster.inject("node006", "overheat")
    assert _burn_in("node006", 2)["dcgmi_rc"] == 0  # no stress test below level 3
    assert _burn_in("node006", 3)["dcgmi_rc"] == 1


@pytest.mark.parametrize(
    ("variables", "field"),
    [
        ({"trainmedic_repair": "rm -rf", "trainmedic_repair_reason": "x"}, "trainmedic_repair"),
        (
            {
                "trainmedic_repair": "reset_gpu",
                "trainmedic_repair_reason": "x",
                "trainmedic_repair_gpus": ["0;reboot"],
            },
            "trainmedic_repair_gpus",
        ),
    ],
)
def test_repair_requests_outside_the_contract_are_refused(sim, variables, field) -> None:  # type: ignore[no-untyped-def]
    cluster, _ = sim
    cluster.inject("node007", "ecc")
    try:
        result = run_playbook("repair_node.yml", ["node007"], variables)
    except InputError as exc:  # refused before Ansible runs
        assert field in str(exc)
    else:  # refused by the playbook's own check
        assert result.hosts == {"node007": HostOutcome.failed}
    assert cluster.status("node007").fault is NodeFault.ecc


def test_a_reset_of_two_gpus_resets_each(sim) -> None:
    cluster, _ = sim
    cluster.inject("node008", "nvlink", gpu=3)
    result = _repair("node008", "reset_gpu", [pci_bus_id(1), pci_bus_id(3)])
    assert result.hosts == {"node008": HostOutcome.ok}
    assert cluster.status("node008").fault is NodeFault.healthy
    resets = [m for _, m in kernel_records(cluster.nodes_dir / "node008") if "reset" in m]
    assert resets == [f"NVRM: GPU at {pci_bus_id(g)} has been reset." for g in (1, 3)]
