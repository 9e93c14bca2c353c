"""Which signatures a flagged line is run against, and which verdicts repeat across lines.

A noisy log flags thousands of lines (NCCL warnings) that differ only in their numbers; running
every signature on each is what made it slow. Each signature's regex is split into its
top-level alternatives and each is read once (:mod:`trainmedic.diagnosis.regex_facts`):

* a flagged line runs only the alternatives whose required factors its template holds (one
  Aho-Corasick pass finds every factor of every alternative at once, not one search each);
* an alternative that is *digit-blind* matches a line exactly when it matches the line with
  its digits masked to ``0``, so its verdict is cached per digit-masked line (bounded); the
  others (Xid codes, exit code 137, ``[Errno 28]``) are run on the real line each time,
  unless their digit-relaxed twin already misses the masked line (then no real line of that
  form can match: cached too).

A line is matched as it is and, where it has one, as the message inside its envelope
(:mod:`trainmedic.diagnosis.envelope`: a timestamp, a launcher's tag, a JSON field): a
signature anchored at a message's start sees past the prefix. Colour codes are gone first.

Only *which* signatures match is cached: a hit (host, rank, GPU, excerpt) always comes from
running the matched signature on the real line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import ahocorasick

from trainmedic.diagnosis.catalogue import MASK, Signature, byte_automaton
from trainmedic.diagnosis.envelope import anchored, messages, uncoloured
from trainmedic.diagnosis.regex_facts import (
    NON_ASCII_FOLDS,
    analyse,
    digit_relaxed,
    split_alternatives,
)

__all__ = [
    "DIGITS",
    "Dispatch",
    "Verdict",
    "dispatch_template",
    "line_text",
    "search_messages",
    "searches",
]

# ASCII digits to "0", nothing else: the key of the verdict cache.
DIGITS = bytes(ord("0") if 0x30 <= b <= 0x39 else b for b in range(256))
MAX_VERDICTS = 4096  # cached digit-masked lines per scan (oldest dropped first)
MAX_KEY_BYTES = 2048  # longer lines are judged every time, never cached
# A required set with a factor shorter than this, or without a letter (":", "in", "] ",
# "000") is met by nearly every line: it filters nothing, yet each of its occurrences is one
# more Aho-Corasick match to walk on every judged line. Such sets are not looked for; their
# alternative still runs on the real line, so nothing is missed.
MIN_FACTOR_BYTES = 3

# In catalogue order, (signature, None) where it matches every line of this digit-masked
# form, (signature, alternatives) where it may: those are run on the real line.
Verdict = tuple[tuple[Signature, tuple[re.Pattern[str], ...] | None], ...]


def line_text(raw: bytes) -> str:
    """A raw log line as the signatures see it."""
    text = uncoloured(raw.decode("utf-8", "replace").rstrip("\r\n"))
    # Progress bars redraw with \r: the last frame is what was printed.
    return text.replace("\r", " ") if "\r" in text else text


def searches(
    regex: re.Pattern[str], text: str, inner: tuple[str, ...] | None = None
) -> tuple[re.Match[str], str] | None:
    """The regex's match in the whole line, else in the first of its messages inside its
    envelope it matches in: (match, the text matched). ``inner``: the line's messages, where
    the caller has them (worked out here only once the whole line missed)."""
    found = regex.search(text)
    if found is not None:
        return found, text
    return search_messages(regex, text, messages(text) if inner is None else inner)


def search_messages(
    regex: re.Pattern[str],
    text: str,
    inner: tuple[str, ...],
    *,
    like: re.Pattern[str] | None = None,
) -> tuple[re.Match[str], str] | None:
    """``searches`` once the whole line ``text`` missed: the regex's match in the first of its
    messages ``inner`` it matches in.

    A message is searched only by a regex tied to where a line starts (``^``): any other
    that missed the line misses its end too, unless the envelope changed the inside (JSON's
    escapes). And one that looks behind a match ("Cuda failure" not after "NCCL WARN")
    must see what the line really has there. ``like``: the regex whose anchoring counts (a
    digit-relaxed twin's is its original's)."""
    if inner and (anchored((like or regex).pattern) or not text.endswith(inner[0])):
        for message in inner:
            found = regex.search(message)
            if found is not None:
                return found, message
    return None


def dispatch_template(key: bytes) -> bytes:
    """What required factors are looked for in: the line as its text reads (a "\\r" inside it
    is a space), lowercased with its digits as 0, the four non-ASCII case partners of i, s, k
    folded."""
    if key.isascii() and b"\x1b" not in key and b"#" not in key:
        return key.translate(MASK).replace(b"\r", b" ")
    text = line_text(key).translate(NON_ASCII_FOLDS)
    return text.encode("utf-8", "surrogateescape").translate(MASK)


@dataclass(frozen=True)
class _Alternative:
    signature: int  # index in the catalogue
    regex: re.Pattern[str]
    blind: bool
    # Not blind: a blind regex that matches wherever ``regex`` does (None: none known).
    relaxed: re.Pattern[str] | None
    required: tuple[frozenset[bytes], ...]  # every set must be met; the first is indexed
    anchored: bool  # tied to a line's start: tried on the messages inside its envelope too


@dataclass(frozen=True)
class _Tables:
    alternatives: tuple[_Alternative, ...]
    always: tuple[int, ...]  # alternatives without a required factor
    by_factor: dict[bytes, tuple[int, ...]]  # factor -> alternatives it is the first set of
    # Every factor of every required set found in one pass over the template (Aho-Corasick,
    # overlapping ones included); its keys are the factors' bytes as latin-1 text
    finder: ahocorasick.Automaton | None


@cache
def _tables(signatures: tuple[Signature, ...]) -> _Tables:
    alternatives: list[_Alternative] = []
    for index, signature in enumerate(signatures):
        pattern, flags = signature.regex.pattern, signature.regex.flags
        parts = split_alternatives(pattern)
        try:
            compiled = [re.compile(part, flags) for part in parts] if len(parts) > 1 else []
        except re.error:  # e.g. a backreference to another alternative's group
            compiled = []
        for regex in compiled or [signature.regex]:
            facts = analyse(regex.pattern, regex.flags)
            required = tuple(r for r in facts.required if all(map(_selective, r)))
            relaxed = None if facts.digit_blind else digit_relaxed(regex.pattern, regex.flags)
            alternatives.append(
                _Alternative(
                    index, regex, facts.digit_blind, relaxed, required, anchored(regex.pattern)
                )
            )
    by_factor: dict[bytes, list[int]] = {}
    for number, alternative in enumerate(alternatives):
        for factor in alternative.required[0] if alternative.required else ():
            by_factor.setdefault(factor, []).append(number)
    return _Tables(
        alternatives=tuple(alternatives),
        always=tuple(n for n, a in enumerate(alternatives) if not a.required),
        by_factor={f: tuple(n) for f, n in by_factor.items()},
        finder=byte_automaton(f for a in alternatives for r in a.required for f in r),
    )


def _selective(factor: bytes) -> bool:
    return len(factor) >= MIN_FACTOR_BYTES and any(0x61 <= b <= 0x7A or b >= 0x80 for b in factor)


class Dispatch:
    """Per scan: the verdict of each digit-masked flagged line, cached (bounded)."""

    def __init__(self, signatures: Sequence[Signature]) -> None:
        self.signatures = tuple(signatures)
        self.tables = _tables(self.signatures)
        self.verdicts: dict[bytes, Verdict] = {}

    def verdict(self, raw: bytes) -> Verdict:
        key = raw.translate(DIGITS)
        found = self.verdicts.get(key)
        if found is not None:
            return found
        found = self._judge(key)
        if len(key) <= MAX_KEY_BYTES:
            if len(self.verdicts) >= MAX_VERDICTS:
                del self.verdicts[next(iter(self.verdicts))]
            self.verdicts[key] = found
        return found

    def present(self, template: bytes) -> set[bytes]:
        """Every factor (of any alternative's required sets) the template holds."""
        finder = self.tables.finder
        if finder is None:
            return set()
        return {factor for _, factor in finder.iter(template.decode("latin-1"))}

    def candidates(self, key: bytes, inner: tuple[str, ...] = ()) -> list[int]:
        """The alternatives (in catalogue order) whose required factors the line holds, or
        one of its messages ``inner`` does (``envelope.messages``)."""
        tables = self.tables
        template = dispatch_template(key)
        chosen = set(tables.always)
        found = self.present(template)
        # The outermost message holds every factor the others do; where it is the line's end
        # (only a prefix went), every factor it holds the line holds too.
        if inner and not key.endswith(outer := inner[0].encode("utf-8", "surrogateescape")):
            found |= self.present(dispatch_template(outer))
        for factor in found:
            for number in tables.by_factor.get(factor, ()):
                if number not in chosen and all(
                    not required.isdisjoint(found)
                    for required in tables.alternatives[number].required[1:]
                ):
                    chosen.add(number)
        return sorted(chosen)

    def _judge(self, key: bytes) -> Verdict:
        text = line_text(key)
        # Its messages: at once where JSON may hold factors the line's text does not show,
        # else only once a regex tied to a message's start missed the whole line.
        inner = messages(text) if "{" in text else None
        sure: set[int] = set()
        unsure: dict[int, list[re.Pattern[str]]] = {}
        for number in self.candidates(key, inner or ()):
            alternative = self.tables.alternatives[number]
            if alternative.signature in sure:
                continue
            regex = alternative.regex if alternative.blind else alternative.relaxed
            if regex is None:  # no twin: the real line decides
                unsure.setdefault(alternative.signature, []).append(alternative.regex)
                continue
            found = regex.search(text) is not None
            if not found and (inner or alternative.anchored):
                inner = messages(text) if inner is None else inner
                found = search_messages(regex, text, inner, like=alternative.regex) is not None
            if not found:
                continue
            if not alternative.blind:
                unsure.setdefault(alternative.signature, []).append(alternative.regex)
            else:
                sure.add(alternative.signature)
                unsure.pop(alternative.signature, None)
        return tuple(
            (self.signatures[i], None if i in sure else tuple(unsure[i]))
            for i in sorted(sure | unsure.keys())
        )
