"""Validators for anything that may reach a shell, Ansible or the scheduler.

Node names and job ids come from events, logs and people. They are checked against strict
patterns here, once, so that nothing downstream ever has to quote them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from trainmedic.core.errors import InputError

HOSTNAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
JOB_ID_RE = re.compile(r"^[0-9]{1,12}(?:_[0-9]{1,6})?$")
_RANGE_RE = re.compile(r"^(?P<prefix>[a-z0-9-]*)\[(?P<body>[0-9,\-]+)\](?P<suffix>[a-z0-9-]*)$")
MAX_EXPANSION = 100_000
# A number read from a log (a rank, an Xid code, a task id) has at most this many digits: a
# longer run of digits is no such number, and int() refuses a string past 4300 digits.
LOG_NUMBER_DIGITS = 9


def log_number(digits: str) -> int | None:
    """The value of a short run of digits read from a log; None for a longer one."""
    return int(digits) if len(digits) <= LOG_NUMBER_DIGITS else None


def hostname(value: str, field: str = "node") -> str:
    if not isinstance(value, str) or not HOSTNAME_RE.match(value):
        raise InputError(field, value, "not a valid hostname (lowercase letters, digits, '-')")
    return value


HOLD_NAME_RE = re.compile(r"^trainmedic-[a-z0-9-]{1,80}$")


def hold_name(value: str, field: str = "hold") -> str:
    """A node hold's name (a Slurm reservation name): always trainmedic's own prefix."""
    if not isinstance(value, str) or not HOLD_NAME_RE.match(value):
        raise InputError(field, value, "not a hold name (trainmedic-[a-z0-9-]{1,80})")
    return value


def job_id(value: str | int, field: str = "job_id") -> str:
    text = str(value)
    if not JOB_ID_RE.match(text):
        raise InputError(field, value, "not a scheduler job id (digits, optionally _array)")
    return text


def expand_nodelist(expr: str, field: str = "nodes") -> list[str]:
    """Expand a Slurm-style host list such as ``node[001-004,010],gpu7`` into hostnames."""
    names: list[str] = []
    for part in _split_top_level(expr.strip()):
        match = _RANGE_RE.match(part)
        if match is None:
            names.append(hostname(part, field))
            continue
        prefix, suffix = match["prefix"], match["suffix"]
        for chunk in match["body"].split(","):
            lo, _, hi = chunk.partition("-")
            if not lo or (chunk.count("-") > 1):
                raise InputError(field, expr, f"bad range {chunk!r}")
            width = len(lo)
            start, stop = int(lo), int(hi or lo)
            if stop < start:
                raise InputError(field, expr, f"range {chunk!r} runs backwards")
            if len(names) + stop - start + 1 > MAX_EXPANSION:
                raise InputError(field, expr, f"expands to more than {MAX_EXPANSION} nodes")
            names.extend(
                hostname(f"{prefix}{i:0{width}d}{suffix}", field) for i in range(start, stop + 1)
            )
    if not names:
        raise InputError(field, expr, "names no node")
    return list(dict.fromkeys(names))


def compress_nodelist(names: Iterable[str]) -> str:
    """Inverse of :func:`expand_nodelist` for names sharing a prefix and number width."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in names:
        match = re.match(r"^(.*?)([0-9]+)$", name)
        if match is None:
            plain.append(name)
            continue
        groups.setdefault((match[1], len(match[2])), []).append(int(match[2]))
    parts = list(plain)
    for (prefix, width), found in sorted(groups.items()):
        numbers = sorted(set(found))
        ranges: list[str] = []
        start = prev = numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            ranges.append(
                f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}"
            )
            if n is not None:
                start = prev = n
        parts.append(
            f"{prefix}{ranges[0]}" if len(numbers) == 1 else f"{prefix}[{','.join(ranges)}]"
        )
    return ",".join(parts)


def _split_top_level(expr: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in (s.strip() for s in parts) if p]


# Free text that may be passed to Ansible or the scheduler (reasons, labels): no quotes,
# braces, dollar signs, backticks, newlines or shell metacharacters.
SAFE_TEXT_RE = re.compile(r"^[A-Za-z0-9 _.,:=/@()#+%-]{0,512}$")


def safe_text(value: str, field: str) -> str:
    if not isinstance(value, str) or not SAFE_TEXT_RE.match(value):
        raise InputError(field, value, "only letters, digits, spaces and _ . , : = / @ ( ) # + % -")
    return value
