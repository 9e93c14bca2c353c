"""Ranking evidence by a small causal model: fallout set aside, corroboration, scores,
confidence, and why each rival explanation lost.

A category that another cause present in the job drags along (``CONSEQUENCES``: a GPU
fault's NCCL, socket and storage errors; a node loss's timeouts) is that cause's fallout,
whichever was printed first. Of what is left, the most decisive line (signature weight) wins,
symptoms count half, near-ties go to a GPU's own hardware fault, then to the earliest line.
Corroborating lines (a job's exit code 137) count only beside a cause of their own category.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from trainmedic.core.models import Rival
from trainmedic.core.taxonomy import Category
from trainmedic.diagnosis.catalogue import Role
from trainmedic.diagnosis.scan import Hit

__all__ = [
    "CONSEQUENCES",
    "Candidate",
    "aftermath",
    "candidates",
    "confidence",
    "corroborated",
    "explained",
    "locations",
    "pick",
    "rivals",
    "score",
]

TIE_MARGIN = 0.05
SYMPTOM_FACTOR = 0.5
MAX_RIVALS = 6

# What a cause drags along on the same or other ranks: a category in the consequences of
# another cause present in the job is its fallout, not a rival explanation (unless each
# explains the other: then their scores decide).
_GPU_FAULT_FALLOUT = frozenset(
    {
        Category.CUDAError,
        Category.NCCLError,
        Category.NCCLTimeout,
        Category.NetworkError,
        Category.StorageError,
        Category.Hang,
    }
)
# A GPU's own hardware faults: as decisive as another cause, one of them wins (a lost GPU
# after a framework's recovered out-of-memory warning is what ended the job).
_GPU_HARDWARE = frozenset({Category.GPUFallenOff, Category.ECCError, Category.NVLinkError})
_STALL = frozenset({Category.NCCLTimeout, Category.Hang})  # every other rank waits
CONSEQUENCES: dict[Category, frozenset[Category]] = {
    Category.GPUFallenOff: _GPU_FAULT_FALLOUT,
    Category.ECCError: _GPU_FAULT_FALLOUT,
    Category.NVLinkError: _GPU_FAULT_FALLOUT,
    Category.NodeFailure: _STALL | {Category.NCCLError, Category.NetworkError},
    # (Not a CUDA fault: a peer's reset beside one is what the dying process did to the
    # connection, and the reset is a witness's line.)
    Category.NetworkError: _STALL | {Category.NCCLError},
    # "ncclUnhandledCudaError ... Last error: Cuda failure 'initialization error'"
    Category.CUDAError: _STALL | {Category.NCCLError},
    Category.CUDAOutOfMemory: _STALL
    | {Category.NCCLError, Category.NetworkError, Category.CUDAError},
    Category.HostOOM: _STALL
    | {Category.DataloaderKilled, Category.NCCLError, Category.NetworkError},
    Category.DataloaderKilled: frozenset({Category.HostOOM, Category.CUDAError}),
    Category.StorageError: _STALL | {Category.CheckpointError},
    Category.CheckpointError: _STALL,
    # A rank that dies of its own bug leaves its peers' communicators failing ("remote process
    # exited", "communicator was aborted") as well as waiting. (Not their sockets: in the
    # corpus, a reset beside a script's error was more often the network's own fault.)
    Category.ScriptError: _STALL | {Category.NCCLError},
    Category.NCCLError: _STALL,
    Category.NaNLoss: _STALL | {Category.ScriptError},
    Category.LossSpike: _STALL | {Category.ScriptError},
    Category.Hang: frozenset({Category.NCCLTimeout}),
}
# A cause this weak (a bare segfault, a stack dump) explains nothing away.
MIN_EXPLAINING_SCORE = 0.55


@dataclass(frozen=True)
class Candidate:
    category: Category
    score: float
    best: Hit
    hits: tuple[Hit, ...]

    @property
    def is_symptom(self) -> bool:
        return self.best.signature.role is Role.symptom


def candidates(hits: Sequence[Hit]) -> list[Candidate]:
    by_category: dict[Category, list[Hit]] = {}
    for hit in hits:
        if hit.signature.role is Role.context:
            continue
        by_category.setdefault(hit.signature.category, []).append(hit)
    candidates = []
    for category, category_hits in by_category.items():
        ordered = tuple(sorted(category_hits, key=lambda h: h.order))
        best = max(ordered, key=lambda h: (score(h), -ordered.index(h)))
        candidates.append(Candidate(category, score(best), best, ordered))
    return candidates


def score(hit: Hit) -> float:
    factor = SYMPTOM_FACTOR if hit.signature.role is Role.symptom else 1.0
    return hit.signature.weight * factor


def corroborated(hits: Sequence[Hit]) -> tuple[list[Hit], list[Hit]]:
    """(hits that count, corroborating hits whose category no other cause proves). The
    latter keep their place as context: an exit status line still says which node was hit."""
    proven = {
        h.signature.category
        for h in hits
        if h.signature.role is Role.cause and not h.signature.corroborates
    }
    counted: list[Hit] = []
    unproven: list[Hit] = []
    for hit in hits:
        if hit.signature.corroborates and hit.signature.category not in proven:
            unproven.append(hit)
            context = replace(hit.signature, role=Role.context, category=Category.Unknown)
            counted.append(replace(hit, signature=context))
        else:
            counted.append(hit)
    return counted, unproven


def aftermath(hits: Sequence[Hit]) -> tuple[list[Hit], list[Hit]]:
    """(hits that count, hits set aside as the aftermath of another signature's line present in
    the job). The latter keep their place as context (rank, host) but vote for nothing."""
    present = {h.signature.id for h in hits}
    counted: list[Hit] = []
    after: list[Hit] = []
    for hit in hits:
        if hit.signature.role is not Role.context and present & set(hit.signature.aftermath_of):
            after.append(hit)
            context = replace(hit.signature, role=Role.context, category=Category.Unknown)
            counted.append(replace(hit, signature=context))
        else:
            counted.append(hit)
    return counted, after


def explained(candidates: Sequence[Candidate]) -> dict[Category, Candidate]:
    """Each category that another cause present in the job drags along, with that cause (the
    strongest one). Printed order plays no part: a GPU fault outranks the socket error a rank
    logged a second before it."""
    found: dict[Category, Candidate] = {}
    for fallout in candidates:
        for cause in candidates:
            if (
                cause is fallout
                or cause.is_symptom
                or cause.score < MIN_EXPLAINING_SCORE
                or fallout.category not in CONSEQUENCES.get(cause.category, frozenset())
                or cause.category in CONSEQUENCES.get(fallout.category, frozenset())
                or _only_wraps(cause, fallout)
            ):
                continue
            known = found.get(fallout.category)
            if known is None or cause.score > known.score:
                found[fallout.category] = cause
    # Fallout of fallout is the root's: NCCL timeouts behind an NCCL error that only wraps a
    # CUDA failure are the CUDA failure's.
    for category, direct in list(found.items()):
        root, seen = direct, {category}
        while root.category in found and root.category not in seen:
            seen.add(root.category)
            root = found[root.category]
        found[category] = root
    return found


def _only_wraps(cause: Candidate, fallout: Candidate) -> bool:
    """Whether the cause is a script's exception whose every line the fallout reads more
    decisively: the exception's class name ("ImportError: ...") around a library's own words
    ("undefined symbol: ncclMemFree"). One line is one event, not a cause and its consequence.
    (The other way round, an NCCL error code whose line quotes a CUDA or socket failure, the
    quoted failure is the cause: only an exception's class name is a mere wrapper.)"""
    if cause.category is not Category.ScriptError:
        return False
    weighs = {(h.file, h.line): score(h) for h in fallout.hits}
    return all(weighs.get((h.file, h.line), -1.0) > score(h) for h in cause.hits)


def pick(candidates: Sequence[Candidate]) -> Candidate:
    top = max(c.score for c in candidates)
    contenders = [c for c in candidates if c.score >= top - TIE_MARGIN]
    first = min(contenders, key=_printed_first)
    if first.category in _GPU_HARDWARE:
        return first
    # A line the first reads too is one event read two ways: its more decisive reading stands
    # (a CPU's cache ECC machine check is the node's, not the GPU memory's).
    read_by_first = {h.order for h in first.hits}
    hardware = [
        c
        for c in contenders
        if c.category in _GPU_HARDWARE and not read_by_first & {h.order for h in c.hits}
    ]
    return min(hardware, key=_printed_first) if hardware else first


def _printed_first(candidate: Candidate) -> tuple[tuple[float, int, int], float]:
    """Earliest line first; on the same line, the more decisive reading."""
    return candidate.hits[0].order, -candidate.score


def _where(hit: Hit) -> str:
    return f"{Path(hit.file).name}:{hit.line}" if hit.line else Path(hit.file).name


def rivals(
    winner: Candidate | None,
    candidates: Sequence[Candidate],
    explained: dict[Category, Candidate],
    unproven: Sequence[Hit],
) -> tuple[Rival, ...]:
    """Why the winner beat each other explanation the logs offered (``winner`` None: no
    explanation won, only the uncounted lines are told)."""
    told: list[Rival] = []
    if winner is None:
        return _unproven_rivals(unproven)[:MAX_RIVALS]
    for rival in sorted(candidates, key=lambda c: -c.score):
        if rival is winner:
            continue
        cause = explained.get(rival.category)
        if cause is not None:
            reason = (
                f"fallout of {cause.category} ({_where(cause.best)}): a {cause.category} "
                f"drags {rival.category} along on the same or other ranks, whichever is "
                "printed first"
            )
        elif rival.is_symptom and not winner.is_symptom:
            reason = (
                "a symptom (what the other ranks see when something broke elsewhere): "
                "it loses to any cause"
            )
        elif rival.score < winner.score - TIE_MARGIN:
            reason = (
                f"less decisive: its strongest line weighs {rival.score:.2f}, the winner's "
                f"{winner.score:.2f}"
            )
        else:
            reason = (
                f"as decisive ({rival.score:.2f} vs {winner.score:.2f}); the winner's "
                f"evidence came first ({_where(winner.hits[0])})"
            )
        told.append(
            Rival(
                category=rival.category,
                score=round(rival.score, 3),
                signature=rival.best.signature.id,
                where=_where(rival.best),
                reason=reason,
            )
        )
    return (*told, *_unproven_rivals(unproven))[:MAX_RIVALS]


def _unproven_rivals(unproven: Sequence[Hit]) -> tuple[Rival, ...]:
    told: list[Rival] = []
    seen: set[str] = set()
    for hit in unproven:
        if hit.signature.id in seen:
            continue
        seen.add(hit.signature.id)
        if hit.signature.aftermath_of:
            reason = (
                f"not counted: the aftermath of {' / '.join(hit.signature.aftermath_of)}"
                ", also in the logs"
            )
        else:
            reason = (
                f"not counted: {hit.signature.id} only corroborates a "
                f"{hit.signature.category} that another line proves, and none does (an "
                "exit code 137 alone is also scancel, preemption, KillWait)"
            )
        told.append(
            Rival(
                category=hit.signature.category,
                score=round(score(hit), 3),
                signature=hit.signature.id,
                where=_where(hit),
                reason=reason,
            )
        )
    return tuple(told)


def confidence(
    winner: Candidate,
    candidates: Sequence[Candidate],
    fallout: dict[Category, Candidate],
    heartbeat_age_s: float | None,
    hang_after_s: float,
) -> float:
    if winner.category is Category.Hang and heartbeat_age_s is not None:
        overdue = heartbeat_age_s / max(hang_after_s, 1.0) - 1.0
        return min(0.8, 0.4 + 0.4 * min(1.0, overdue))
    # A rival only counts on lines of its own: "CUDA error: uncorrectable ECC error" is one
    # fact matched by two signatures, not two competing explanations. Fallout is no rival.
    explained = {(h.source_index, h.line) for h in winner.hits}
    rival = max(
        (
            score(h)
            for c in candidates
            if c is not winner
            and not c.is_symptom
            and c.category not in fallout
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


def locations(hits: Sequence[Hit]) -> list[str]:
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
