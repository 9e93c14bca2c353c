"""A human's correction, learnt: the failure's *fingerprint* — the digit-masked templates of
the lines that tell it, preferring those no signature explains — is kept with the human's
category, and a later failure whose logs hold every template of a correction gets the human's
verdict (source ``human``), and its origin: the host whose log holds the correction's host
template. Same template means the same line with other numbers (steps, ranks, addresses,
times), the way log-template miners such as drain3 group lines.

Pure: the caller hands the logs and the corrections (kept on the Prefect server).
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from trainmedic.core.models import Diagnosis, Evidence
from trainmedic.core.taxonomy import Category, layer_of, remediation_for
from trainmedic.diagnosis.catalogue import Catalogue, mask_template
from trainmedic.diagnosis.sources import LogSource
from trainmedic.state.records import Correction

__all__ = [
    "FingerprintLine",
    "apply_corrections",
    "as_overlay",
    "fingerprint",
    "matching",
    "telling_lines",
]

# A failure shows itself at the end of its logs; a fingerprint reads only that far back.
TAIL_LINES = 400
MAX_TEMPLATES = 5
TELLING = re.compile(
    rb"error|exception|fail|fatal|abort|killed|timed? ?out|panic|traceback|denied|refused|"
    rb"unreachable|\bnan\b|overflow|corrupt|invalid|cannot|unable",
    re.IGNORECASE,
)
# Line prefixes that differ between otherwise identical lines: timestamps, [rankN]:, host:pid.
_PREFIX = re.compile(rb"^(\[[^\]]{0,40}\]\s*|[\w.-]+:\d+:\d+\s*|\[?rank\d+\]?:?\s*)+")


@dataclass(frozen=True)
class FingerprintLine:
    template: str
    host: str | None
    text: str


_HEX = re.compile(rb"0x[0-9a-f]+")
_DIGITS = re.compile(rb"0+")


def _template(line: bytes) -> bytes:
    """The line without its prefix, lowercased, each number (decimal or 0x hex) one "0"."""
    masked = mask_template(_PREFIX.sub(b"", line.strip()))
    return _DIGITS.sub(b"0", _HEX.sub(b"0x0", masked))[:300]


def telling_lines(
    sources: Sequence[LogSource], catalogue: Catalogue
) -> tuple[list[FingerprintLine], list[FingerprintLine]]:
    """The telling lines at the end of every log, distinct by template, newest last: those
    no signature's prefilter lets through (unexplained), and the others."""
    unexplained: dict[bytes, FingerprintLine] = {}
    explained: dict[bytes, FingerprintLine] = {}
    for source in sources:
        tail: deque[bytes] = deque(maxlen=TAIL_LINES)
        rest = b""
        for block in source.open_blocks():
            lines = (rest + block).split(b"\n")
            rest = lines.pop()
            tail.extend(lines)
        if rest:
            tail.append(rest)
        for line in tail:
            if not TELLING.search(line):
                continue
            template = _template(line)
            if not template:
                continue
            found = FingerprintLine(
                template=template.decode("utf-8", "replace"),
                host=source.host,
                text=line.decode("utf-8", "replace").strip()[:300],
            )
            target = explained if catalogue.prefilter.search(template) else unexplained
            target.pop(template, None)
            target[template] = found
    return list(unexplained.values()), list(explained.values())


def fingerprint(sources: Sequence[LogSource], catalogue: Catalogue) -> list[FingerprintLine]:
    """What a correction keeps of a failure: its last telling lines, the unexplained ones
    first (the lines a correction is about), topped up with explained ones."""
    unexplained, explained = telling_lines(sources, catalogue)
    chosen = unexplained[-MAX_TEMPLATES:]
    if len(chosen) < MAX_TEMPLATES:
        chosen = explained[max(0, len(explained) - (MAX_TEMPLATES - len(chosen))) :] + chosen
    return chosen


def matching(
    lines: Sequence[FingerprintLine], corrections: Sequence[Correction]
) -> Correction | None:
    """The newest correction all of whose templates the failure shows."""
    present = {line.template for line in lines}
    for correction in sorted(corrections, key=lambda c: c.at, reverse=True):
        if correction.templates and set(correction.templates) <= present:
            return correction
    return None


def apply_corrections(
    diagnosis: Diagnosis,
    sources: Sequence[LogSource],
    corrections: Sequence[Correction],
    catalogue: Catalogue,
) -> Diagnosis:
    """``diagnosis`` as a human corrected the same failure before, or unchanged."""
    if not corrections:
        return diagnosis
    unexplained, explained = telling_lines(sources, catalogue)
    lines = [*explained, *unexplained]
    correction = matching(lines, corrections)
    if correction is None:
        return diagnosis
    category = Category(correction.category)
    origin = next(
        (x for x in reversed(lines) if x.template == correction.host_template and x.host), None
    )
    told = Evidence(
        file="correction",
        line=0,
        text=f"{correction.by} corrected job {correction.job_id} to {category} "
        f"({correction.reason or 'no reason given'}); this failure shows the same lines",
        signature=f"human-correction-{correction.id}",
        host=origin.host if origin else None,
        category=category,
    )
    shown = [
        Evidence(
            file="fingerprint",
            line=0,
            text=line.text,
            signature=f"human-correction-{correction.id}",
            host=line.host,
            category=category,
        )
        for line in lines
        if line.template in correction.templates
    ]
    return Diagnosis(
        category=category,
        layer=layer_of(category),
        root_cause_host=origin.host if origin else None,
        confidence=0.9,
        evidence=(told, *shown, *diagnosis.evidence)[:12],
        remediation=remediation_for(category),
        source="human",
    )


_WORDS = re.compile(r"[a-z][a-z _./:'-]{3,}[a-z]")


def as_overlay(corrections: Sequence[Correction]) -> str:
    """The corrections as a site overlay file (``TRAINMEDIC_SIGNATURES_OVERLAY``), for a human
    to review and turn into rules: per correction, one signature from its most specific line
    (the longest; numbers as ``\\d+``, any case) with that
    line as its example, and its longest run of words as a prefilter anchor (an unexplained
    line may pass no packaged anchor)."""
    anchors: list[str] = []
    blocks: list[str] = []
    for c in corrections:
        template = max(c.templates, key=len)
        index = c.templates.index(template)
        example = c.examples[index] if index < len(c.examples) else template
        words = max(_WORDS.findall(template), key=len, default="")
        if not words:
            continue
        anchors.append(words.strip())
        pattern = re.escape(template).replace("\\ ", " ")
        pattern = pattern.replace("0x0", "0x[0-9a-f]+").replace("0", r"\d+")
        blocks += [
            "",
            f"# job {c.job_id}, corrected by {c.by}: {c.reason or 'no reason given'}",
            "[[signature]]",
            f"id = {json.dumps('correction-' + c.id)}",
            f"category = {json.dumps(c.category)}",
            'role = "cause"',
            "weight = 0.8",
            f"regex = {json.dumps('(?i)' + pattern)}",
            f"examples = [{json.dumps(example)}]",
        ]
    if not blocks:
        return ""
    head = ["[prefilter]", f"anchors = {json.dumps(sorted(set(anchors)))}"]
    return "\n".join([*head, *blocks]) + "\n"
