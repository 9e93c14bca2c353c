"""From hits to one Diagnosis: the root cause, not the first error.

Every rank of a job that lost one GPU logs *something*: the broken rank an Xid/ECC/NVLink
error, the others collective timeouts. Categories are therefore scored by their most
decisive line (signature weight), symptoms count half, near-ties go to the earliest line,
and telemetry, exit code and heartbeat age add evidence the logs may not carry.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainmedic.core.models import Diagnosis, Evidence, GpuTelemetry
from trainmedic.core.taxonomy import Category, layer_of, remediation_for
from trainmedic.core.validate import HOSTNAME_RE
from trainmedic.diagnosis.catalogue import Catalogue, Role, Signature
from trainmedic.diagnosis.llm import LlmConfig, classify_with_llm
from trainmedic.diagnosis.loss import find_loss_spike
from trainmedic.diagnosis.overlay import site_catalogue
from trainmedic.diagnosis.scan import Hit, SourceScan, scan_source
from trainmedic.diagnosis.sources import LogSource

__all__ = ["diagnose", "diagnose_paths", "suspect_hosts"]

log = logging.getLogger(__name__)

TIE_MARGIN = 0.05
SYMPTOM_FACTOR = 0.5
MAX_WINNER_EVIDENCE = 8
MAX_OTHER_EVIDENCE = 6
MAX_LOCATIONS = 4

HOT_GPU_C = 90.0

# What a fault typically drags along on the same or other ranks: these do not count as
# rival explanations when judging how sure the diagnosis is.
_GPU_FAULT_FALLOUT = frozenset({Category.CUDAError, Category.NCCLError, Category.NetworkError})
CONSEQUENCES: dict[Category, frozenset[Category]] = {
    Category.GPUFallenOff: _GPU_FAULT_FALLOUT,
    Category.ECCError: _GPU_FAULT_FALLOUT,
    Category.NVLinkError: _GPU_FAULT_FALLOUT,
    Category.NodeFailure: frozenset({Category.NCCLError, Category.NetworkError}),
    Category.NetworkError: frozenset({Category.NCCLError, Category.CUDAError}),
    Category.HostOOM: frozenset({Category.DataloaderKilled}),
    Category.DataloaderKilled: frozenset({Category.HostOOM, Category.CUDAError}),
}


def _synthetic(sig_id: str, category: Category, weight: float, role: Role = Role.cause):
    return Signature(
        id=sig_id,
        category=category,
        role=role,
        weight=weight,
        regex=re.compile("(?!)"),
        examples=(),
    )


LOSS_SPIKE = _synthetic("loss-spike", Category.LossSpike, 0.7)
TELEMETRY_FALLEN_OFF = _synthetic("telemetry-xid-79", Category.GPUFallenOff, 0.9)
TELEMETRY_ECC = _synthetic("telemetry-ecc", Category.ECCError, 0.9)
TELEMETRY_NVLINK = _synthetic("telemetry-nvlink", Category.NVLinkError, 0.85)
TELEMETRY_HOT = _synthetic("telemetry-temperature", Category.Unknown, 0.0, Role.context)
EXIT_SIGKILL = _synthetic("exit-code-sigkill", Category.HostOOM, 0.55)
EXIT_SEGFAULT = _synthetic("exit-code-segfault", Category.CUDAError, 0.4)
HEARTBEAT_STALE = _synthetic("heartbeat-stale", Category.Hang, 0.4)
_SYNTHETIC_SOURCE = 1_000_000  # sorts after every real file when there is no timestamp


@dataclass(frozen=True)
class _Candidate:
    category: Category
    score: float
    best: Hit
    hits: tuple[Hit, ...]

    @property
    def is_symptom(self) -> bool:
        return self.best.signature.role is Role.symptom


def diagnose(
    sources: Sequence[LogSource],
    *,
    telemetry: Sequence[GpuTelemetry] = (),
    heartbeat_age_s: float | None = None,
    hang_after_s: float = 600.0,
    exit_code: int | None = None,
    llm: LlmConfig | None = None,
    catalogue: Catalogue | None = None,
) -> Diagnosis:
    """Diagnose one failed (or stuck) job from all of its logs.

    ``sources``: every log of the job (one per rank/host, dmesg, launcher). ``telemetry``:
    per-GPU readings of the job's nodes. ``heartbeat_age_s``: seconds since the job last
    made progress. ``exit_code``: what the scheduler reported. ``llm``: asked only when no
    rule explains the logs.
    """
    cat = catalogue or site_catalogue()
    scans = [scan_source(source, index, cat) for index, source in enumerate(sources)]
    hits = [hit for scan in scans for hit in scan.hits()]
    hits.extend(_loss_hits(scans))
    hits.extend(_telemetry_hits(telemetry, cat))
    hits.extend(_exit_code_hits(exit_code, hits))
    stale = heartbeat_age_s is not None and heartbeat_age_s >= hang_after_s
    if stale:
        hits.append(
            _synthetic_hit(HEARTBEAT_STALE, f"no progress for {heartbeat_age_s:.0f} s", None)
        )

    candidates = _candidates(hits)
    if not candidates:
        return _unknown(scans, hits, llm)
    winner = _pick(candidates)
    confidence = _confidence(winner, candidates, heartbeat_age_s, hang_after_s)
    return Diagnosis(
        category=winner.category,
        layer=layer_of(winner.category),
        root_cause_host=_root_cause_host(winner, hits),
        confidence=round(confidence, 3),
        evidence=_evidence(winner, candidates, hits),
        remediation=remediation_for(winner.category),
        source="telemetry"
        if all(h.file == "telemetry" for h in winner.hits if h.signature.role is Role.cause)
        else "rules",
    )


def diagnose_paths(paths: Sequence[str | Path], **options) -> Diagnosis:
    """``diagnose`` over files ("-" is stdin); host and rank are guessed from file names."""
    return diagnose([LogSource.from_path(path) for path in paths], **options)


def suspect_hosts(diagnosis: Diagnosis) -> list[str]:
    """Hostnames (safe for the scheduler/Ansible) that the winning evidence points at."""
    hosts: list[str] = []
    for evidence in diagnosis.evidence:
        if evidence.category is not diagnosis.category or evidence.host is None:
            continue
        if HOSTNAME_RE.match(evidence.host) and evidence.host not in hosts:
            hosts.append(evidence.host)
    return hosts


# ----------------------------------------------------------------------------- evidence


def _synthetic_hit(
    signature: Signature,
    text: str,
    host: str | None,
    *,
    file: str = "<job>",
    line: int = 0,
    gpu: str | None = None,
    source_index: int = _SYNTHETIC_SOURCE,
    rank: int | None = None,
) -> Hit:
    return Hit(
        signature=signature,
        source_index=source_index,
        file=file,
        line=line,
        text=text,
        host=host,
        rank=rank,
        gpu=gpu,
        timestamp=None,
    )


def _loss_hits(scans: Sequence[SourceScan]) -> list[Hit]:
    hits = []
    for scan in scans:
        spike = find_loss_spike(scan.loss_points)
        if spike is not None:
            hits.append(
                _synthetic_hit(
                    LOSS_SPIKE,
                    spike.describe(),
                    scan.source.host,
                    file=scan.source.name,
                    line=spike.line,
                    source_index=scan.index,
                    rank=scan.source.rank,
                )
            )
    return hits


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
                _synthetic_hit(
                    signature, readings, gpu.host.lower(), file="telemetry", gpu=str(gpu.gpu)
                )
            )
    return hits


def _exit_code_hits(exit_code: int | None, hits: Sequence[Hit]) -> list[Hit]:
    if exit_code is None:
        return []
    if exit_code in (137, -9):
        return [_synthetic_hit(EXIT_SIGKILL, f"exit code {exit_code} (SIGKILL)", None)]
    if exit_code in (139, -11):
        if any(h.signature.category is Category.DataloaderKilled for h in hits):
            return []  # the dataloader signature already explains the segfault
        return [_synthetic_hit(EXIT_SEGFAULT, f"exit code {exit_code} (SIGSEGV)", None)]
    return []


# ----------------------------------------------------------------------------- ranking


def _candidates(hits: Sequence[Hit]) -> list[_Candidate]:
    by_category: dict[Category, list[Hit]] = {}
    for hit in hits:
        if hit.signature.role is Role.context:
            continue
        by_category.setdefault(hit.signature.category, []).append(hit)
    candidates = []
    for category, category_hits in by_category.items():
        ordered = tuple(sorted(category_hits, key=lambda h: h.order))
        best = max(ordered, key=lambda h: (_score(h), -ordered.index(h)))
        candidates.append(_Candidate(category, _score(best), best, ordered))
    return candidates


def _score(hit: Hit) -> float:
    factor = SYMPTOM_FACTOR if hit.signature.role is Role.symptom else 1.0
    return hit.signature.weight * factor


def _pick(candidates: Sequence[_Candidate]) -> _Candidate:
    top = max(c.score for c in candidates)
    contenders = [c for c in candidates if c.score >= top - TIE_MARGIN]
    return min(contenders, key=lambda c: (c.hits[0].order, -c.score))


def _confidence(
    winner: _Candidate,
    candidates: Sequence[_Candidate],
    heartbeat_age_s: float | None,
    hang_after_s: float,
) -> float:
    if winner.category is Category.Hang and heartbeat_age_s is not None:
        overdue = heartbeat_age_s / max(hang_after_s, 1.0) - 1.0
        return min(0.8, 0.4 + 0.4 * min(1.0, overdue))
    # A rival only counts on lines of its own: "CUDA error: uncorrectable ECC error" is one
    # fact matched by two signatures, not two competing explanations.
    explained = {(h.source_index, h.line) for h in winner.hits}
    rival = max(
        (
            _score(h)
            for c in candidates
            if c is not winner
            and not c.is_symptom
            and c.category not in CONSEQUENCES.get(winner.category, frozenset())
            for h in c.hits
            if (h.source_index, h.line) not in explained
        ),
        default=0.0,
    )
    confidence = winner.score - 0.5 * rival
    files = {h.source_index for h in winner.hits if h.file != "telemetry"}
    confidence += min(0.1, 0.03 * (len(files) - 1))
    telemetry_agrees = any(h.file == "telemetry" for h in winner.hits)
    logs_agree = any(h.file != "telemetry" for h in winner.hits)
    if telemetry_agrees and logs_agree:
        confidence += 0.1
    return max(0.05, min(0.99, confidence))


# ----------------------------------------------------------------------------- placing


def _locations(hits: Sequence[Hit]) -> list[str]:
    """One label per distinct host (else rank, else GPU). A GPU named on another line of
    the same file joins that file's host/rank label ("rank 0" + "GPU 0" -> "rank 0 GPU 0")."""
    places: dict[str, list[str | None]] = {}  # key -> [where, gpu]
    owner_by_source: dict[int, str] = {}
    loose_gpus: list[tuple[int, str]] = []
    for hit in hits:
        where = hit.host or (f"rank {hit.rank}" if hit.rank is not None else None)
        if where is None:
            if hit.gpu is not None:
                loose_gpus.append((hit.source_index, hit.gpu))
            continue
        place = places.setdefault(where, [where, None])
        if place[1] is None and hit.gpu is not None:
            place[1] = hit.gpu
        owner_by_source.setdefault(hit.source_index, where)
    for source_index, gpu in loose_gpus:
        owner = owner_by_source.get(source_index)
        if owner is not None:
            if places[owner][1] is None:
                places[owner][1] = gpu
        else:
            places.setdefault(f"GPU {gpu}", [None, gpu])
    hosted = [p for p in places.values() if p[0] is not None and not p[0].startswith("rank ")]
    chosen = hosted or list(places.values())
    labels = []
    for where, gpu in chosen:
        gpu_label = f"GPU {gpu}" if gpu is not None else None
        labels.append(" ".join(part for part in (where, gpu_label) if part))
    return labels


def _root_cause_host(winner: _Candidate, hits: Sequence[Hit]) -> str | None:
    context = [h for h in hits if h.signature.role is Role.context]
    if winner.is_symptom or winner.category is Category.Hang:
        # Many ranks timing out say nothing about which one stalled; one rank does.
        hot = _locations([h for h in context if h.file == "telemetry"])
        if hot:
            return ", ".join(hot[:MAX_LOCATIONS])
        symptom_places = _locations([h for h in winner.hits if h.signature.role is Role.symptom])
        return symptom_places[0] if len(symptom_places) == 1 else None
    places = _locations([h for h in winner.hits if h.signature.role is Role.cause])
    if not places:
        places = _locations(context)
        if len(places) != 1:
            return None
    return ", ".join(places[:MAX_LOCATIONS])


def _evidence(
    winner: _Candidate, candidates: Sequence[_Candidate], hits: Sequence[Hit]
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
    )


def _unknown(scans: Sequence[SourceScan], hits: Sequence[Hit], llm: LlmConfig | None) -> Diagnosis:
    context = [h for h in hits if h.signature.role is Role.context]
    places = _locations(context)
    root = places[0] if len(places) == 1 else None
    evidence = tuple(_to_evidence(h) for h in context[:MAX_OTHER_EVIDENCE])
    if llm is not None and any(scan.tail for scan in scans):
        answer = classify_with_llm({scan.source.name: scan.tail for scan in scans}, llm)
        if answer is not None and answer.category is not Category.Unknown:
            return Diagnosis(
                category=answer.category,
                layer=layer_of(answer.category),
                root_cause_host=answer.root_cause_host or root,
                confidence=answer.confidence,
                evidence=evidence,
                remediation=remediation_for(answer.category),
                source="llm",
            )
    return Diagnosis(
        category=Category.Unknown,
        layer=layer_of(Category.Unknown),
        root_cause_host=root,
        confidence=0.1,
        evidence=evidence,
        remediation=remediation_for(Category.Unknown),
    )
