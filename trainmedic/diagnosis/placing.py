"""Where a failure started: the host (or rank, GPU) the winning evidence places it on, else the
one host every log was written on.

What this names is the report's origin. A drain needs more: a host in the winning evidence's
own lines (`engine.suspect_hosts`), so a host named here only because the logs came from one
machine never drains anything by itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from trainmedic.core.taxonomy import Category
from trainmedic.diagnosis.catalogue import Role
from trainmedic.diagnosis.ranking import Candidate, locations
from trainmedic.diagnosis.scan import Hit, SourceScan

__all__ = ["MAX_LOCATIONS", "one_place_per_line", "only_host", "origin_host"]

MAX_LOCATIONS = 4

# A lost node's obituary is written by the survivors: the machine a log came from is not where
# it started. (A hang's stacks are dumped from the stuck process, on its own machine: where a
# one-host log was written is where it hung, or the one place looked at.)
_NOT_WHERE_WRITTEN = frozenset({Category.NodeFailure})


def origin_host(winner: Candidate, scans: Sequence[SourceScan], hits: Sequence[Hit]) -> str | None:
    """Where the winning evidence places the cause; else, unless only witnesses wrote it, the
    one host the logs were written on."""
    placed = _placed(winner, hits)
    if placed is not None and placed.startswith(("rank ", "GPU ")):
        # The evidence names ranks or a GPU but no machine (a cause's rank, the one rank a
        # timeout was seen on): it ran on the one machine known.
        host = _one_known_host(placed, winner, scans, hits)
        if host is not None:
            return host if placed.startswith("rank ") else f"{host} {placed}"
    if placed is not None:
        return placed
    # A symptom is seen by every rank, wherever it began: it names no rank or host of its own.
    # But where every log was written on one machine (a one-node job timing out in a
    # collective), that machine is where it began. Only the report's origin: a drain needs a
    # host in a cause's own lines (engine.suspect_hosts), so this sends the job to the pair test.
    # Not where every line is a witness's: those report a failure somewhere else.
    if all(h.signature.witness for h in winner.hits):
        return None
    return only_host(winner.category, scans, hits)


def only_host(
    category: Category,
    scans: Sequence[SourceScan],
    hits: Sequence[Hit],
    *,
    suggested: bool = False,
) -> str | None:
    """The one host every log was written on (their first and last lines, shell prompts, file
    names, every matched line): a one-node log (a one-node job, a report pasted from one
    machine) failed there. None where two hosts wrote, or none says, or for a category the
    survivors report (see ``_NOT_WHERE_WRITTEN``) unless the category is only ``suggested``
    (the word table's guess, which drains nothing: the machine the logs came from is still the
    place to look first)."""
    if category in _NOT_WHERE_WRITTEN and not suggested:
        return None
    hosts = set().union(*(scan.writers for scan in scans))
    hosts.update(h.host for h in hits if h.host)
    return hosts.pop() if len(hosts) == 1 else None


def _placed(winner: Candidate, hits: Sequence[Hit]) -> str | None:
    context = [h for h in hits if h.signature.role is Role.context]
    if winner.category is Category.Hang:
        # A hang detector that names who never arrived (a monitored barrier) places it; a
        # stack dump or a stale heartbeat says only where someone looked.
        named = locations([h for h in winner.hits if h.signature.regex.groupindex])
        if named:
            return ", ".join(named[:MAX_LOCATIONS])
    if winner.is_symptom or winner.category is Category.Hang:
        # Many ranks timing out say nothing about which one stalled; one rank does.
        hot = locations([h for h in context if h.file == "telemetry"])
        if hot:
            return ", ".join(hot[:MAX_LOCATIONS])
        symptoms = [h for h in winner.hits if h.signature.role is Role.symptom]
        # The cascade's initiator, where a line names it (a desync report's lagging rank).
        named = locations([h for h in symptoms if h.signature.regex.groupindex])
        if len(named) == 1:
            return named[0]
        symptom_places = locations(symptoms)
        return symptom_places[0] if len(symptom_places) == 1 else None
    places = locations([h for h in winner.hits if h.signature.role is Role.cause])
    if not places:
        context_places = locations(context)
        return context_places[0] if len(context_places) == 1 else None
    return ", ".join(places[:MAX_LOCATIONS])


def _one_known_host(
    placed: str, winner: Candidate, scans: Sequence[SourceScan], hits: Sequence[Hit]
) -> str | None:
    """The machine a rank- or GPU-only cause ran on: the one host a launcher's summary names
    for ranks (torchelastic's "Root Cause ... host : node7"), else the one host every log was
    written on ("GPU 0000:03:00.0" on the node whose prompt shows)."""
    if all(place.startswith("rank ") for place in placed.split(", ")):
        context = [h for h in hits if h.signature.role is Role.context]
        hosts = [p for p in locations(context) if not p.startswith(("rank ", "GPU "))]
        if len(hosts) == 1:
            return hosts[0]
    return only_host(winner.category, scans, hits)


def one_place_per_line(hits: list[Hit]) -> list[Hit]:
    """Where a line names the host it is about ("closed by remote peer node2"), or is a
    witness's ("Connection reset by peer"), every other signature matching that line loses the
    place its prefix gave it: a catch-all ("NCCL WARN") would otherwise put the fault on the
    machine that printed the line, and drain it."""
    settled = {(h.source_index, h.line) for h in hits if h.named or h.signature.witness}
    if not settled:
        return hits
    return [
        replace(hit, host=None, rank=None, gpu=None)
        if (hit.source_index, hit.line) in settled and not hit.named and not hit.signature.witness
        else hit
        for hit in hits
    ]
