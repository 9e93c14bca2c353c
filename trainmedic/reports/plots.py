"""The fleet report's pictures: data in, PNG bytes out (pure; no Prefect, no display).

Drawn with matplotlib's Agg canvas on a ``Figure`` of its own (no pyplot, so no global
figure state between calls or threads) and saved by Pillow (matplotlib's own PNG writer) as a
palette PNG: the same data gives the same bytes. Three kinds, where a person would rather
look than read: GPU-hours lost by failure category, GPU temperature by rack, and step time
and loss around each incident (the failed attempt's last steps and its resubmission's first).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

from trainmedic.core.models import Strict
from trainmedic.reports.fleet import CategoryFigures, FleetReport

__all__ = [
    "IncidentCurve",
    "StepPoint",
    "fleet_plots",
    "gpu_hours_by_category_png",
    "incident_png",
    "temperature_by_rack_png",
]

DPI = 80  # small images: they are embedded in the artifact's Markdown
PALETTE_COLOURS = 64


class StepPoint(Strict):
    """One training step as the job's logs tell it: its time (rank 0's step line) and its
    loss (``loss.csv``); either may be missing."""

    step: int
    seconds: float | None = None
    loss: float | None = None


class IncidentCurve(Strict):
    """The steps around one failure: the failed attempt's last ones, its resubmission's first."""

    job_id: str  # the failed attempt
    category: str
    failed_step: int | None  # the last step it reached
    resumed_from: int | None  # the checkpoint step the next attempt started from
    before: list[StepPoint]
    after: list[StepPoint]


def _png(figure: Figure) -> bytes:
    """The figure as a PNG of a 64-colour palette: a third of the RGBA size (these charts have
    few colours), which matters for an artifact the hourly deployment writes again."""
    FigureCanvasAgg(figure)
    drawn = io.BytesIO()
    figure.savefig(drawn, format="png", dpi=DPI)
    with Image.open(drawn) as image:
        palette = image.convert("RGB").quantize(colors=PALETTE_COLOURS)
    buffer = io.BytesIO()
    palette.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def gpu_hours_by_category_png(categories: Sequence[CategoryFigures]) -> bytes:
    """A horizontal bar per failure category: the GPU-hours it lost, its failures named."""
    rows = sorted(categories, key=lambda c: c.gpu_hours_lost)
    figure = Figure(figsize=(6.4, 0.5 * len(rows) + 1.4), layout="constrained")
    axes = figure.add_subplot()
    bars = axes.barh([c.category for c in rows], [c.gpu_hours_lost for c in rows])
    axes.bar_label(
        bars, labels=[f"{c.gpu_hours_lost:.0f} ({c.failures} failed)" for c in rows], padding=3
    )
    axes.set_xlabel("GPU-hours lost")
    axes.set_title("GPU-hours lost by failure category")
    # From zero, with room for the labels (a failure that lost nothing yet: a unit axis).
    axes.set_xlim(0, max((c.gpu_hours_lost for c in rows), default=0.0) * 1.35 or 1.0)
    return _png(figure)


def temperature_by_rack_png(racks: Mapping[str, Mapping[str, float]], kind: str) -> bytes:
    """Per rack, a bar at its hottest GPU and a dot per node; ``kind`` says which temperature
    (the window's peak, or one reading at report time)."""
    names = sorted(racks)
    figure = Figure(figsize=(max(4.8, 0.7 * len(names) + 2), 3.6), layout="constrained")
    axes = figure.add_subplot()
    axes.bar(names, [max(racks[r].values()) for r in names], color="#f4a582", label="hottest")
    for index, rack in enumerate(names):
        temps = list(racks[rack].values())
        axes.scatter([index] * len(temps), temps, color="#b2182b", s=14, zorder=3)
    axes.set_ylabel("GPU temperature (°C)")
    axes.set_title(f"Hottest GPU by rack ({kind})\nbar: the rack's hottest, dots: its nodes")
    axes.tick_params(axis="x", labelrotation=45 if len(names) > 8 else 0)
    return _png(figure)


def incident_png(curve: IncidentCurve) -> bytes:
    """Step time above, loss below, against the step: the failure and the resume marked."""
    figure = Figure(figsize=(6.4, 4.2), layout="constrained")
    time_axes, loss_axes = figure.subplots(2, 1, sharex=True)
    for points, label, color in (
        (curve.before, f"job {curve.job_id}", "#2166ac"),
        (curve.after, "resubmission", "#1b7837"),
    ):
        timed = [(p.step, p.seconds) for p in points if p.seconds is not None]
        lossy = [(p.step, p.loss) for p in points if p.loss is not None and math.isfinite(p.loss)]
        if timed:
            time_axes.plot(*zip(*timed, strict=True), color=color, label=label)
        if lossy:
            loss_axes.plot(*zip(*lossy, strict=True), color=color, label=label)
    for axes in (time_axes, loss_axes):
        if curve.failed_step is not None:
            axes.axvline(curve.failed_step, color="#b2182b", linestyle="-", linewidth=1)
        if curve.resumed_from is not None:
            axes.axvline(curve.resumed_from, color="#777777", linestyle="--", linewidth=1)
    time_axes.set_ylabel("step time (s)")
    loss_axes.set_ylabel("loss")
    loss_axes.set_xlabel("step (red: failed, dashed: resumed from)")
    time_axes.set_title(f"{curve.category}: job {curve.job_id} failed at step {curve.failed_step}")
    time_axes.set_ylim(bottom=0)  # a slowdown shows as the share it is
    time_axes.legend(loc="lower left", fontsize="small")
    return _png(figure)


def fleet_plots(report: FleetReport, incidents: Sequence[IncidentCurve]) -> dict[str, bytes]:
    """Every picture the report has data for, by file name (in the order they are shown)."""
    plots: dict[str, bytes] = {}
    if report.categories:
        plots["gpu-hours-by-category.png"] = gpu_hours_by_category_png(report.categories)
    temps = {r.rack: r.temperatures for r in report.racks if r.temperatures}
    if temps:
        plots["temperature-by-rack.png"] = temperature_by_rack_png(temps, report.temperature_kind)
    for curve in incidents:
        if curve.before or curve.after:
            plots[f"incident-{curve.job_id}.png"] = incident_png(curve)
    return plots
