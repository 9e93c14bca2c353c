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


def _runner_env(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from pathlib import Path

    import yaml

    return yaml.safe_load((Path(result.private_data_dir) / "env" / "envvars").read_text())


def test_nodes_use_their_own_python_and_host_keys_are_checked_by_default(sim, tm_home) -> None:
    """Production paths: the controller's interpreter is never forced on every host (a GPU
    node does not have it: the inventory and ansible.cfg's discovery decide), and SSH host
    keys are checked against trainmedic's known_hosts unless a setting says otherwise."""
    result = run_playbook("collect_node_diagnostics.yml", ["node001"])
    env = _runner_env(result)
    assert "ANSIBLE_PYTHON_INTERPRETER" not in env
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert env["ANSIBLE_CONFIG"].endswith("ansible.cfg")
    assert f"UserKnownHostsFile={tm_home.known_hosts}" in env["ANSIBLE_SSH_EXTRA_ARGS"]
    assert "StrictHostKeyChecking=yes" in env["ANSIBLE_SSH_EXTRA_ARGS"]


def test_an_unreadable_kernel_log_is_reported_not_hidden(sim) -> None:
    cluster, _ = sim
    cluster.restrict_kernel_log("node002")  # kernel.dmesg_restrict=1, no privilege
    result = run_playbook("collect_node_diagnostics.yml", ["node001", "node002"])
    refused = result.facts["node002"]["trainmedic_diagnostics"]
    assert int(refused["kernel_rc"]) != 0
    assert "Operation not permitted" in refused["kernel_error"]
    read = result.facts["node001"]["trainmedic_diagnostics"]
    assert int(read["kernel_rc"]) == 0 and read["kernel_error"] == ""


def test_kernel_lines_are_collected_with_their_iso_times(sim) -> None:
    import re
    import time
    from datetime import datetime

    cluster, _ = sim
    last_week = time.time() - 7 * 24 * 3600
    cluster.inject("node001", "ecc", at=last_week)
    cluster.repair("node001", reboot=False, at=last_week + 60)  # the old lines stay
    cluster.inject("node002", "nvlink")
    result = run_playbook("collect_node_diagnostics.yml", ["node001", "node002"])
    found = {h: f["trainmedic_diagnostics"]["xid_lines"] for h, f in result.facts.items()}
    iso = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d),\d{6}([+-]\d\d:\d\d) NVRM: Xid ")
    times = {}
    for host, lines in found.items():
        assert lines and all(iso.match(line) for line in lines), lines
        match = iso.match(lines[-1])
        assert match is not None
        times[host] = datetime.fromisoformat(match[1] + match[2]).timestamp()
    assert abs(times["node001"] - last_week) < 2
    assert abs(times["node002"] - time.time()) < 60


def test_a_run_over_hundreds_of_hosts_names_them_all() -> None:
    """A 256-node locate runs 128 pair tests in one playbook run: the target pattern of 128
    inventory hostnames is longer than any free text allowed in a variable, and must pass."""
    from trainmedic.adapters.ansible import playbook_vars

    hosts = [f"node{i:03d}" for i in range(1, 257)]
    variables = playbook_vars({"trainmedic_pair_groups": ["node001,node002"]}, hosts)
    assert variables["trainmedic_target"] == ":".join(hosts)
    with pytest.raises(InputError):
        playbook_vars({"trainmedic_reason": "x" * 600}, hosts)  # free text still limited


@pytest.mark.parametrize(
    ("targets", "groups"),
    [
        (["node001", "node003"], ["node001,node002", "node003,node009"]),  # unknown node
        (["node001", "node003"], ["node001,node002", "node003"]),  # a group of one
        (["node001", "node003"], ["node001,node002", "node003,node003"]),  # twice in a group
        (["node001", "node003"], ["node001,node002"]),  # a target leading no group
        (["node001"], ["node001,node002", "node001,node003"]),  # one leader, two groups
    ],
    ids=["unknown", "single", "repeated", "no group", "two groups"],
)
def test_a_batch_with_one_invalid_group_runs_no_test(sim, targets, groups) -> None:
    """The pair-test batch is checked once, as a whole: one bad group and no test runs."""
    result = run_playbook("nccl_pair_test.yml", targets, {"trainmedic_pair_groups": groups})
    assert result.facts == {host: {} for host in targets}  # no host recorded a test result
    # Checked once, on the first target, which fails; the play ends there for all of them.
    assert result.hosts[targets[0]] is HostOutcome.failed
    assert HostOutcome.ok not in result.hosts.values()


def test_a_valid_batch_runs_every_group(sim) -> None:
    groups = ["node001,node002", "node003,node004,node005"]
    result = run_playbook(
        "nccl_pair_test.yml", ["node001", "node003"], {"trainmedic_pair_groups": groups}
    )
    for leader, group in (("node001", groups[0]), ("node003", groups[1])):
        found = result.facts[leader]["trainmedic_nccl_result"]
        assert found["hosts"] == group.split(",") and int(found["rc"]) == 0
