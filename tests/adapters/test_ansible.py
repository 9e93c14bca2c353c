"""Real ansible-runner executing the real playbooks against the simulated inventory."""

import pytest

from trainmedic.adapters.ansible import Inventory, run_playbook
from trainmedic.core.errors import InputError
from trainmedic.core.models import HostOutcome


def test_diagnostics_playbook_collects_findings_and_reports_unreachable(sim) -> None:
    cluster, _ = sim
    cluster.inject("node002", "xid79", gpu=1)
    cluster.inject("node003", "down")
    result = run_playbook("collect_node_diagnostics.yml", ["node001", "node002", "node003"])
    assert result.hosts == {
        "node001": HostOutcome.ok,
        "node002": HostOutcome.ok,
        "node003": HostOutcome.unreachable,
    }
    lost = result.facts["node002"]["trainmedic_diagnostics"]
    assert lost["nvidia_smi_rc"] == 15
    assert any(": 79," in line for line in lost["xid_lines"])
    fine = result.facts["node001"]["trainmedic_diagnostics"]
    assert fine["nvidia_smi_rc"] == 0 and fine["xid_lines"] == []
    assert len(fine["nvidia_smi"]) == 4  # one line per GPU


def test_check_mode_runs_read_only_probes(sim) -> None:
    result = run_playbook("collect_node_diagnostics.yml", ["node001"], check=True)
    assert result.check_mode and result.hosts == {"node001": HostOutcome.ok}
    assert result.facts["node001"]["trainmedic_diagnostics"]["nvidia_smi_rc"] == 0


@pytest.mark.parametrize("target", ["node001;reboot", "node042", "{{ 7*7 }}"])
def test_targets_must_be_inventory_hostnames(sim, target: str) -> None:
    with pytest.raises(InputError, match="nodes"):
        run_playbook("collect_node_diagnostics.yml", [target])


def test_extravars_are_restricted(sim) -> None:
    with pytest.raises(InputError):
        run_playbook(
            "collect_node_diagnostics.yml",
            ["node001"],
            {"trainmedic_reason": "{{ lookup('pipe', 'id') }}"},
        )
    with pytest.raises(InputError, match="extravars"):
        run_playbook("collect_node_diagnostics.yml", ["node001"], {"ansible_become": True})


def test_playbook_outside_the_playbook_dir_is_refused(sim) -> None:
    with pytest.raises(InputError, match="playbook"):
        run_playbook("../pyproject.toml", ["node001"])


def test_inventory_lists_sim_hosts(sim, tm_home) -> None:
    assert Inventory(tm_home.inventory).hosts() == {f"node{i:03d}" for i in range(1, 9)}
