"""A signature's regex as a POSIX ERE (GNU extensions), for the grep speed baseline
(``bench/classify_speed.py``): the catalogue's regex subset translated, lookarounds dropped, so
that ``LC_ALL=C grep -c -E`` runs the same signatures the engine does."""

from __future__ import annotations

import re

__all__ = ["python_regex_to_ere"]

_ERE_CLASS = {"d": "[0-9]", "D": "[^0-9]"}


def _case_fold_letters(text: str) -> str:
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isascii() and c.isalpha() else c for c in text)


def python_regex_to_ere(pattern: str) -> str:  # noqa: PLR0915 - one small tokenizer
    """Translate the regex subset used by the catalogue into a GNU grep ERE.

    Lookarounds are dropped (the ERE then matches a superset, which only makes grep work
    harder); ``(?i)`` becomes per-letter bracket pairs; named and non-capturing groups
    become plain groups; ``\\d`` becomes ``[0-9]``.
    """
    ignore_case = False
    inline_flags = re.match(r"^\(\?([a-z]+)\)", pattern)
    if inline_flags:
        ignore_case = "i" in inline_flags.group(1)
        pattern = pattern[inline_flags.end() :]
    out: list[str] = []
    i = 0
    fold_depth: list[bool] = []  # per open group: whether it is a scoped (?i:...) group
    while i < len(pattern):
        c = pattern[i]
        fold = ignore_case or any(fold_depth)
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt in _ERE_CLASS:
                out.append(_ERE_CLASS[nxt])
            elif nxt.isalpha() and fold and nxt not in "swbSWB":
                out.append(_case_fold_letters(nxt))
            else:
                out.append(c + nxt)
            i += 2
            continue
        if c == "[":
            end = _class_end(pattern, i)
            out.append(_convert_class(pattern[i + 1 : end], fold))
            i = end + 1
            continue
        if c == "(" and pattern.startswith("(?", i):
            lookaround = re.match(r"\(\?(?:<?[=!])", pattern[i:])
            if lookaround:
                i = _skip_group(pattern, i)
                continue
            named = re.match(r"\(\?P<\w+>", pattern[i:])
            scoped = re.match(r"\(\?([a-z]+):", pattern[i:])
            if named:
                i += named.end()
                fold_depth.append(False)
            elif scoped:
                i += scoped.end()
                fold_depth.append("i" in scoped.group(1))
            else:  # (?:
                i += 3
                fold_depth.append(False)
            out.append("(")
            continue
        if c == "(":
            fold_depth.append(False)
        elif c == ")" and fold_depth:
            fold_depth.pop()
        if c in "*+?}" and pattern[i + 1 : i + 2] == "?":
            out.append(c)  # lazy quantifier: ERE has only greedy ones
            i += 2
            continue
        if fold and c.isascii() and c.isalpha():
            out.append(_case_fold_letters(c))
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _class_end(pattern: str, start: int) -> int:
    i = start + 1
    if pattern[i : i + 1] == "^":
        i += 1
    if pattern[i : i + 1] == "]":
        i += 1
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
            continue
        if pattern[i] == "]":
            return i
        i += 1
    raise ValueError(f"unterminated character class in {pattern!r}")


_CLASS_ESCAPES = {"d": "0-9", "w": "[:alnum:]_", "s": "[:space:]"}


def _convert_class(body: str, fold: bool) -> str:
    negate = body.startswith("^")
    if negate:
        body = body[1:]
    items: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in _CLASS_ESCAPES:
                items.append(_CLASS_ESCAPES[nxt])
            elif nxt.isalpha():
                raise ValueError(f"no ERE equivalent of \\{nxt} inside a bracket: give `ere`")
            else:
                items.append(nxt)
            i += 2
            continue
        if i + 2 < len(body) and body[i + 1] == "-" and body[i + 2] != "\\":
            low, high = c, body[i + 2]
            items.append(f"{low}-{high}")
            if fold and low.isalpha() and high.isalpha():
                items.append(f"{low.swapcase()}-{high.swapcase()}")
            i += 3
            continue
        items.append(c)
        if fold and c.isalpha():
            items.append(c.swapcase())
        i += 1
    # POSIX brackets have no escapes: "]" must come first and "-" last to be literal.
    literal_close = "]" if "]" in items else ""
    literal_dash = "-" if "-" in items else ""
    rest = "".join(x for x in items if x not in ("]", "-"))
    return "[" + ("^" if negate else "") + literal_close + rest + literal_dash + "]"


def _skip_group(pattern: str, start: int) -> int:
    depth = 0
    i = start
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i
