"""What the ranks left waiting in a collective say about the one they waited on.

A collective timeout is what every other rank sees; these read, from the same logs, why one
rank never joined: it was still writing a checkpoint, or it had taken a code path the others
had not and called a different collective.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from trainmedic.core.taxonomy import Category
from trainmedic.diagnosis.scan import Hit, SourceScan

__all__ = ["mismatched_collectives", "save_unfinished"]

# A checkpoint save that began and never ended: rank 0 gathers and writes the state while
# every other rank waits in its next collective, and the watchdog's timeout hits them all.
_SAVE_BEGINS = re.compile(
    r"\bsaving (?:the )?(?:model |sharded |distributed )?checkpoint|save_checkpoint\b|"
    r"Retrieving (?:full )?(?:model|optimizer) state dict|\[Torch\] Saving|"
    r"Saving model (?:checkpoint|weights|state)",
    re.I,
)
_SAVE_ENDS = re.compile(
    r"\bsaved\b|successfully sav|finished sav|sav\w*.{0,40}\b(?:complete|done|finished)\b",
    re.I,
)
_PROGRESS = re.compile(r"\b(?:iter(?:ation)?|step|epoch)\s*[:=]?\s*\d|\d+%\||\bloss\b\s*[:=]", re.I)


def save_unfinished(scans: Sequence[SourceScan]) -> tuple[int, int, str] | None:
    """(source index, line number, line) of a checkpoint save that was the last thing a log
    began: nothing saved, no training step after it (a source's last lines only). Beside
    collective timeouts it is their cause: the other ranks waited on the saving one."""
    for scan in scans:
        tail = scan.tail
        begun = [i for i, line in enumerate(tail) if _SAVE_BEGINS.search(line)]
        if not begun:
            continue
        after = tail[begun[-1] + 1 :]
        if any(_SAVE_ENDS.search(line) or _PROGRESS.search(line) for line in after):
            continue
        line_no = max(1, scan.lines - (len(tail) - 1 - begun[-1]))
        return scan.index, line_no, tail[begun[-1]].strip()
    return None


# The watchdog's report of the collective a rank timed out in (PyTorch's WorkNCCL repr). The
# operation's name must end where the repr ends it: a line a terminal or a pager cut inside
# it ("OpType=_ALLGATHER_BA[451/1919]") names no collective, let alone another one.
_WORK = re.compile(r"SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)(?=[,)])(?:, NumelIn=(?P<numel>\d+))?")
# Collectives whose every rank passes the same number of elements; a coalesced group or an
# all-to-all may differ by rank (model-parallel shards).
_SAME_SIZE = frozenset({"ALLREDUCE", "BROADCAST", "REDUCE"})


def mismatched_collectives(hits: Sequence[Hit]) -> tuple[Hit, Hit] | None:
    """Two timed-out ranks at the same sequence number in different collectives (another
    operation, or another size): the ranks' code took different paths (an evaluation or a
    save on one rank only, a data-dependent branch), a bug no node or retry fixes. PyTorch's
    own collective fingerprint check reports the same thing when it is enabled."""
    seen: dict[str, tuple[str, str | None, Hit]] = {}
    for hit in hits:
        if hit.signature.category is not Category.NCCLTimeout:
            continue
        work = _WORK.search(hit.text)
        if work is None:
            continue
        op, numel = work.group("op"), work.group("numel")
        first = seen.setdefault(work.group("seq"), (op, numel, hit))
        other_op, other_numel, other = first
        sized = op in _SAME_SIZE and None not in (numel, other_numel)
        if op != other_op or (sized and numel != other_numel):
            return other, hit
    return None
