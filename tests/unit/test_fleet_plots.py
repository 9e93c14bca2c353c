"""The fleet report's pictures (reports.plots): valid PNGs whose pixels follow the data, and
the report's Markdown showing them, on the scripted week."""

from __future__ import annotations

import base64
import io
import re
import struct

import pytest
from matplotlib.image import imread
from support.fleet_week import DRAINS, FLEET_WEEK, NODES, T0, UNTIL, hottest_gpus, incident_curves

from trainmedic.reports.fleet import (
    CategoryFigures,
    fleet_markdown,
    fleet_report,
    racks_by_position,
)
from trainmedic.reports.plots import (
    DPI,
    IncidentCurve,
    StepPoint,
    fleet_plots,
    gpu_hours_by_category_png,
    incident_png,
    temperature_by_rack_png,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def size(png: bytes) -> tuple[int, int]:
    assert png[:8] == PNG_SIGNATURE and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    return width, height


def week_report():  # type: ignore[no-untyped-def]
    return fleet_report(
        FLEET_WEEK,
        DRAINS,
        since=T0,
        until=UNTIL,
        racks=racks_by_position(NODES, 4),
        temperatures=hottest_gpus(),
    )


def test_gpu_hours_by_category_is_a_png_that_follows_the_figures() -> None:
    one = [CategoryFigures(category="ECCError", failures=1, gpu_hours_lost=96.0)]
    two = [*one, CategoryFigures(category="NCCLTimeout", failures=2, gpu_hours_lost=40.0)]
    png = gpu_hours_by_category_png(one)
    assert size(png) == (6.4 * DPI, round((0.5 + 1.4) * DPI))
    assert gpu_hours_by_category_png(one) == png  # the same data, the same bytes
    assert size(gpu_hours_by_category_png(two))[1] > size(png)[1]  # a bar more: taller
    more = [CategoryFigures(category="ECCError", failures=1, gpu_hours_lost=500.0)]
    assert gpu_hours_by_category_png(more) != png


def test_temperature_by_rack_draws_the_hot_node() -> None:
    cool = {"rack01": {"node001": 44.0, "node002": 44.0}, "rack02": {"node003": 44.0}}
    hot = {"rack01": {"node001": 44.0, "node002": 96.0}, "rack02": {"node003": 44.0}}
    cool_png = temperature_by_rack_png(cool, "peak over the window")
    hot_png = temperature_by_rack_png(hot, "peak over the window")
    assert size(cool_png) == size(hot_png) and cool_png != hot_png
    assert temperature_by_rack_png(cool, "at report time") != cool_png  # the title says which
    # Each rack's bar (its hottest GPU) as drawn: the bar colour's pixels left and right of
    # the middle (rack01 left, rack02 right). Cool: the same height (the y label moves the
    # axes off the middle a little); hot: 96 against 44.
    bar = (0xF4 / 255, 0xA5 / 255, 0x82 / 255)

    def bar_pixels(png: bytes) -> tuple[int, int]:
        pixels = imread(io.BytesIO(png))[:, :, :3]
        mask = abs(pixels - bar).max(axis=2) < 0.02
        middle = mask.shape[1] // 2
        return int(mask[:, :middle].sum()), int(mask[:, middle:].sum())

    left, right = bar_pixels(cool_png)
    assert left > 0 and abs(left - right) <= 0.15 * right
    left, right = bar_pixels(hot_png)
    assert left > 1.6 * right > 0


def test_incident_plot_follows_the_curve_and_survives_a_nan() -> None:
    (curve, *_) = incident_curves(FLEET_WEEK)
    png = incident_png(curve)
    assert size(png) == (6.4 * DPI, 4.2 * DPI)
    shifted = curve.model_copy(update={"failed_step": (curve.failed_step or 0) - 20})
    assert incident_png(shifted) != png
    nan = IncidentCurve(
        job_id="300",
        category="NaNLoss",
        failed_step=12,
        resumed_from=None,
        before=[
            StepPoint(step=s, seconds=0.05, loss=float("nan") if s > 10 else 3.0) for s in range(13)
        ],
        after=[],
    )
    assert size(incident_png(nan)) == size(png)


def test_the_week_has_one_picture_per_kind_and_failure() -> None:
    report = week_report()
    plots = fleet_plots(report, incident_curves(FLEET_WEEK))
    assert list(plots) == [
        "gpu-hours-by-category.png",
        "temperature-by-rack.png",
        "incident-100.png",
        "incident-101.png",
        "incident-200.png",
        "incident-201.png",
    ]
    assert all(png.startswith(PNG_SIGNATURE) for png in plots.values())
    assert len(set(plots.values())) == len(plots)
    # Nothing to draw: no picture (no failures, no temperatures, no incidents).
    quiet = fleet_report(FLEET_WEEK[2:3], [], since=T0, until=UNTIL)
    assert fleet_plots(quiet, []) == {}


def test_racks_carry_their_nodes_drains_and_hottest_gpu() -> None:
    racks = racks_by_position(NODES, 4)
    assert racks["node001"] == racks["node004"] == "rack01" and racks["node016"] == "rack04"
    report = week_report()
    assert [(r.rack, r.nodes, r.drains, r.temperature_c) for r in report.racks] == [
        ("rack01", 4, 1, 44.0),
        ("rack02", 4, 3, 44.0),
        ("rack03", 4, 1, 96.0),
        ("rack04", 4, 0, 44.0),
    ]
    assert {n.node: n.temperature_c for n in report.nodes}["node011"] == 96.0


def test_the_markdown_embeds_each_picture_as_it_was_drawn() -> None:
    report = week_report()
    plots = fleet_plots(report, incident_curves(FLEET_WEEK))
    text = fleet_markdown(report, plots)
    embedded = dict(re.findall(r"!\[([\w.-]+)\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", text))
    assert {name: base64.b64decode(data) for name, data in embedded.items()} == plots
    assert "| rack03 | 4 | 1 | 96 |" in text and "## Plots" in text
    assert "data:image" not in fleet_markdown(report)


@pytest.mark.parametrize("per_rack", [1, 5, 16])
def test_every_node_has_one_rack(per_rack: int) -> None:
    racks = racks_by_position(list(reversed(NODES)), per_rack)
    assert sorted(racks) == NODES
    assert len(set(racks.values())) == -(-len(NODES) // per_rack)
