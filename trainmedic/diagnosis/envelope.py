"""A log line's message without the envelope its path to the reader wrapped it in.

Between a training script's ``print`` and the file an on-call engineer reads, a line picks up
prefixes and escapes: a timestamp (the logging module's, journald's, a log shipper's), a log
level, ``srun --label``'s task number, ``mpirun --tag-output``'s ``[1,3]<stderr>:``,
torchrun's ``[rank3]:``, pdsh's ``node7:``, a Ray worker's ``(TaskRunner pid=84)``, torchx's
``trainer/0 [0]:``, glog's ``E0813 06:19:49.809 161210 api.py:869]``,
a container runtime's JSON (``{"log": "...", "stream": "stderr"}``), a bug report's quote mark
or indentation. Signatures anchored at the start of a message ("Traceback", "Thread 0x...
(most recent call first)", "Killed") do not see it behind them. (A console's colour codes
are dropped from every line before anything reads it: ``uncoloured``.)

``messages`` strips them, in any order and number, so a signature can be tried on the message
as well as on the whole line (the line first: some signatures read the prefix, pdsh's host or
srun's node). The prefix itself is never dropped from what the line tells: who wrote it and
when are read from the whole line (``attribution``).

Every rule here is digit-blind (a digit is matched by ``\\d`` only, never by itself), so the
message of a line with its digits masked to ``0`` is the masked message: verdicts cached per
masked line (``dispatch``) stay true of the real one. For the same reason a JSON envelope whose
text holds ``\\u`` escapes (digits inside an escape) is left whole.
Pure: no I/O.
"""

from __future__ import annotations

import re
from functools import cache
from typing import NamedTuple

__all__ = ["RAY_WORKER", "anchored", "message_templates", "messages", "named_part", "uncoloured"]

# A terminal's control sequences (colours, mostly), as written or as rsyslog escapes them
# ("#033[31m"; any digits there: every rule here is digit-blind): never part of what a line
# says, so stripped from every line before anything reads it (``uncoloured``).
_CONTROL_SEQUENCE = re.compile(r"(?:\x1b|#\d{3})\[[\d;?]*[A-Za-z]")
_CONTROL_TEMPLATE = re.compile(_CONTROL_SEQUENCE.pattern, re.ASCII | re.IGNORECASE)
_TIME = r"\d\d:\d\d:\d\d(?:[.,]\d+)?"
_PARTS = (
    r"\s*>(?:[ \t]|$)",  # a report's quote mark
    # ISO dates, with or without brackets, zone, a separator after: "2025-03-04T05:06:07Z ",
    # "[2025-03-04 05:06:07,123] ", "2025/03/04 05:06:07 " (Go's log), "(2025-...) ".
    r"[\[(]?\d{4}[-/]\d\d[-/]\d\d[T ]" + _TIME + r"(?:Z|[+-]\d\d:?\d\d| ?[A-Z]{3})?[\])]?"
    r"(?: ?[|:-])?[ \t]",
    r"[\[(]?" + _TIME + r"[\])]?(?: ?[|:-])?[ \t]",  # a time of day alone
    r"[IWEF]\d{4} " + _TIME + r"\s+\d+ [\w./-]+:\d+\][ \t]?",  # glog / absl
    r"\[\d+,\d+\]<std(?:out|err)>:\s?",  # mpirun --tag-output
    r"\[(?:rank|default)?\d+\]:\s?",  # torchrun's --tee / log prefix
    r"\d+: ",  # srun --label
    # a log level, bracketed or not, then a separator: "INFO ", "[ERROR] ", "WARNING: "
    r"[\[<]?(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|ERR|CRITICAL|CRIT|FATAL)[\]>]?"
    r"(?: ?[|:-])?[ \t]",
)
# pdsh / DeepSpeed's runner: a machine's name (a digit in it) or address, then ": "
_HOST = r"(?:[A-Za-z][\w-]*\d[\w.-]*|\d{1,3}(?:\.\d{1,3}){3}): "
# Ray's worker prefix: "(TaskRunner pid=844447) ", "(RayWorker pid=9, ip=10.0.0.3) ",
# "(pid=4711) " on the head node. What follows it is the worker's own output; the address, where
# it is printed, is the group "ray" (the attribution names the worker's node by it).
RAY_WORKER = r"\((?:[\w.-]+ )?pid=\d*(?:, ip=(?P<ray>\d{1,3}(?:\.\d{1,3}){3}))?\)"
# Ray's worker prefix and torchx's / NeMo-Run's role, replica and local rank ("dlrm_main/0
# [0]:", "i.finetune/0 [default0]:"): the worker that wrote the line, as pdsh's host.
_WORKER = RAY_WORKER + r"[ \t]|[\w.-]+/\d+ \[(?:default)?\d+\]:[ \t]?"


def _prefixes(parts: tuple[str, ...]) -> str:
    # Any of them, in any number, after a report's indentation of the whole block; the
    # indentation alone too. The message's own indentation after them is kept (a Python
    # traceback's source lines are indented).
    return r"^(?:[ \t]*(?:" + "|".join(f"(?:{part})" for part in parts) + r")+|[ \t]+(?=\S))"


# The kernel's and syslog's prefixes are not among them: a kernel line is the kernel's own
# words, never a program's output a signature anchored at its start is written for (and a
# device's name after the kernel's time, "ata3: ", is no writer's).
_PREFIX = re.compile(_prefixes((*_PARTS, _HOST, _WORKER)))
# The prefixes that name no one: what is left starts with the writer's name, if any.
_ANONYMOUS = re.compile(_prefixes(_PARTS))
# A container runtime's or a shipper's JSON line: the text is its "log" / "message" field.
_JSON = re.compile(r'^\s*\{.*?"(?:log|message|msg|MESSAGE)"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "", "f": "", '"': '"', "\\": "\\", "/": "/"}
_ESCAPE = re.compile(r"\\([ntrbf\"\\/])")


class _Rules(NamedTuple):
    json: re.Pattern[str]
    anonymous: re.Pattern[str]
    prefix: re.Pattern[str]
    controls: bool  # a template still holds the colour codes ``line_text`` removes from a line


_LINE = _Rules(_JSON, _ANONYMOUS, _PREFIX, controls=False)
# A masked template, decoded as latin-1 (every byte a character of its own): its bytes read as
# bytes patterns would (ASCII classes); a level is upper case in a line, lower case in it.
_TEMPLATE = _Rules(
    re.compile(_JSON.pattern, re.ASCII),
    re.compile(_ANONYMOUS.pattern, re.ASCII | re.IGNORECASE),
    re.compile(_PREFIX.pattern, re.ASCII | re.IGNORECASE),
    controls=True,
)


def uncoloured(text: str) -> str:
    """The text without a terminal's control sequences (``dispatch.line_text`` for every line
    the signatures read, ``scan`` for the tail lines)."""
    return _CONTROL_SEQUENCE.sub("", text) if "\x1b" in text or "#" in text else text


def messages(text: str) -> tuple[str, ...]:
    """The messages a line carries inside its envelope, outermost first: out of its JSON,
    past the prefixes that name no one (a writer's name kept: some signatures read it), then
    past that name too. Empty where the line has no envelope."""
    return tuple(_peel(text, _LINE)[0])


def named_part(text: str) -> str | None:
    """The line from where a prefix naming its writer may start (past the timestamps, levels,
    tags and JSON around it); None where nothing is around it."""
    return _peel(text, _LINE)[1]


def message_templates(template: bytes) -> tuple[tuple[bytes, bool], ...]:
    """``messages`` of a masked template (lowercased, digits as ``0``), each with whether
    anything inside the line changed, not only its start (its colours, its JSON)."""
    layers, _named, inside = _peel(template.decode("latin-1"), _TEMPLATE)
    return tuple((layer.encode("latin-1"), inside) for layer in layers)


def _peel(text: str, rules: _Rules) -> tuple[list[str], str | None, bool]:
    """The text's layers that differ from the one outside them (out of its JSON, past the
    prefixes that name no one, past a writer's name), the innermost that may still start with
    a writer's name (None: the text itself), and whether the inside changed."""
    layers: list[str] = []
    inner = text
    if "{" in inner and '"' in inner:
        envelope = rules.json.match(inner)
        if envelope is not None and "\\u" not in envelope.group(1):
            inner = _ESCAPE.sub(lambda m: _ESCAPES[m.group(1)], envelope.group(1)).rstrip("\n")
    if rules.controls and "[" in inner:
        inner = _CONTROL_TEMPLATE.sub("", inner)
    inside = inner != text
    if inside:
        layers.append(inner)
    past = rules.anonymous.match(inner)
    if past is not None:
        inner = inner[past.end() :]
        layers.append(inner)
    named = inner if inner != text else None
    past = rules.prefix.match(inner)
    if past is not None:
        layers.append(inner[past.end() :])
    return layers, named, inside


@cache
def anchored(pattern: str) -> bool:
    """Whether a regex ties a match to the start of a line (``^`` outside a class): the only
    kind that can match a message where it missed the whole line (the envelope a prefix)."""
    return "^" in pattern.replace("\\^", "").replace("[^", "")
