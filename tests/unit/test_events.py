import httpx
import pytest
from pydantic import ValidationError

from trainmedic.adapters.events import emit, to_prefect_event
from trainmedic.core.errors import ServerError
from trainmedic.core.models import JobEvent


def test_prefect_event_shape_and_stable_id() -> None:
    event = JobEvent(kind="job.failed", job_id="1234", nodes=("node001",), exit_code=1)
    body = to_prefect_event(event)
    assert body["event"] == "trainmedic.job.failed"
    assert body["resource"]["prefect.resource.id"] == "trainmedic.job.1234"
    assert body["resource"]["trainmedic.job.id"] == "1234"
    assert body["related"][0]["prefect.resource.id"] == "trainmedic.node.node001"
    # A replay of the same job event keeps its id, so the server can drop it.
    assert to_prefect_event(event)["id"] == body["id"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("job_id", "12; rm"),
        ("kind", "job.exploded"),
        ("nodes", ["NODE 1"]),
        ("exit_code", 999),
    ],
)
def test_malformed_events_are_rejected_naming_the_field(field: str, value: object) -> None:
    data = {"kind": "job.failed", "job_id": "1", field: value}
    with pytest.raises(ValidationError) as info:
        JobEvent.model_validate(data)
    assert field in str(info.value)


def test_emit_posts_a_list_and_maps_http_errors() -> None:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    event = JobEvent(kind="job.hung", job_id="7")
    emit(event, api_url="http://prefect/api", transport=httpx.MockTransport(handler))
    assert seen[0].url.path == "/api/events"
    assert b'"trainmedic.job.hung"' in seen[0].content
    failing = httpx.MockTransport(lambda r: httpx.Response(500))
    with pytest.raises(ServerError, match="could not send"):
        emit(event, api_url="http://prefect/api", transport=failing)
