"""DCGM metrics over real HTTP from the simulated exporter, parsed with httpx."""

import threading

import httpx
import pytest

from trainmedic.adapters.telemetry import fetch_gpu_telemetry, parse_prometheus_text
from trainmedic.core.errors import TelemetryError
from trainmedic.sim.exporter import make_server


@pytest.fixture
def exporter(sim):
    cluster, _ = sim
    server = make_server(cluster, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield cluster, f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()


def test_faults_show_in_dcgm_metrics(exporter) -> None:
    cluster, url = exporter
    cluster.inject("node002", "ecc", gpu=3)
    cluster.inject("node004", "overheat", gpu=1)
    cluster.inject("node005", "nvlink")
    cluster.inject("node006", "down")
    samples = {(s.host, s.gpu): s for s in fetch_gpu_telemetry(url)}
    assert samples[("node002", 3)].xid_last == 48 and samples[("node002", 3)].ecc_dbe_total == 2
    assert samples[("node002", 0)].xid_last == 0
    assert samples[("node004", 1)].temperature_c == 96
    assert samples[("node005", 0)].nvlink_errors_total > 0
    assert not any(host == "node006" for host, _ in samples)  # a dead exporter exports nothing
    assert len(samples) == 7 * 4


def test_unreachable_endpoint_is_a_telemetry_error() -> None:
    with pytest.raises(TelemetryError, match="telemetry"):
        fetch_gpu_telemetry("http://127.0.0.1:9/metrics", timeout_s=1)


def test_http_error_status_is_a_telemetry_error() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(503, text="down"))
    with pytest.raises(TelemetryError, match="503"):
        fetch_gpu_telemetry("http://exporter/metrics", transport=transport)


def test_parser_rejects_garbage_with_line_number() -> None:
    with pytest.raises(TelemetryError, match="line 2"):
        parse_prometheus_text("# ok\n{{{ not a sample\n")
    assert parse_prometheus_text('m{a="b \\"q\\""} 1.5 1700000000\n') == [
        ("m", {"a": 'b \\"q\\"'}, 1.5)
    ]
