"""Pre-flight on the simulated cluster and a real Prefect server: unfit nodes are found in
one playbook run, drained under the policy, and the next job starts without them."""

from __future__ import annotations

import pytest

from trainmedic.core.models import JobSpec, JobState, NodeState

pytestmark = pytest.mark.server


def test_preflight_drains_the_unfit_nodes_and_the_job_starts_without_them(
    prefect_server, sim, policy
) -> None:
    from flows.preflight import PreflightRequest, preflight

    policy(auto_approve_max=2, max_share=0.5)
    cluster, scheduler = sim
    cluster.inject("node003", "xid79")
    cluster.inject("node005", "overheat", gpu=1)
    checked = preflight(PreflightRequest(nodes="node[001-006]"))
    assert set(checked.unfit) == {"node003", "node005"}
    assert checked.unfit["node003"][0].startswith("nvidia-smi exit")
    assert "GPU 1: hardware thermal slowdown active" in checked.unfit["node005"]
    assert checked.fit == ["node001", "node002", "node004", "node006"]
    assert checked.drained == [] and checked.human_needed  # asked to check, not to drain
    assert not [n for n in scheduler.nodes() if n.state is NodeState.DRAINED]

    drained = preflight(PreflightRequest(nodes="node[001-006]", drain=True))
    assert sorted(drained.drained) == ["node003", "node005"]
    states = {n.name: n for n in scheduler.nodes()}
    assert states["node003"].state is NodeState.DRAINED
    assert states["node003"].reason.startswith("trainmedic preflight")

    job = scheduler.submit(JobSpec(name="big", nodes=6, steps=100_000))
    assert job.state is JobState.RUNNING
    assert not {"node003", "node005"} & set(job.nodes)
