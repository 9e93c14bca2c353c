"""Read node telemetry: NVIDIA DCGM exporter metric names, in the Prometheus text exposition
(a dcgm-exporter ``/metrics`` endpoint, a Prometheus federation endpoint, the simulated
cluster's exporter) or from a Prometheus server's HTTP API at a given time.

One scrape shows counters as lifetime totals (``GpuTelemetry.lifetime``): history, not
evidence. A Prometheus server can say what they were when a job started
(:func:`fetch_prometheus_telemetry` at that time), and ``diagnosis.freshness`` turns start
and now into the increase over the job's window. Only the families below are used.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import httpx

from trainmedic.adapters.http import http_client
from trainmedic.core import validate
from trainmedic.core.errors import TelemetryError
from trainmedic.core.models import GpuTelemetry

TEMP = "DCGM_FI_DEV_GPU_TEMP"
XID = "DCGM_FI_DEV_XID_ERRORS"
ECC_DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"  # since the driver loaded
ECC_DBE_AGG = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"  # the GPU's lifetime: preferred when exported
UTIL = "DCGM_FI_DEV_GPU_UTIL"
NVLINK_ERRORS = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)
_SAMPLE_RE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\d+)?$"
)
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus_text(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Parse the text exposition format into ``(name, labels, value)`` samples."""
    samples = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE_RE.match(line)
        if match is None:
            raise TelemetryError(f"line {lineno}: not a Prometheus sample: {line[:120]!r}")
        try:
            value = float(match["value"])
        except ValueError as exc:
            raise TelemetryError(f"line {lineno}: bad sample value {match['value']!r}") from exc
        labels = dict(_LABEL_RE.findall(match["labels"] or ""))
        samples.append((match["name"], labels, value))
    return samples


FAMILIES = (TEMP, XID, ECC_DBE, ECC_DBE_AGG, UTIL, *NVLINK_ERRORS)


def gpu_telemetry_from_samples(
    samples: Iterable[tuple[str, dict[str, str], float]], *, lifetime: bool = True
) -> list[GpuTelemetry]:
    """One reading per (host, GPU); ``lifetime``: the counters are totals of one moment."""
    per_gpu: dict[tuple[str, int], dict[str, float]] = {}
    for name, labels, value in samples:
        if name not in FAMILIES:
            continue
        host = labels.get("Hostname") or labels.get("hostname") or labels.get("instance", "")
        host = host.split(":")[0]
        gpu = int(labels.get("gpu", "0"))
        fields = per_gpu.setdefault((host, gpu), {})
        if name in NVLINK_ERRORS:
            fields["nvlink_errors_total"] = fields.get("nvlink_errors_total", 0.0) + value
        else:
            key = {
                TEMP: "temperature_c",
                XID: "xid_last",
                ECC_DBE: "ecc_dbe_volatile",
                ECC_DBE_AGG: "ecc_dbe_aggregate",
                UTIL: "gpu_utilization",
            }[name]
            fields[key] = value
    return [
        GpuTelemetry(
            host=host,
            gpu=gpu,
            temperature_c=f.get("temperature_c"),
            xid_last=int(f.get("xid_last", 0)),
            ecc_dbe_total=f.get("ecc_dbe_aggregate", f.get("ecc_dbe_volatile", 0.0)),
            nvlink_errors_total=f.get("nvlink_errors_total", 0.0),
            gpu_utilization=f.get("gpu_utilization"),
            lifetime=lifetime,
        )
        for (host, gpu), f in sorted(per_gpu.items())
    ]


def fetch_gpu_telemetry(
    url: str, *, timeout_s: float = 10.0, transport: httpx.BaseTransport | None = None
) -> list[GpuTelemetry]:
    """GET ``url`` and return one record per (host, GPU). Raises TelemetryError."""
    try:
        with http_client(timeout_s, transport) as client:
            response = client.get(url, headers={"Accept": "text/plain"})
            response.raise_for_status()
    except httpx.HTTPError as exc:
        raise TelemetryError(f"telemetry {url}: {exc}") from exc
    return gpu_telemetry_from_samples(parse_prometheus_text(response.text))


def fetch_prometheus_telemetry(
    url: str,
    hosts: Sequence[str],
    at: datetime,
    *,
    timeout_s: float = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> list[GpuTelemetry]:
    """The DCGM readings of ``hosts`` (dcgm-exporter's ``Hostname`` label) as a Prometheus
    server (``url``: its base, e.g. http://prometheus:9090) had them at ``at``: one instant
    query. The counters are totals at that moment. Raises TelemetryError."""
    if not hosts:
        return []
    names = "|".join(sorted(FAMILIES))
    wanted = "|".join(validate.hostname(h) for h in hosts)  # [a-z0-9-]: nothing to escape
    query = f'{{__name__=~"{names}",Hostname=~"{wanted}"}}'
    results = _instant_query(url, query, at, timeout_s=timeout_s, transport=transport)
    try:
        samples = [(r["metric"]["__name__"], r["metric"], float(r["value"][1])) for r in results]
    except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise TelemetryError(f"telemetry {url}: not a Prometheus vector: {exc!r}") from exc
    return gpu_telemetry_from_samples(samples)


def fetch_peak_temperatures(
    url: str,
    hosts: Sequence[str],
    since: datetime,
    until: datetime,
    *,
    timeout_s: float = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> dict[str, float]:
    """Each host's hottest GPU over ``since``..``until`` as a Prometheus server (its base
    URL) kept it: ``max_over_time`` of the DCGM temperature, the max over the host's GPUs.
    Hosts without samples are left out. Raises TelemetryError."""
    if not hosts:
        return {}
    window_s = max(int((until - since).total_seconds()), 1)
    wanted = "|".join(validate.hostname(h) for h in hosts)  # [a-z0-9-]: nothing to escape
    query = f'max by (Hostname) (max_over_time({TEMP}{{Hostname=~"{wanted}"}}[{window_s}s]))'
    results = _instant_query(url, query, until, timeout_s=timeout_s, transport=transport)
    try:
        return {
            r["metric"]["Hostname"]: float(r["value"][1])
            for r in results
            if r["metric"].get("Hostname")
        }
    except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise TelemetryError(f"telemetry {url}: not a Prometheus vector: {exc!r}") from exc


def _instant_query(
    url: str,
    query: str,
    at: datetime,
    *,
    timeout_s: float,
    transport: httpx.BaseTransport | None,
) -> list[dict[str, Any]]:
    """One PromQL instant query at ``at``: the vector's results. Raises TelemetryError."""
    endpoint = url.rstrip("/") + "/api/v1/query"
    try:
        with http_client(timeout_s, transport) as client:
            response = client.get(
                endpoint, params={"query": query, "time": f"{at.timestamp():.3f}"}
            )
            response.raise_for_status()
            body = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise TelemetryError(f"telemetry {endpoint}: {exc}") from exc
    try:
        if body["status"] != "success" or body["data"]["resultType"] != "vector":
            raise TelemetryError(f"telemetry {endpoint}: {body.get('error', body['status'])}")
        results = body["data"]["result"]
    except (AttributeError, KeyError, TypeError) as exc:
        raise TelemetryError(f"telemetry {endpoint}: not a Prometheus vector: {exc!r}") from exc
    if not isinstance(results, list):
        raise TelemetryError(f"telemetry {endpoint}: not a Prometheus vector: {results!r}")
    return results
