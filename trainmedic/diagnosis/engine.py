"""From hits to one Diagnosis: the root cause, not the first error.

Every rank of a job that lost one GPU logs *something*: the broken rank an Xid/ECC/NVLink
error, the others collective timeouts, socket resets, NCCL aborts. The ranking is a small
causal model, not line order:

1. Fallout is set aside: a category that another cause present in the job drags along
   (``CONSEQUENCES``: a GPU fault's NCCL, socket and storage errors; a node loss's timeouts)
   is that cause's consequence, whichever was printed first.
2. Of what is left, categories are scored by their most decisive line (signature weight),
   symptoms (collective timeouts) count half, near-ties go to a GPU's own hardware fault
   (lost, ECC, NVLink), then to the earliest line.
3. Corroborating lines (a job's exit code 137) count only beside a cause of their own
   category; alone they name a place and nothing else. A SIGKILL of one process that its
   launcher reports is a suspected host OOM, below the confidence floor (``killed-alone``).

Telemetry, exit code and heartbeat age add evidence the logs may not carry. Every rival
explanation is kept with the reason it lost (``Diagnosis.rivals``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

from trainmedic.core.models import Diagnosis, Evidence, GpuTelemetry
from trainmedic.core.taxonomy import Category, layer_of, remediation_for
from trainmedic.core.validate import HOSTNAME_RE
from trainmedic.diagnosis.catalogue import Catalogue, Role, Signature
from trainmedic.diagnosis.collectives import mismatched_collectives, save_unfinished
from trainmedic.diagnosis.fallback import unexplained
from trainmedic.diagnosis.learned import TokenModel, bundled_model
from trainmedic.diagnosis.llm import LlmConfig
from trainmedic.diagnosis.overlay import site_catalogue
from trainmedic.diagnosis.placing import one_place_per_line, only_host, origin_host
from trainmedic.diagnosis.ranking import (
    Candidate,
    aftermath,
    candidates,
    confidence,
    corroborated,
    explained,
    locations,
    pick,
    rivals,
)
from trainmedic.diagnosis.scan import Hit, SourceScan, scan_source
from trainmedic.diagnosis.silence import ends_in_progress, ends_unexplained
from trainmedic.diagnosis.sources import LogSource
from trainmedic.diagnosis.synthetic import (
    COLLECTIVE_MISMATCH,
    EXIT_SEGFAULT,
    EXIT_SIGKILL,
    HEARTBEAT_STALE,
    SAVE_UNFINISHED,
    SILENCE,
    TELEMETRY_ECC,
    TELEMETRY_FALLEN_OFF,
    TELEMETRY_HOT,
    TELEMETRY_NVLINK,
    UNEXPLAINED_END,
    curve_hits,
    synthetic_hit,
)

__all__ = ["diagnose", "diagnose_paths", "far_ends", "suspect_hosts", "task_hosts"]

log = logging.getLogger(__name__)

MAX_WINNER_EVIDENCE = 8
MAX_OTHER_EVIDENCE = 6

HOT_GPU_C = 90.0


def diagnose(
    sources: Sequence[LogSource],
    *,
    telemetry: Sequence[GpuTelemetry] = (),
    heartbeat_age_s: float | None = None,
    hang_after_s: float = 600.0,
    exit_code: int | None = None,
    llm: LlmConfig | None = None,
    catalogue: Catalogue | None = None,
    learned: TokenModel | None = None,
) -> Diagnosis:
    """Diagnose one failed (or stuck) job from all of its logs.

    ``sources``: every log of the job (one per rank/host, dmesg, launcher). ``telemetry``:
    per-GPU readings of the job's nodes. ``heartbeat_age_s``: seconds since the job last
    made progress. ``exit_code``: what the scheduler reported. ``llm``: asked only when no
    rule explains the logs; then ``learned`` (the corpus's word table unless given).
    """
    cat = catalogue or site_catalogue()
    scans = [scan_source(source, index, cat) for index, source in enumerate(sources)]
    hits = one_place_per_line([hit for scan in scans for hit in scan.hits()])
    hits.extend(curve_hits(scans))
    hits.extend(_telemetry_hits(telemetry, cat))
    hits.extend(_exit_code_hits(exit_code, hits))
    stale = heartbeat_age_s is not None and heartbeat_age_s >= hang_after_s
    if stale:
        hits.append(
            synthetic_hit(HEARTBEAT_STALE, f"no progress for {heartbeat_age_s:.0f} s", None)
        )

    if any(h.signature.category in _WAITING for h in hits):
        hits.extend(_save_hits(scans))
        hits.extend(_mismatch_hits(hits))
    hits, unproven = corroborated(hits)
    hits, after = aftermath(hits)
    unproven += after
    ranked = candidates(hits)
    if not ranked and heartbeat_age_s is None:
        ranked = _silence(SILENCE, ends_in_progress(scans, hits), scans)
    if not ranked:
        table = learned if learned is not None else bundled_model()
        guess = _unknown(scans, hits, llm, table, unproven)
        if guess.category is not Category.Unknown or heartbeat_age_s is not None:
            return guess
        ranked = _silence(UNEXPLAINED_END, ends_unexplained(scans, hits), scans)
        if not ranked:
            return guess
    fallout = explained(ranked)
    winner = pick([c for c in ranked if c.category not in fallout] or ranked)
    sure = confidence(winner, ranked, fallout, heartbeat_age_s, hang_after_s)
    return Diagnosis(
        category=winner.category,
        layer=layer_of(winner.category),
        root_cause_host=origin_host(winner, scans, hits),
        confidence=round(sure, 3),
        evidence=_evidence(winner, ranked, hits),
        remediation=remediation_for(winner.category),
        source="telemetry" if _from_telemetry(winner) else "rules",
        symptom_only=all(h.signature.role is Role.symptom for h in winner.hits),
        rivals=rivals(winner, ranked, fallout, unproven),
    )


def _silence(
    signature: Signature, end: tuple[int, str] | None, scans: Sequence[SourceScan]
) -> list[Candidate]:
    if end is None:
        return []
    index, line = end
    scan = scans[index]
    said = (
        "in ordinary output, no error and no exit"
        if signature is SILENCE
        else "with no word of an error or an exit"
    )
    hit = synthetic_hit(
        signature,
        f"the log ends {said}: {line[:200]}",
        None,
        file=scan.source.name,
        line=scan.lines,
        source_index=scan.index,
    )
    return candidates([hit])


_WAITING = frozenset({Category.NCCLTimeout, Category.Hang})


def _save_hits(scans: Sequence[SourceScan]) -> list[Hit]:
    found = save_unfinished(scans)
    if found is None:
        return []
    index, line, text = found
    scan = scans[index]
    return [
        synthetic_hit(
            SAVE_UNFINISHED,
            f"a checkpoint save began and never finished: {text[:200]}",
            scan.source.host,
            file=scan.source.name,
            line=line,
            source_index=index,
            rank=scan.source.rank,
        )
    ]


def _mismatch_hits(hits: Sequence[Hit]) -> list[Hit]:
    found = mismatched_collectives(hits)
    if found is None:
        return []
    first, other = found
    text = f"ranks timed out in different collectives at one sequence number: {first.text[:120]}"
    text += f" | {other.text[:120]}"
    return [
        synthetic_hit(
            COLLECTIVE_MISMATCH,
            text,
            None,
            file=first.file,
            line=first.line,
            source_index=first.source_index,
        )
    ]


def _from_telemetry(winner: Candidate) -> bool:
    causes = [h for h in winner.hits if h.signature.role is Role.cause]
    return bool(causes) and all(h.file == "telemetry" for h in causes)


def diagnose_paths(paths: Sequence[str | Path], **options) -> Diagnosis:
    """``diagnose`` over files ("-" is stdin); host and rank are guessed from file names."""
    return diagnose([LogSource.from_path(path) for path in paths], **options)


def suspect_hosts(diagnosis: Diagnosis) -> list[str]:
    """Hostnames (safe for the scheduler/Ansible) that the winning evidence proves at fault:
    not the far end of a broken connection, which its peer only names (see ``far_ends``)."""
    return _winning_hosts(diagnosis, far_end=False)


def far_ends(diagnosis: Diagnosis) -> list[str]:
    """Hostnames the winning evidence names only as the far end of a connection that broke:
    suspects for the pair test, which proves or clears them."""
    return _winning_hosts(diagnosis, far_end=True)


def _winning_hosts(diagnosis: Diagnosis, *, far_end: bool) -> list[str]:
    hosts: list[str] = []
    for evidence in diagnosis.evidence:
        host = evidence.host
        if evidence.category is not diagnosis.category or evidence.far_end is not far_end:
            continue
        if host is not None and HOSTNAME_RE.match(host) and host not in hosts:
            hosts.append(host)
    return hosts


# srun's own report of a task that failed (the srun-task-exited signature's lines): which host
# ran which task ids ("srun: error: worker-0: tasks 8,12,14: Exited with exit code 134").
_SRUN_TASKS = re.compile(
    r"^srun: error: (?P<host>[\w.-]+): tasks? (?P<tasks>\d{1,9}(?:[,-]\d{1,9})*):"
)
_MAX_TASKS_PER_HOST = 4096


def task_hosts(diagnosis: Diagnosis) -> dict[int, set[str]]:
    """The host(s) the logs' srun lines tie each task id to. Launched by srun one task per
    rank, a task id is the rank; launched one torchrun per node, it is the node's index: so
    this can contradict a guess of where a rank ran, never confirm one alone."""
    tied: dict[int, set[str]] = {}
    for evidence in diagnosis.evidence:
        found = _SRUN_TASKS.match(evidence.text.strip())
        if found is None:
            continue
        for part in found["tasks"].split(","):
            first, _, last = part.partition("-")
            tasks = range(int(first), int(last or first) + 1)  # the regex bounds the digits
            if len(tasks) > _MAX_TASKS_PER_HOST:
                continue  # a log is untrusted input: no srun prints such a range for one host
            for task in tasks:
                tied.setdefault(task, set()).add(found["host"])
    return tied


# ----------------------------------------------------------------------------- evidence


def _telemetry_hits(telemetry: Sequence[GpuTelemetry], cat: Catalogue) -> list[Hit]:
    # Telemetry reads Xids through the same catalogue as the log signatures.
    fallen_off, ecc, nvlink = (
        cat.xid_codes(c) for c in (Category.GPUFallenOff, Category.ECCError, Category.NVLinkError)
    )
    hits = []
    for gpu in telemetry:
        readings = (
            f"{gpu.host} GPU {gpu.gpu}: xid_last={gpu.xid_last} "
            f"ecc_dbe_total={gpu.ecc_dbe_total:g} "
            f"nvlink_errors_total={gpu.nvlink_errors_total:g} temperature_c={gpu.temperature_c}"
        )
        signatures = []
        # Lifetime counters (one scrape) are the node's history: only an increase counts.
        if not gpu.lifetime and gpu.xid_last in fallen_off:
            signatures.append(TELEMETRY_FALLEN_OFF)
        if not gpu.lifetime and (gpu.xid_last in ecc or gpu.ecc_dbe_total > 0):
            signatures.append(TELEMETRY_ECC)
        if not gpu.lifetime and (gpu.xid_last in nvlink or gpu.nvlink_errors_total > 0):
            signatures.append(TELEMETRY_NVLINK)
        if gpu.temperature_c is not None and gpu.temperature_c >= HOT_GPU_C:
            signatures.append(TELEMETRY_HOT)
        for signature in signatures:
            hits.append(
                synthetic_hit(
                    signature, readings, gpu.host.lower(), file="telemetry", gpu=str(gpu.gpu)
                )
            )
    return hits


def _exit_code_hits(exit_code: int | None, hits: Sequence[Hit]) -> list[Hit]:
    if exit_code is None:
        return []
    if exit_code in (137, -9):
        return [synthetic_hit(EXIT_SIGKILL, f"exit code {exit_code} (SIGKILL)", None)]
    if exit_code in (139, -11):
        if any(h.signature.category is Category.DataloaderKilled for h in hits):
            return []  # the dataloader signature already explains the segfault
        return [synthetic_hit(EXIT_SEGFAULT, f"exit code {exit_code} (SIGSEGV)", None)]
    return []


def _evidence(
    winner: Candidate, candidates: Sequence[Candidate], hits: Sequence[Hit]
) -> tuple[Evidence, ...]:
    chosen = list(winner.hits[:MAX_WINNER_EVIDENCE])
    others = sorted((c for c in candidates if c is not winner), key=lambda c: -c.score)
    chosen.extend(c.best for c in others[:MAX_OTHER_EVIDENCE])
    chosen.extend(h for h in hits if h.signature.role is Role.context and h not in chosen)
    return tuple(_to_evidence(hit) for hit in chosen[: MAX_WINNER_EVIDENCE + MAX_OTHER_EVIDENCE])


def _to_evidence(hit: Hit) -> Evidence:
    return Evidence(
        file=hit.file,
        line=hit.line,
        text=hit.text,
        signature=hit.signature.id,
        host=hit.host,
        category=hit.signature.category,
        far_end=hit.far_end,
    )


def _unknown(
    scans: Sequence[SourceScan],
    hits: Sequence[Hit],
    llm: LlmConfig | None,
    learned: TokenModel | None,
    unproven: Sequence[Hit] = (),
) -> Diagnosis:
    context = [h for h in hits if h.signature.role is Role.context]
    places = locations(context)
    diagnosis = unexplained(
        {scan.source.name: scan.tail for scan in scans},
        evidence=tuple(_to_evidence(h) for h in context[:MAX_OTHER_EVIDENCE]),
        root=places[0] if len(places) == 1 else None,
        rivals=rivals(None, [], {}, unproven),
        llm=llm,
        learned=learned,
        unproven={h.signature.category for h in unproven},
    )
    suggested = diagnosis.source in ("learned", "llm")  # a guess: it drains nothing
    only = (
        None
        if diagnosis.root_cause_host
        else only_host(diagnosis.category, scans, hits, suggested=suggested)
    )
    return diagnosis.model_copy(update={"root_cause_host": only}) if only else diagnosis
