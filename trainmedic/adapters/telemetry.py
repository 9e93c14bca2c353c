"""Read node telemetry: Prometheus text exposition with NVIDIA DCGM exporter metric names.

Works against a dcgm-exporter ``/metrics`` endpoint, a Prometheus federation endpoint, or the
simulated cluster's exporter. Only the families below are used; the rest is ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import httpx

from trainmedic.core.errors import TelemetryError
from trainmedic.core.models import GpuTelemetry

TEMP = "DCGM_FI_DEV_GPU_TEMP"
XID = "DCGM_FI_DEV_XID_ERRORS"
ECC_DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
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


def gpu_telemetry_from_samples(
    samples: Iterable[tuple[str, dict[str, str], float]],
) -> list[GpuTelemetry]:
    per_gpu: dict[tuple[str, int], dict[str, float]] = {}
    for name, labels, value in samples:
        if name not in (TEMP, XID, ECC_DBE, UTIL, *NVLINK_ERRORS):
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
                ECC_DBE: "ecc_dbe_total",
                UTIL: "gpu_utilization",
            }[name]
            fields[key] = value
    return [
        GpuTelemetry(
            host=host,
            gpu=gpu,
            temperature_c=f.get("temperature_c"),
            xid_last=int(f.get("xid_last", 0)),
            ecc_dbe_total=f.get("ecc_dbe_total", 0.0),
            nvlink_errors_total=f.get("nvlink_errors_total", 0.0),
            gpu_utilization=f.get("gpu_utilization"),
        )
        for (host, gpu), f in sorted(per_gpu.items())
    ]


def fetch_gpu_telemetry(
    url: str, *, timeout_s: float = 10.0, transport: httpx.BaseTransport | None = None
) -> list[GpuTelemetry]:
    """GET ``url`` and return one record per (host, GPU). Raises TelemetryError."""
    try:
        with httpx.Client(timeout=timeout_s, transport=transport) as client:
            response = client.get(url, headers={"Accept": "text/plain"})
            response.raise_for_status()
    except httpx.HTTPError as exc:
        raise TelemetryError(f"telemetry {url}: {exc}") from exc
    return gpu_telemetry_from_samples(parse_prometheus_text(response.text))
