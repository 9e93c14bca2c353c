"""What a run left in the Prefect UI's Artifacts tab, read back from the real server."""

from __future__ import annotations

from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterId,
)


def artifact_text(artifact_id: str | UUID) -> str:
    """One artifact's content (a report's markdown), by the id a flow returned."""
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(id=ArtifactFilterId(any_=[UUID(str(artifact_id))]))
        )
    assert found, f"no artifact {artifact_id}"
    return str(found[0].data)


def run_artifacts(flow_run_id: str | UUID) -> dict[str, object]:
    """A flow run's keyed artifacts' data (markdown text, a table's rows), by key."""
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(str(flow_run_id))])
            )
        )
    return {a.key: a.data for a in found if a.key}
