"""Simulated DCGM exporter: ``/metrics`` in the Prometheus text format, one series per GPU,
with the metric names and labels of NVIDIA's dcgm-exporter. A node that is down exports
nothing, as a dead exporter would. The counters are the GPUs' own (``sim/cluster.py``): a
repaired node still exports the errors of its past faults."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from trainmedic.sim.cluster import SimCluster
from trainmedic.sim.faults import NodeFault
from trainmedic.sim.hardware import gpu_temperature, pci_bus_id, read_hardware

FAMILIES = (
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "counter",
        "Total number of double-bit persistent ECC errors.",
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink flow-control CRC errors.",
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
)


BUSY_WINDOW_S = 5.0


def _utilization(node_dir: Path, now: float) -> int:
    """Busy while a training process has stepped on this node in the last few seconds."""
    try:
        return 97 if now - (node_dir / "gpu_busy").stat().st_mtime < BUSY_WINDOW_S else 0
    except OSError:
        return 0


def render_metrics(cluster: SimCluster) -> str:
    samples: dict[str, list[str]] = {name: [] for name, _, _ in FAMILIES}
    gpus = cluster.gpus_per_node
    now = time.time()
    for status in cluster.statuses():
        if status.fault is NodeFault.down:
            continue
        node_dir = cluster.nodes_dir / status.name
        utilization = _utilization(node_dir, now)
        hardware = read_hardware(node_dir)
        for gpu in range(gpus):
            counters = hardware.gpu(gpu)
            faulty = gpu == status.gpu and status.fault is not NodeFault.healthy
            labels = (
                f'gpu="{gpu}",UUID="GPU-{status.name}-{gpu}",pci_bus_id="{pci_bus_id(gpu)}",'
                f'device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{status.name}"'
            )
            hot = faulty and status.fault is NodeFault.overheat
            values = {
                "DCGM_FI_DEV_GPU_TEMP": gpu_temperature(gpu, hot=hot),
                "DCGM_FI_DEV_XID_ERRORS": counters.xid_last,
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": counters.ecc_dbe_volatile,
                "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": counters.ecc_dbe_aggregate,
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": counters.nvlink_crc_flit,
                "DCGM_FI_DEV_GPU_UTIL": utilization,
            }
            for name, value in values.items():
                samples[name].append(f"{name}{{{labels}}} {value}")
    lines = []
    for name, kind, help_text in FAMILIES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples[name]]
    return "\n".join(lines) + "\n"


def make_server(
    cluster: SimCluster, host: str = "127.0.0.1", port: int = 9400
) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics here")
                return
            body = render_metrics(cluster).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainmedic.sim.exporter")
    parser.add_argument("--sim-home", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9400)
    args = parser.parse_args(argv)
    server = make_server(SimCluster(Path(args.sim_home)), args.host, args.port)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
