"""The fleet report: how much training time the cluster loses, and where. Pure.

Per training run (a job and its resubmissions), the effective training time ratio (ETTR, as
the largest operators report it): productive training time over wall time, where an
attempt's productive time is its wall time times the share of its steps that were kept (the
steps past the checkpoint the next attempt resumed from were lost). Per failure category,
the failures and the GPU-hours lost: the lost steps' time plus the time until the
resubmission was submitted, times the job's GPUs. Per node, trainmedic's drains; a node
drained ``lemon_drains`` times within ``lemon_window`` is a lemon. Per rack, its nodes' drains
and GPU temperatures (the hottest GPU of each node: the window's peak where a Prometheus
server keeps the history, else one reading at report time, and the report says which).

The Markdown embeds the report's pictures (``reports.plots``) as ``data:image/png;base64``
images: the Prefect UI renders a markdown artifact's images, and an image artifact would
need a URL the browser can reach, which trainmedic does not serve.
"""

from __future__ import annotations

import base64
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta

from pydantic import BaseModel

from trainmedic.core.models import Strict

__all__ = ["Attempt", "FleetReport", "fleet_markdown", "fleet_report", "racks_by_position"]

FAILED_STATES = ("FAILED", "NODE_FAIL", "TIMEOUT")


class Attempt(Strict):
    """One job of a training run, as the scheduler and the trainer's heartbeat saw it."""

    job_id: str
    run: str  # the first job of its training run
    name: str
    gpus: int
    submitted_at: datetime
    ended_at: datetime | None  # None: still running
    state: str
    start_step: int  # the checkpoint it resumed from (0: from the start)
    end_step: int | None  # the last step it reached
    category: str | None = None  # what triage diagnosed, for a failed attempt


class RunFigures(BaseModel):
    run: str
    name: str
    attempts: int
    restarts: int
    wall_h: float
    productive_h: float
    ettr: float
    steps_lost: int
    gpu_hours_lost: float


class CategoryFigures(BaseModel):
    category: str
    failures: int
    gpu_hours_lost: float


class NodeFigures(BaseModel):
    node: str
    drains: int
    mtbf_h: float | None  # the window over its drains; None without one
    lemon: bool
    temperature_c: float | None = None  # its hottest GPU (see FleetReport.temperature_kind)
    repairs: int = 0  # GPU resets and reboots trainmedic made in the window
    inspection: bool = False  # kept out for hardware inspection (never returned automatically)


class RackFigures(BaseModel):
    rack: str
    nodes: int
    drains: int
    temperature_c: float | None  # its hottest GPU
    temperatures: dict[str, float]  # node -> its hottest GPU


class FleetReport(BaseModel):
    since: datetime
    until: datetime
    ettr: float | None  # over every run, weighted by GPUs
    runs: list[RunFigures]
    categories: list[CategoryFigures]
    nodes: list[NodeFigures]
    lemons: list[str]
    racks: list[RackFigures] = []
    temperature_kind: str = "peak over the window"


def racks_by_position(nodes: Sequence[str], per_rack: int) -> dict[str, str]:
    """Node -> rack where the scheduler knows no topology: consecutive nodes (by name),
    ``per_rack`` to a rack, named rack01, rack02, ..."""
    ordered = sorted(set(nodes))
    return {node: f"rack{index // per_rack + 1:02d}" for index, node in enumerate(ordered)}


def _hours(delta: timedelta) -> float:
    return max(delta.total_seconds(), 0.0) / 3600


def fleet_report(
    attempts: Sequence[Attempt],
    drains: Sequence[tuple[str, datetime]],
    *,
    since: datetime,
    until: datetime,
    lemon_drains: int = 3,
    lemon_window: timedelta = timedelta(days=7),
    racks: Mapping[str, str] | None = None,
    temperatures: Mapping[str, float] | None = None,
    temperature_kind: str = "peak over the window",
    repairs: Sequence[tuple[str, datetime]] = (),
    inspection: Collection[str] = (),
) -> FleetReport:
    """``racks``: node -> rack; ``temperatures``: node -> its hottest GPU's temperature;
    ``repairs``: (node, when) of each repair; ``inspection``: nodes waiting for a technician."""
    by_run: dict[str, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        if attempt.submitted_at <= until and (attempt.ended_at or until) >= since:
            by_run[attempt.run].append(attempt)
    runs: list[RunFigures] = []
    failures: Counter[str] = Counter()
    lost_by_category: defaultdict[str, float] = defaultdict(float)
    weighted_productive = weighted_wall = 0.0
    for run, chain in sorted(by_run.items()):
        chain.sort(key=lambda a: a.submitted_at)
        productive = lost_gpu_h = 0.0
        steps_lost = 0
        for index, attempt in enumerate(chain):
            end = attempt.ended_at or until
            wall = _hours(end - attempt.submitted_at)
            reached = attempt.end_step if attempt.end_step is not None else attempt.start_step
            advanced = max(reached - attempt.start_step, 0)
            following = chain[index + 1] if index + 1 < len(chain) else None
            kept_to = min(following.start_step, reached) if following else reached
            kept = max(kept_to - attempt.start_step, 0)
            share = kept / advanced if advanced else 0.0
            productive += wall * share
            steps_lost += advanced - kept
            if attempt.state in FAILED_STATES:
                category = attempt.category or "undiagnosed"
                gap = _hours(following.submitted_at - end) if following else 0.0
                lost = (wall * (1 - share) + gap) * attempt.gpus
                failures[category] += 1
                lost_by_category[category] += lost
                lost_gpu_h += lost
        wall_h = _hours((chain[-1].ended_at or until) - chain[0].submitted_at)
        gpus = max(a.gpus for a in chain)
        weighted_productive += productive * gpus
        weighted_wall += wall_h * gpus
        runs.append(
            RunFigures(
                run=run,
                name=chain[0].name,
                attempts=len(chain),
                restarts=len(chain) - 1,
                wall_h=round(wall_h, 3),
                productive_h=round(productive, 3),
                ettr=round(productive / wall_h, 4) if wall_h else 0.0,
                steps_lost=steps_lost,
                gpu_hours_lost=round(lost_gpu_h, 2),
            )
        )
    window_h = _hours(until - since)
    counted = Counter(node for node, at in drains if since <= at <= until)
    recent = Counter(node for node, at in drains if until - lemon_window <= at <= until)
    lemons = sorted(node for node, n in recent.items() if n >= lemon_drains)
    repaired = Counter(node for node, at in repairs if since <= at <= until)
    listed = set(counted) | set(repaired) | set(inspection)
    nodes = [
        NodeFigures(
            node=node,
            drains=counted[node],
            mtbf_h=round(window_h / counted[node], 2) if counted[node] else None,
            lemon=node in lemons,
            temperature_c=(temperatures or {}).get(node),
            repairs=repaired[node],
            inspection=node in inspection,
        )
        for node in sorted(listed, key=lambda node: (-counted[node], node))
    ]
    categories = [
        CategoryFigures(category=c, failures=failures[c], gpu_hours_lost=round(lost, 2))
        for c, lost in sorted(lost_by_category.items(), key=lambda item: -item[1])
    ]
    return FleetReport(
        racks=_rack_figures(racks or {}, temperatures or {}, counted),
        temperature_kind=temperature_kind,
        since=since,
        until=until,
        ettr=round(weighted_productive / weighted_wall, 4) if weighted_wall else None,
        runs=runs,
        categories=categories,
        nodes=nodes,
        lemons=lemons,
    )


def _rack_figures(
    racks: Mapping[str, str], temperatures: Mapping[str, float], drains: Counter[str]
) -> list[RackFigures]:
    members: defaultdict[str, list[str]] = defaultdict(list)
    for node, rack in racks.items():
        members[rack].append(node)
    figures = []
    for rack, nodes in sorted(members.items()):
        temps = {n: temperatures[n] for n in sorted(nodes) if n in temperatures}
        figures.append(
            RackFigures(
                rack=rack,
                nodes=len(nodes),
                drains=sum(drains[n] for n in nodes),
                temperature_c=max(temps.values()) if temps else None,
                temperatures=temps,
            )
        )
    return figures


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def fleet_markdown(report: FleetReport, plots: Mapping[str, bytes] | None = None) -> str:
    """The report as Markdown; ``plots`` (file name -> PNG) are embedded as data URIs."""
    ettr = f"{report.ettr:.1%}" if report.ettr is not None else "no runs"
    lines = [
        f"# Fleet report {report.since:%Y-%m-%d %H:%M} to {report.until:%Y-%m-%d %H:%M} UTC",
        "",
        f"Effective training time ratio (ETTR, GPU-weighted): **{ettr}**",
        "",
        "## Training runs",
        "",
        "| run | name | attempts | wall h | productive h | ETTR | steps lost | GPU-h lost |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {r.run} | {r.name} | {r.attempts} | {r.wall_h:.2f} | {r.productive_h:.2f} | "
            f"{r.ettr:.1%} | {r.steps_lost} | {r.gpu_hours_lost:.1f} |"
            for r in report.runs
        ),
        "",
        "## Failures by category",
        "",
        "| category | failures | GPU-h lost |",
        "|---|---|---|",
        *(f"| {c.category} | {c.failures} | {c.gpu_hours_lost:.1f} |" for c in report.categories),
        "",
        "## Nodes drained",
        "",
        f"| node | drains | MTBF h | repairs | lemon | hardware inspection | hottest GPU °C "
        f"({report.temperature_kind}) |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {n.node} | {n.drains} | {n.mtbf_h if n.mtbf_h is not None else '-'} | "
            f"{n.repairs} | {'yes' if n.lemon else ''} | {'waiting' if n.inspection else ''} | "
            f"{_cell(n.temperature_c)} |"
            for n in report.nodes
        ),
    ]
    if report.racks:
        lines += [
            "",
            "## Racks",
            "",
            f"| rack | nodes | drains | hottest GPU °C ({report.temperature_kind}) |",
            "|---|---|---|---|",
            *(
                f"| {r.rack} | {r.nodes} | {r.drains} | {_cell(r.temperature_c)} |"
                for r in report.racks
            ),
        ]
    if report.lemons:
        lines += [
            "",
            f"Lemons (kept out, never returned automatically): {', '.join(report.lemons)}",
        ]
    if plots:
        lines += ["", "## Plots"]
        for name, png in plots.items():
            data = base64.b64encode(png).decode("ascii")
            lines += ["", f"![{name}](data:image/png;base64,{data})"]
    return "\n".join(lines) + "\n"
