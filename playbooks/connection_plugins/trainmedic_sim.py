"""Connection plugin for simulated nodes: the local connection, unless the node is down.

A simulated node in the ``down`` fault state refuses the connection exactly where SSH to a
dead host would, so Ansible reports it UNREACHABLE and the runbook sees what it would see on a
real cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.connection.local import Connection as LocalConnection

DOCUMENTATION = """
    name: trainmedic_sim
    short_description: local execution on a simulated GPU node, unreachable when it is down
    description:
      - Runs tasks on the controller, like the local connection, after checking the simulated
        node's fault state; a node whose state is C(down) is reported unreachable.
    author: trainmedic
    options:
      node_dir:
        description: the simulated node's state directory
        vars:
          - name: trainmedic_sim_node_dir
        required: true
"""


class Connection(LocalConnection):
    transport = "trainmedic_sim"

    def _connect(self) -> Connection:
        node_dir = Path(self.get_option("node_dir"))
        try:
            fault = json.loads((node_dir / "state.json").read_text()).get("fault")
        except (OSError, ValueError) as exc:
            raise AnsibleConnectionFailure(f"{node_dir.name}: no route to host ({exc})") from exc
        if fault == "down":
            raise AnsibleConnectionFailure(
                f"ssh: connect to host {node_dir.name} port 22: No route to host"
            )
        return super()._connect()
