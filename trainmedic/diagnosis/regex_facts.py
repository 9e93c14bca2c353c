"""What a regex requires of a line, read from its parse tree (sound, never guessed).

Two facts about each signature's regex, used by :mod:`trainmedic.diagnosis.dispatch`:

* **required factors**: sets of literal strings, written as a template holds them
  (lowercased, digits as ``0``); every match contains one string of each set. A line whose
  template misses one of the sets cannot match.
* **digit-blind**: every element treats the ten ASCII digits alike and there is no
  backreference, so the regex matches a line exactly when it matches the line with its digits
  masked to ``0``.
* **digit-relaxed twin** of a regex that is not blind: the same tree with every element that
  tells digits apart widened to all digits (a negative lookaround that does is dropped). It is
  blind and matches every line the regex matches, so where the twin misses the masked line
  the regex misses the real one.

Anything not understood gives no factor and "not blind": the safe answers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from re import _compiler as sre_compile  # type: ignore[attr-defined]
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]

from trainmedic.diagnosis.catalogue import MASK

__all__ = [
    "Analysis",
    "analyse",
    "digit_blind",
    "digit_relaxed",
    "required_factors",
    "split_alternatives",
]

# Under re.IGNORECASE, i, s and k also match four non-ASCII letters (the re documentation):
# the dispatch template of a non-ASCII line folds them, as MASK folds ASCII case.
NON_ASCII_FOLDS = {0x130: "i", 0x131: "i", 0x17F: "s", 0x212A: "k"}

_DIGIT_CHARS = "0123456789"
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)
_CATEGORY_HAS_DIGITS = {
    sre.CATEGORY_DIGIT: True,
    sre.CATEGORY_NOT_DIGIT: False,
    sre.CATEGORY_SPACE: False,
    sre.CATEGORY_NOT_SPACE: True,
    sre.CATEGORY_WORD: True,
    sre.CATEGORY_NOT_WORD: False,
}

Factors = frozenset[bytes] | None


@dataclass(frozen=True)
class Analysis:
    factors: Factors  # the most selective required set
    digit_blind: bool
    required: tuple[frozenset[bytes], ...] = ()  # all of them, most selective first


@cache
def analyse(pattern: str, flags: int = 0) -> Analysis:
    """The required factors and digit-blindness of one regex (anything not understood: no
    factor, not blind, i.e. the signature runs on every flagged line, on the real line)."""
    try:
        tree = sre_parse.parse(pattern, flags)
    except (re.error, TypeError, ValueError, OverflowError, RecursionError):
        return Analysis(None, False)
    items = list(tree)
    required = _requirements(items, tree.state.flags)
    required.sort(key=_selectivity, reverse=True)
    return Analysis(required[0] if required else None, _blind(items), tuple(required))


def required_factors(pattern: str, flags: int = 0) -> Factors:
    return analyse(pattern, flags).factors


def digit_blind(pattern: str, flags: int = 0) -> bool:
    return analyse(pattern, flags).digit_blind


# ----------------------------------------------------------------------------- factors


def _better(current: Factors, candidate: Factors) -> Factors:
    if candidate is None:
        return current
    if current is None:
        return candidate

    return candidate if _selectivity(candidate) > _selectivity(current) else current


def _selectivity(factors: frozenset[bytes]) -> tuple[int, int]:
    return min(len(f) for f in factors), -len(factors)


def _requirements(items: Sequence, flags: int) -> list[frozenset[bytes]]:
    """Every factor set the sequence requires (each literal run, each required part)."""
    required: list[frozenset[bytes]] = []
    run = bytearray()
    for op, arg in items:
        byte = _literal_byte(op, arg, flags)
        if byte is not None:
            run.append(byte)
            continue
        if run:
            required.append(frozenset({bytes(run)}))
            run.clear()
        factors = _node_factors(op, arg, flags)
        if factors is not None:
            required.append(factors)
    if run:
        required.append(frozenset({bytes(run)}))
    return required


def _sequence_factors(items: Sequence, flags: int) -> Factors:
    best: Factors = None
    for factors in _requirements(items, flags):
        best = _better(best, factors)
    return best


def _node_factors(op, arg, flags: int) -> Factors:
    if op is sre.SUBPATTERN:
        _group, add, delete, items = arg
        return _sequence_factors(items, (flags | add) & ~delete)
    if op is sre.BRANCH:
        alternatives = [_sequence_factors(b, flags) for b in arg[1]]
        if any(a is None for a in alternatives):
            return None
        return frozenset().union(*alternatives)  # type: ignore[arg-type]
    if op in _REPEATS and arg[0] >= 1:
        return _sequence_factors(arg[2], flags)
    if op is sre.ATOMIC_GROUP:
        return _sequence_factors(arg, flags)
    return None  # ".", classes, anchors, lookarounds, optional parts: nothing required


def _literal_byte(op, arg, flags: int) -> int | None:
    """The one template byte this element always becomes, or None."""
    if op is sre.LITERAL:
        chars = {chr(arg)}
    elif op is sre.IN and all(o in (sre.LITERAL, sre.RANGE) for o, _ in arg):
        chars = set()
        for o, a in arg:
            low, high = (a, a) if o is sre.LITERAL else a
            if high >= 128 or high - low > 128:
                return None
            chars.update(chr(c) for c in range(low, high + 1))
    else:
        return None
    if any(ord(c) >= 128 for c in chars):
        return None
    if flags & re.IGNORECASE:
        chars |= {c.swapcase() for c in chars}
    masked = {MASK[ord(c)] for c in chars}
    return masked.pop() if len(masked) == 1 else None


# ----------------------------------------------------------------------------- digits


def _class_digits(items: Sequence) -> set[str] | None:
    digits: set[str] = set()
    negate = False
    for op, arg in items:
        if op is sre.NEGATE:
            negate = True
        elif op is sre.LITERAL:
            digits.update(c for c in _DIGIT_CHARS if ord(c) == arg)
        elif op is sre.RANGE:
            digits.update(c for c in _DIGIT_CHARS if arg[0] <= ord(c) <= arg[1])
        elif op is sre.CATEGORY and arg in _CATEGORY_HAS_DIGITS:
            if _CATEGORY_HAS_DIGITS[arg]:
                digits.update(_DIGIT_CHARS)
        else:
            return None
    return set(_DIGIT_CHARS) - digits if negate else digits


def _blind(items: Sequence) -> bool:
    for op, arg in items:
        if op in (sre.LITERAL, sre.NOT_LITERAL):
            if chr(arg) in _DIGIT_CHARS:
                return False
        elif op is sre.IN:
            digits = _class_digits(arg)
            if digits is None or 0 < len(digits) < len(_DIGIT_CHARS):
                return False
        elif op in (sre.ANY, sre.AT):
            continue
        elif op is sre.BRANCH:
            if not all(_blind(b) for b in arg[1]):
                return False
        elif op is sre.SUBPATTERN:
            if not _blind(arg[3]):
                return False
        elif op in _REPEATS:
            if not _blind(arg[2]):
                return False
        elif op in (sre.ASSERT, sre.ASSERT_NOT):
            if not _blind(arg[1]):
                return False
        elif op is sre.ATOMIC_GROUP:
            if not _blind(arg):
                return False
        else:  # backreferences and anything else: digits may matter
            return False
    return True


@cache
def digit_relaxed(pattern: str, flags: int = 0) -> re.Pattern[str] | None:
    """The blind twin of a regex (see the module's docstring); None where it cannot be built
    (backreferences, atomic parts that tell digits apart) or the regex is blind already."""
    try:
        tree = sre_parse.parse(pattern, flags)
        items = list(tree)
        if _blind(items):
            return None
        relaxed = _relax(items)
        if relaxed is None or not _blind(relaxed):
            return None
        return sre_compile.compile(sre_parse.SubPattern(tree.state, relaxed), tree.state.flags)
    except (re.error, TypeError, ValueError, OverflowError, RecursionError, AttributeError):
        return None


_ANY_DIGIT = (sre.IN, [(sre.CATEGORY, sre.CATEGORY_DIGIT)])
_ANY_CHAR = (sre.IN, [(sre.CATEGORY, sre.CATEGORY_DIGIT), (sre.CATEGORY, sre.CATEGORY_NOT_DIGIT)])


def _relax(items: Sequence) -> list | None:
    """``items`` with each element that tells digits apart widened (a superset), or None."""
    relaxed: list = []
    for item in items:
        if _blind([item]):
            relaxed.append(item)
            continue
        op, arg = item
        if op is sre.LITERAL:  # a digit
            relaxed.append(_ANY_DIGIT)
        elif op is sre.NOT_LITERAL:  # anything but one digit
            relaxed.append(_ANY_CHAR)
        elif op is sre.IN:
            if _class_digits(arg) is None:
                return None
            negated = any(o is sre.NEGATE for o, _ in arg)
            relaxed.append(_ANY_CHAR if negated else (sre.IN, [*arg, _ANY_DIGIT[1][0]]))
        elif op is sre.BRANCH:
            branches = [_relax(branch) for branch in arg[1]]
            if any(b is None for b in branches):
                return None
            pairs = zip(arg[1], branches, strict=True)
            relaxed.append((op, (arg[0], [_sub(branch, b) for branch, b in pairs])))
        elif op is sre.SUBPATTERN:
            inner = _relax(arg[3])
            if inner is None:
                return None
            relaxed.append((op, (*arg[:3], _sub(arg[3], inner))))
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            inner = _relax(arg[2])
            if inner is None:
                return None
            relaxed.append((op, (arg[0], arg[1], _sub(arg[2], inner))))
        elif op is sre.ASSERT:
            inner = _relax(arg[1])
            if inner is None:
                return None
            relaxed.append((op, (arg[0], _sub(arg[1], inner))))
        elif op is sre.ASSERT_NOT:
            continue  # widening would make it refuse more: without it, the twin accepts more
        else:  # backreferences, atomic and possessive parts: widening is not a superset
            return None
    return relaxed


def _sub(original, items: list):
    return sre_parse.SubPattern(original.state, items)


# ----------------------------------------------------------------------------- alternatives

_GLOBAL_FLAGS = re.compile(r"^\(\?[aiLmsux]+\)")


def split_alternatives(pattern: str) -> list[str]:
    """The top-level alternatives of ``pattern`` as written (its leading global flags, which
    the compiled pattern's flags carry, left out); one item when it has no top-level "|"."""
    head = _GLOBAL_FLAGS.match(pattern)
    body = pattern[head.end() :] if head else pattern
    parts, depth, start, i = [], 0, 0, 0
    in_class = False
    while i < len(body):
        c = body[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if body[i + 1 : i + 2] == "^":
                i += 1
            if body[i + 1 : i + 2] == "]":
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(body[start:i])
            start = i + 1
        i += 1
    parts.append(body[start:])
    return parts
