"""Streaming scan of one log source: signature hits, loss curve, tail.

Memory stays bounded whatever the log size: blocks of ~1 MiB, the first and last few hits
per signature, a sampled loss curve, the last lines. Speed comes from never looking at a
line in Python unless its *template* (lowercased, digits masked) contains a prefilter
anchor: a training log is millions of lines sharing a few templates, so one C-level
translate + split + set per block replaces millions of regex searches. A flagged line runs
only the signatures whose required literal its template holds, and lines that differ only in
their numbers share one verdict (:mod:`trainmedic.diagnosis.dispatch`); a hit is built from
the real line only when it is kept (the first and last few per signature).
"""

from __future__ import annotations

import ipaddress
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field

from trainmedic.core.validate import log_number
from trainmedic.diagnosis.attribution import (
    Attribution,
    attribute,
    ray_task_scopes,
    shell_prompts,
    writer,
)
from trainmedic.diagnosis.catalogue import MASK, Catalogue, Signature
from trainmedic.diagnosis.dispatch import Dispatch, line_text, search_messages, searches
from trainmedic.diagnosis.envelope import message_templates, messages, uncoloured
from trainmedic.diagnosis.loss import (
    LossPoint,
    extract_grad_norms,
    extract_loss_scales,
    extract_losses,
)
from trainmedic.diagnosis.sources import LogSource

__all__ = ["Hit", "SourceScan", "scan_source"]

KEEP_FIRST = 3
KEEP_LAST = 3
TAIL_LINES = 40
MAX_LINE = 4 << 20  # a "line" longer than this is cut: a log without newlines stays bounded
MAX_EVIDENCE_TEXT = 400
FULL_LOSS_BLOCKS = 2  # the last blocks of a source: every loss value is read
LOSS_SAMPLE_BYTES = 32 << 10  # other blocks: only their first 32 KiB
LOSS_SAMPLE_POINTS = 16
# The gradient norm is read in full only over the last block's last 64 KiB (where the log
# ends, and a blow-up the loss has not followed yet is): trainers print it on every step line,
# and reading a whole block of them cost as much as the loss curve itself.
GRAD_TAIL_BYTES = 64 << 10

HEAD_LINES = 40  # the first lines of a source, where launchers and NCCL say where they run


@dataclass(frozen=True)
class Hit:
    signature: Signature
    source_index: int
    file: str
    line: int
    text: str
    host: str | None
    rank: int | None
    gpu: str | None  # "1" or a PCI id
    timestamp: float | None
    # The host came from the line's own words ("closed by remote peer node2"), not from the
    # prefix naming the machine that printed it.
    named: bool = False
    # The host is the far end of a broken connection (a ``peer`` signature): a suspect for the
    # pair test, never proof for a drain.
    far_end: bool = False

    @property
    def order(self) -> tuple[float, int, int]:
        # Timestamps order lines across files; without one, file order then line order.
        return (
            self.timestamp if self.timestamp is not None else float("inf"),
            self.source_index,
            self.line,
        )


@dataclass
class _Bucket:
    first: list[Hit] = field(default_factory=list)
    last: deque[Hit] = field(default_factory=lambda: deque(maxlen=KEEP_LAST))
    count: int = 0
    # While scanning: the latest matching lines past the first few, as (raw line, number,
    # host of the shell prompt or Ray task header above it); only those still here at the end
    # become hits.
    pending: deque[tuple[bytes, int, str | None]] = field(
        default_factory=lambda: deque(maxlen=KEEP_LAST)
    )

    def hits(self) -> list[Hit]:
        return [*self.first, *self.last]


@dataclass
class SourceScan:
    source: LogSource
    index: int
    lines: int = 0
    bytes_read: int = 0
    buckets: dict[str, _Bucket] = field(default_factory=dict)
    loss_points: list[LossPoint] = field(default_factory=list)
    scale_points: list[LossPoint] = field(default_factory=list)  # fp16 loss scale
    grad_points: list[LossPoint] = field(default_factory=list)  # gradient norm
    tail: list[str] = field(default_factory=list)
    # The hosts its first and last lines and its shell prompts say they were written on (its
    # file's host, where the name tells): one host means a one-node log (placing.only_host).
    writers: set[str] = field(default_factory=set)

    def hits(self) -> list[Hit]:
        return [hit for bucket in self.buckets.values() for hit in bucket.hits()]

    def count(self, signature_id: str) -> int:
        bucket = self.buckets.get(signature_id)
        return bucket.count if bucket else 0


def scan_source(source: LogSource, index: int, catalogue: Catalogue) -> SourceScan:
    scanner = _Scanner(source, index, catalogue)
    scanner.run()
    return scanner.result


class _Scanner:
    def __init__(self, source: LogSource, index: int, catalogue: Catalogue) -> None:
        self.result = SourceScan(source=source, index=index)
        self.catalogue = catalogue
        self.prefilter = catalogue.prefilter.search
        self.dispatch = Dispatch(catalogue.signatures)
        self.attribution: tuple[int, Attribution] | None = None  # of the latest line asked
        # (first line number, body, the loss-scale reading before it) of the latest blocks,
        # re-read in full at the end so the end of the curve (where a spike is) is exact.
        self.recent: deque[tuple[int, bytes, float | None]] = deque(maxlen=FULL_LOSS_BLOCKS)
        self.loss_blocks: list[list[LossPoint]] = []
        self.scale_blocks: list[list[LossPoint]] = []
        self.grad_blocks: list[list[LossPoint]] = []
        # The last loss-scale reading so far: a block's first line that states a fall is a
        # fall of its own only where none came before.
        self.last_scale: float | None = None
        # The host the latest shell prompt or Ray task header names, if any.
        self.prompt_host: str | None = None
        # (node, lines left) of a Ray task's traceback the latest block ended inside of.
        self.ray_open: tuple[str, int] | None = None
        self.head: list[bytes] | None = None

    def run(self) -> None:
        carry = b""
        next_line = 1
        last_body = b""
        for block in self.result.source.open_blocks():
            self.result.bytes_read += len(block)
            data = carry + block if carry else block
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                if len(data) < MAX_LINE:
                    carry = data
                    continue
                cut = len(data)
            body, carry = (data, b"") if cut == len(data) else (data[:cut], data[cut:])
            next_line = self._scan_body(body, next_line)
            last_body = body
        if carry:
            next_line = self._scan_body(carry + b"\n", next_line)
            last_body = last_body[-(64 << 10) :] + carry + b"\n"
        self.result.lines = next_line - 1
        self._finish_hits()
        self._finish_loss()
        tail = last_body[-(64 << 10) :].decode("utf-8", "replace").splitlines()
        self.result.tail = [uncoloured(line) for line in tail[-TAIL_LINES:]]
        head = [line_text(raw) for raw in self.head or []]
        self.result.writers.update(w for w in map(writer, head + self.result.tail) if w)
        if self.result.source.host:
            self.result.writers.add(self.result.source.host.lower())

    def _scan_body(self, body: bytes, first_line: int) -> int:
        if self.head is None:
            self.head = body[: 64 << 10].split(b"\n", HEAD_LINES)[:HEAD_LINES]
        masked_lines = body.translate(MASK).split(b"\n")
        templates = set(masked_lines)
        flagged = {t for t in templates if self.prefilter(t) or self._message_flagged(t)}
        # (line offset, host) where the host the lines were printed on changes, in order: a
        # shell prompt, a Ray task's error header and the end of its traceback. Rare, so looked
        # for only where an "@" is, and where a flagged template holds "ray::" (an anchor) or
        # the block before ended inside a Ray traceback: searching every block for headers
        # would cost a tenth of a quiet scan.
        # A container's id in a prompt names the machine only when the file names none.
        known = bool(self.result.source.host)
        shells = shell_prompts(body, containers=not known) if b"@" in body else []
        prompts: list[tuple[int, str | None]] = list(shells)
        has_headers = any(b"ray::" in template for template in flagged)
        if has_headers or self.ray_open is not None:
            scopes, self.ray_open = ray_task_scopes(body, self.ray_open, headers=has_headers)
            prompts = _with_ray_tracebacks(shells, scopes, self.prompt_host)
        if flagged:
            raw_lines = body.split(b"\n")
            upcoming = iter(prompts)
            prompt = next(upcoming, None)
            for offset, template in enumerate(masked_lines):
                while prompt is not None and prompt[0] <= offset:
                    self.prompt_host = prompt[1]
                    prompt = next(upcoming, None)
                if template in flagged:
                    self._match_line(raw_lines[offset], first_line + offset)
        if prompts:
            self.prompt_host = prompts[-1][1]
            # A shell's host printed what follows; a Ray header's node only raised one error.
            self.result.writers.update(host for _, host in shells if host is not None)
        self._collect_loss(body, first_line)
        return first_line + len(masked_lines) - 1

    def _message_flagged(self, template: bytes) -> bool:
        """Whether the message inside the template's envelope holds an anchor: only the
        anchors tied to a message's start can newly match where the envelope was a prefix
        alone (every other anchor was in the whole template already)."""
        prefilter = self.catalogue.prefilter
        return any(
            prefilter.search(inner) if inside else prefilter.search_starts(inner)
            for inner, inside in message_templates(template)
        )

    def _collect_loss(self, body: bytes, first_line: int) -> None:
        before = self.last_scale
        points: list[LossPoint] = []
        scales: list[LossPoint] = []
        grads: list[LossPoint] = []
        has_loss, has_norm = b"oss" in body, b"norm" in body  # "loss" or "Loss"; "grad norm"
        if has_loss or has_norm:
            window = body[:LOSS_SAMPLE_BYTES]
            window = window[: window.rfind(b"\n") + 1]
        if has_loss:
            points = list(extract_losses(window, first_line, limit=LOSS_SAMPLE_POINTS))
            scales = list(
                extract_loss_scales(window, first_line, limit=LOSS_SAMPLE_POINTS, previous=before)
            )
            if scales:
                self.last_scale = scales[-1].value
        if has_norm:
            grads = list(extract_grad_norms(window, first_line, limit=LOSS_SAMPLE_POINTS))
        self.loss_blocks.append(points)
        self.scale_blocks.append(scales)
        self.grad_blocks.append(grads)
        self.recent.append((first_line, body, before))

    def _finish_loss(self) -> None:
        # The last blocks were only sampled: read all their values now, each block's scale
        # readings following on from the full reading of the block before it.
        recent = list(self.recent)
        before = recent[0][2] if recent else None
        for position, (first_line, body, _sampled_before) in enumerate(recent):
            block_index = len(self.loss_blocks) - len(recent) + position
            if b"oss" in body:
                self.loss_blocks[block_index] = list(extract_losses(body, first_line))
                scales = list(extract_loss_scales(body, first_line, previous=before))
                self.scale_blocks[block_index] = scales
                if scales:
                    before = scales[-1].value
            if position == len(recent) - 1 and b"norm" in body:
                sampled = self.grad_blocks[block_index]
                self.grad_blocks[block_index] = _norms_to_end(body, first_line, sampled)
        self.result.loss_points = [p for block in self.loss_blocks for p in block]
        self.result.scale_points = [p for block in self.scale_blocks for p in block]
        self.result.grad_points = [p for block in self.grad_blocks for p in block]
        self.loss_blocks = []
        self.scale_blocks = []
        self.grad_blocks = []
        self.recent.clear()

    def _match_line(self, raw: bytes, line_no: int) -> None:
        text: str | None = None
        inner: tuple[str, ...] | None = None  # its messages, worked out only when needed
        buckets = self.result.buckets
        for signature, alternatives in self.dispatch.verdict(raw):
            if alternatives is not None:
                if text is None:
                    text = line_text(raw)
                if not any(r.search(text) for r in alternatives):
                    if inner is None:
                        inner = messages(text)
                    if not any(search_messages(r, text, inner) for r in alternatives):
                        continue
            bucket = buckets.get(signature.id)
            if bucket is None:
                bucket = buckets[signature.id] = _Bucket()
            bucket.count += 1
            if len(bucket.first) < KEEP_FIRST:
                bucket.first.append(self._hit(signature, raw, line_no, self.prompt_host))
            else:
                bucket.pending.append((raw, line_no, self.prompt_host))

    def _finish_hits(self) -> None:
        by_id = {s.id: s for s in self.catalogue.signatures}
        for signature_id, bucket in self.result.buckets.items():
            signature = by_id[signature_id]
            bucket.last.extend(self._hit(signature, *pending) for pending in bucket.pending)
            bucket.pending.clear()

    def _hit(
        self, signature: Signature, raw: bytes, line_no: int, prompt_host: str | None = None
    ) -> Hit:
        text = line_text(raw)
        # the whole line, else a message inside the line's envelope
        searched = searches(signature.regex, text)
        if searched is None:  # the verdict said it matches: a bug, never a silent miss
            raise AssertionError(f"{signature.id} judged to match line {line_no} but does not")
        match, matched = searched
        if self.attribution is None or self.attribution[0] != line_no:
            self.attribution = (line_no, attribute(text))
        host, rank, gpu, timestamp = self.attribution[1]
        printer = host
        if signature.witness:
            # the printer's place, GPU included, is not where it happened
            host = rank = gpu = None
        groups = {k: v for k, v in match.groupdict().items() if v}
        named = any(name.startswith(("host", "ip")) for name in groups)
        if named:
            # The line names another host (a peer): the prefix's GPU is the printer's, not its.
            gpu = None
        for name, value in groups.items():
            if name.startswith("ip") and _own_address(value):
                # A loopback or link-local "peer" is the printer itself: NCCL bound to lo or
                # to an fe80:: address, a fault of this host's own network set-up.
                host = printer
            elif name.startswith(("host", "ip")):
                host = value.lower() if name.startswith("host") else value
            elif name.startswith("rank"):
                rank = log_number(value)
            elif name.startswith(("pci", "gpu")):
                gpu = value
        source = self.result.source
        return Hit(
            signature=signature,
            source_index=self.result.index,
            file=source.name,
            line=line_no,
            # the whole line where it is short: its prefix says who wrote it and when
            text=text if len(text) <= MAX_EVIDENCE_TEXT else _excerpt(matched, match.start()),
            # The line's own prefix, else the shell it was printed in, else the file's name.
            host=host if host is not None or signature.witness else prompt_host or source.host,
            rank=rank if rank is not None or signature.witness else source.rank,
            gpu=gpu,
            timestamp=timestamp,
            named=named,
            far_end=named and signature.peer,
        )


def _with_ray_tracebacks(
    shells: list[tuple[int, str | None]], headers: list[tuple[int, str, int]], before: str | None
) -> list[tuple[int, str | None]]:
    """Shell prompts and Ray task headers as one ordered list of host changes: a header's node
    holds for its traceback only, then the host of the shell in force there again (``before``:
    the one in force when the block began)."""
    changes: list[tuple[int, str | None]] = list(shells)
    offsets = [at for at, _ in shells]  # in line order, as shell_prompts finds them
    for start, node, end in headers:
        changes.append((start, node))
        last = bisect_right(offsets, end) - 1
        changes.append((end, shells[last][1] if last >= 0 else before))
    return sorted(changes, key=lambda change: change[0])


def _excerpt(text: str, start: int) -> str:
    if len(text) <= MAX_EVIDENCE_TEXT:
        return text
    begin = max(0, start - 120)
    return ("…" if begin else "") + text[begin : begin + MAX_EVIDENCE_TEXT] + "…"


def _norms_to_end(body: bytes, first_line: int, sampled: list[LossPoint]) -> list[LossPoint]:
    """The block's gradient norms: all of them in its last GRAD_TAIL_BYTES, after the ones its
    sample read (the whole block where that leaves nothing between them)."""
    if len(body) <= LOSS_SAMPLE_BYTES + GRAD_TAIL_BYTES:
        return list(extract_grad_norms(body, first_line))
    cut = body.find(b"\n", len(body) - GRAD_TAIL_BYTES) + 1
    return [*sampled, *extract_grad_norms(body[cut:], first_line + body.count(b"\n", 0, cut))]


def _own_address(address: str) -> bool:
    """A loopback or link-local address: the host's own, whoever printed it ("127.0.0.1",
    "fe80::c4eb:49ff:fe04:e32d%6")."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0].strip("[]"))
    except ValueError:
        return False
    return ip.is_loopback or ip.is_link_local
