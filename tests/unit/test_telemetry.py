"""DCGM metrics over real HTTP from the simulated exporter, parsed with httpx."""

import threading

import httpx
import pytest

from trainmedic.adapters import telemetry
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


def test_one_scrape_shows_lifetime_counters_never_evidence(exporter) -> None:
    from trainmedic.core.taxonomy import Category
    from trainmedic.diagnosis import diagnose

    cluster, url = exporter
    cluster.inject("node002", "ecc", gpu=1)
    cluster.inject("node003", "nvlink")
    cluster.repair("node002", reboot=False)  # repaired; its GPU keeps counting
    cluster.repair("node003")  # rebooted
    samples = {(s.host, s.gpu): s for s in fetch_gpu_telemetry(url)}
    assert all(s.lifetime for s in samples.values())
    assert samples[("node002", 1)].ecc_dbe_total == 2  # the aggregate count, for life
    assert samples[("node002", 1)].xid_last == 48 and samples[("node003", 0)].xid_last == 0
    assert samples[("node003", 0)].nvlink_errors_total > 0
    assert diagnose([], telemetry=list(samples.values())).category is Category.Unknown


def prometheus(values_at: dict[float, list[tuple[str, str, int, float]]], seen: list):
    """A Prometheus server's /api/v1/query: the given (family, host, gpu, value) per time."""

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.url.params))
        assert request.url.path == "/prom/api/v1/query"
        rows = values_at[float(request.url.params["time"])]
        result = [
            {
                "metric": {"__name__": name, "Hostname": host, "gpu": str(gpu), "job": "dcgm"},
                "value": [float(request.url.params["time"]), str(value)],
            }
            for name, host, gpu, value in rows
        ]
        data = {"resultType": "vector", "result": result}
        return httpx.Response(200, json={"status": "success", "data": data})

    return httpx.MockTransport(answer)


def test_prometheus_readings_at_the_start_and_now_give_the_increase() -> None:
    from datetime import UTC, datetime

    from trainmedic.adapters.telemetry import fetch_prometheus_telemetry
    from trainmedic.diagnosis.freshness import telemetry_over_window

    start, now = datetime(2026, 12, 3, 18, tzinfo=UTC), datetime(2026, 12, 3, 19, tzinfo=UTC)
    agg, crc = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
    seen: list = []
    transport = prometheus(
        {
            start.timestamp(): [(agg, "node001", 0, 2), (crc, "node002", 0, 5)],
            now.timestamp(): [(agg, "node001", 0, 2), (crc, "node002", 0, 1848)],
        },
        seen,
    )
    url, hosts = "http://prom:9090/prom/", ["node001", "node002"]
    before = fetch_prometheus_telemetry(url, hosts, start, transport=transport)
    after = fetch_prometheus_telemetry(url, hosts, now, transport=transport)
    assert seen[0]["query"] == (
        '{__name__=~"' + "|".join(sorted(telemetry.FAMILIES)) + '",Hostname=~"node001|node002"}'
    )
    window = {r.host: r for r in telemetry_over_window(before, after)}
    assert window["node001"].ecc_dbe_total == 0 and not window["node001"].lifetime
    assert window["node002"].nvlink_errors_total == 1843


def test_prometheus_errors_are_telemetry_errors() -> None:
    from datetime import UTC, datetime

    from trainmedic.adapters.telemetry import fetch_prometheus_telemetry
    from trainmedic.core.errors import InputError

    at = datetime(2026, 12, 3, tzinfo=UTC)
    bad = httpx.MockTransport(
        lambda r: httpx.Response(200, json={"status": "error", "error": "parse error"})
    )
    with pytest.raises(TelemetryError, match="parse error"):
        fetch_prometheus_telemetry("http://prom:9090", ["node001"], at, transport=bad)
    garbage = httpx.MockTransport(lambda r: httpx.Response(200, text="<html>"))
    with pytest.raises(TelemetryError, match="prom"):
        fetch_prometheus_telemetry("http://prom:9090", ["node001"], at, transport=garbage)
    with pytest.raises(InputError):  # never a PromQL string from unvalidated input
        fetch_prometheus_telemetry("http://prom:9090", ['x"}or vector(1)'], at, transport=bad)


def test_peak_temperatures_are_the_window_max_per_host_from_prometheus() -> None:
    from datetime import UTC, datetime, timedelta

    from trainmedic.adapters.telemetry import fetch_peak_temperatures

    until = datetime(2026, 12, 3, 19, tzinfo=UTC)
    seen: list = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.url.params))
        result = [
            {"metric": {"Hostname": "node001"}, "value": [until.timestamp(), "91"]},
            {"metric": {"Hostname": "node002"}, "value": [until.timestamp(), "44.5"]},
        ]
        data = {"resultType": "vector", "result": result}
        return httpx.Response(200, json={"status": "success", "data": data})

    peaks = fetch_peak_temperatures(
        "http://prom:9090",
        ["node001", "node002"],
        until - timedelta(days=7),
        until,
        transport=httpx.MockTransport(answer),
    )
    assert peaks == {"node001": 91.0, "node002": 44.5}
    assert seen[0]["query"] == (
        "max by (Hostname) (max_over_time(DCGM_FI_DEV_GPU_TEMP"
        '{Hostname=~"node001|node002"}[604800s]))'
    )
    assert seen[0]["time"] == f"{until.timestamp():.3f}"
    bad = httpx.MockTransport(lambda r: httpx.Response(200, json={"status": "success"}))
    with pytest.raises(TelemetryError):
        fetch_peak_temperatures("http://prom:9090", ["node001"], until, until, transport=bad)
