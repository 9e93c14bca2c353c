"""The fleet report for a scripted week of failures, with its pictures.

The week (tests/support/fleet_week.py, the unit tests' known answers): two training runs on
16 simulated nodes of 4 GPUs. "gpt" (64 GPUs) fails on an ECC error after 10 h and on an NCCL
timeout 10 h later, then completes; "llama" (32 GPUs) loses a GPU off the bus after 12 h, then
the hot node's GPU throttles and the job hangs to its time limit, and it trains on to the
week's end. trainmedic drained node007 three times (a lemon). Temperatures are what the
simulated nodes report (96 C on the overheating GPU); step times follow from each attempt's
wall time and steps (4x slower on the throttled GPU, as the simulator's trainer does); losses
are the simulator's loss curve. The report and its pictures are computed by the same pure
functions the fleet-report flow uses.

Writes DIR/fleet-report.md (the artifact's Markdown, pictures embedded), DIR/fleet-report.json
and one PNG per picture, and prints the headline figures and the paths.

    .venv/bin/python bench/fleet_week.py DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for the report and its pictures")
    args = parser.parse_args(argv)

    from support.fleet_week import (
        DRAINS,
        FLEET_WEEK,
        GPUS_PER_NODE,
        INSPECTION,
        NODES,
        REPAIRS,
        T0,
        UNTIL,
        hottest_gpus,
        incident_curves,
    )

    from trainmedic.core.files import write_bytes_atomic
    from trainmedic.core.settings import get_settings
    from trainmedic.reports.fleet import fleet_markdown, fleet_report, racks_by_position
    from trainmedic.reports.plots import fleet_plots

    settings = get_settings()
    started = time.perf_counter()
    report = fleet_report(
        FLEET_WEEK,
        DRAINS,
        since=T0,
        until=UNTIL,
        lemon_drains=settings.lemon_drains,
        racks=racks_by_position(NODES, settings.nodes_per_rack),
        temperatures=hottest_gpus(),
        temperature_kind="peak over the window",
        repairs=REPAIRS,
        inspection=INSPECTION,
    )
    plots = fleet_plots(report, incident_curves(FLEET_WEEK, settings.report_incident_steps))
    elapsed = time.perf_counter() - started

    out = args.out.resolve()
    write_bytes_atomic(out / "fleet-report.md", fleet_markdown(report, plots).encode())
    write_bytes_atomic(
        out / "fleet-report.json", json.dumps(report.model_dump(mode="json"), indent=1).encode()
    )
    for name, png in plots.items():
        write_bytes_atomic(out / name, png)

    print(f"week {T0:%Y-%m-%d} to {UNTIL:%Y-%m-%d}: {len(NODES)} nodes x {GPUS_PER_NODE} GPUs")
    print(f"ETTR (GPU-weighted): {report.ettr:.1%}")
    for run in report.runs:
        print(
            f"  run {run.run} {run.name}: ETTR {run.ettr:.1%}, {run.restarts} restarts, "
            f"{run.steps_lost} steps lost, {run.gpu_hours_lost:.1f} GPU-h lost"
        )
    for category in report.categories:
        print(f"  {category.category}: {category.failures} failed, {category.gpu_hours_lost} GPU-h")
    print(f"lemons: {', '.join(report.lemons) or 'none'}")
    repaired = ", ".join(f"{n.node} x{n.repairs}" for n in report.nodes if n.repairs)
    print(f"repairs: {repaired or 'none'}")
    waiting = [n.node for n in report.nodes if n.inspection]
    print(f"waiting for hardware inspection: {', '.join(waiting) or 'none'}")
    hottest = max(report.racks, key=lambda r: r.temperature_c or 0)
    print(f"hottest rack: {hottest.rack} at {hottest.temperature_c:g} C")
    print(f"report and {len(plots)} pictures computed in {elapsed:.2f} s, written to {out}:")
    for name in ["fleet-report.md", "fleet-report.json", *plots]:
        size = (out / name).stat().st_size
        print(f"  {out / name} ({size / 1024:.1f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
