"""Logs that end without saying why: no error, no exit status, no failure line in their last
lines. A job that failed like that stopped making progress (a hang), or its end was never
logged; which rank stalled, the logs cannot say.

Two readings, the second asked only once the word table has nothing either:

- ``ends_in_progress``: every log's last line is ordinary output (a log level, a progress bar,
  a training step). That is what a hang looks like from its logs.
- ``ends_unexplained``: the last lines hold no word of an error or an ending, whatever the
  last line says (a metrics table, a thread dump, a command echoed). Weaker: a report may
  have cut the lines that said why. A log cut inside a raised traceback ended in a crash.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from trainmedic.diagnosis.attribution import RAY_WORKER_LINE
from trainmedic.diagnosis.catalogue import Role
from trainmedic.diagnosis.envelope import messages
from trainmedic.diagnosis.scan import Hit, SourceScan

__all__ = ["ends_in_progress", "ends_unexplained"]

# A line that says the job failed or was stopped: its log does not end in silence. A native
# backtrace (UCX's "==== backtrace", glibc's) is a crash's.
_TERMINAL = re.compile(
    r"(?i)error|exception|fail|fatal|abort|signal|kill|exit|terminat|traceback|died|dead|"
    r"cancel|segmentation|core dump|panic|oom\b|giving up|shut(?:ting)? ?down|interrupt|"
    r"backtrace"
)
# A traceback's frame ('File "x.py", line 12, in f'): a log cut inside one ended in a crash,
# unless its last lines are a stack dump of live threads, which a hang's watcher prints
# (faulthandler's 'Current thread 0x...', a handler's "Thread ID", py-spy's 'Thread 123'):
# faulthandler's own frames ('line 12 in f', no comma) and py-spy's never match.
_RAISED_FRAME = re.compile(r'\bFile "[^"]+", line \d+, in ')
_THREAD_DUMP = re.compile(r"(?i)\b(?:current )?thread (?:id\b|0x[0-9a-f]+|\d+)|printing stack")
# An ordinary line: a log level (glog's "I0515 20:03:26.569316" is INFO, "V0731 ..." verbose,
# a short "[I]" tag), a progress bar, a training step, PyTorch loading a C++/CUDA extension it
# built (where a stale build lock leaves it waiting), a rank checking in at start-up
# (Lightning's "initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/8": a job whose last word is that
# waits for the members that never came), Weights & Biases' run summary (printed when training
# is over: a job that ends there stopped on its way out), or a Ray worker's own output
# (attribution.RAY_WORKER_LINE).
_ORDINARY = re.compile(
    r"\b(?:INFO|DEBUG|NOTICE)\b|(?:^|[\s:\]])(?-i:[IV])\d{4} \d\d:\d\d:\d\d\.\d+ |\d+%\||"
    r"\b(?:iter(?:ation)?|step|epoch)\b|\bMEMBER: \d+/\d+|\[(?-i:[IDV])\] |(?:^|\]:)wandb: |"
    r"^Loading extension module [\w.-]+\.\.\.$",
    re.I,
)


# Lines that say nothing: an ellipsis where a report cut lines out.
_EMPTY = re.compile(r"^\s*(?:\.{3,}|…)\s*$")
# NCCL probing for optional network plugins at start-up ("NET/Plugin: Failed to find
# ncclCollNetPlugin_v4 symbol", "Plugin load (libnccl-net.so) returned 2") or for the verbs
# library on a host without InfiniBand (it then uses sockets): routine, not a failure.
# A Python warning ("checkpoint.py:460: UserWarning: ...", then its "  warnings.warn(" source
# line) is printed once when a code path is first taken and says nothing of how the job ended.
_ROUTINE = re.compile(
    r"NCCL INFO NET/Plugin\s*:|NCCL WARN Failed to open libibverbs\b|"
    r"\.py:\d+: \w*Warning: |^\s*warnings\.warn\("
)


def ends_in_progress(scans: Sequence[SourceScan], hits: Sequence[Hit]) -> tuple[int, str] | None:
    """(index of the last source, its last line) when every log ends in ordinary output: no
    error, no exit status, no failure line anywhere (the caller has found no cause or
    symptom), only progress."""
    return _quiet_end(scans, hits, progress=True)


def ends_unexplained(scans: Sequence[SourceScan], hits: Sequence[Hit]) -> tuple[int, str] | None:
    """(index of the last source, its last line) when no log's last lines say that anything
    failed or ended, whatever its last line is."""
    return _quiet_end(scans, hits, progress=False)


def _quiet_end(
    scans: Sequence[SourceScan], hits: Sequence[Hit], *, progress: bool
) -> tuple[int, str] | None:
    if any(h.signature.role is Role.context for h in hits):
        return None
    last: tuple[int, str] | None = None
    for scan in scans:
        kept = [
            (line, said)
            for line in scan.tail
            if (said := _said(line)).strip()
            and not _EMPTY.match(said)
            and not _ROUTINE.search(line)
        ]
        if not kept:
            continue
        lines, said = [line for line, _ in kept], [message for _, message in kept]
        if any(_TERMINAL.search(line) for line in lines):
            return None
        if any(map(_RAISED_FRAME.search, said)) and not any(map(_THREAD_DUMP.search, said)):
            return None
        if progress and not any(
            _ORDINARY.search(text) or RAY_WORKER_LINE.match(text)
            for text in (lines[-1], *messages(lines[-1]))
        ):
            return None
        last = (scan.index, lines[-1].strip())
    return last


def _said(line: str) -> str:
    """What the line says, without the envelope (a timestamp, a launcher's tag: a cut line
    "3: ..." is still a cut)."""
    inner = messages(line)
    return inner[-1] if inner else line
