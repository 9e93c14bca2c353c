"""Evidence that no single log line gives: what the training curves say (a loss spike, the
fp16 loss scale collapsing, the gradient norm blowing up), telemetry, a job's exit code, a
stale heartbeat, a log that only stops. Each is a Signature of its own (a weight and a
category like any other), so the ranking weighs it beside the lines' evidence.
Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from trainmedic.core.taxonomy import Category
from trainmedic.diagnosis.catalogue import Role, Signature
from trainmedic.diagnosis.loss import find_grad_norm_spike, find_scale_collapse, find_spikes
from trainmedic.diagnosis.scan import Hit, SourceScan

__all__ = ["curve_hits", "synthetic_hit"]


def _synthetic(
    sig_id: str,
    category: Category,
    weight: float,
    role: Role = Role.cause,
    *,
    corroborates: bool = False,
) -> Signature:
    return Signature(
        id=sig_id,
        category=category,
        role=role,
        weight=weight,
        regex=re.compile("(?!)"),
        examples=(),
        corroborates=corroborates,
    )


LOSS_SPIKE = _synthetic("loss-spike", Category.LossSpike, 0.7)
# A spike the loss came back from: below the confidence floor, so it rolls nothing back, but
# it outranks a log merely ending in ordinary output (SILENCE).
LOSS_SPIKE_PASSED = _synthetic("loss-spike-passed", Category.LossSpike, 0.35)
# fp16 dynamic loss scaling halving again and again: gradients overflow at every step.
LOSS_SCALE_COLLAPSE = _synthetic("loss-scale-collapse", Category.LossSpike, 0.6)
# A shorter fall the log still ends in: like a spike the loss came back from, below the floor,
# it outranks only a log merely ending in ordinary output (a stale heartbeat outranks it).
LOSS_SCALE_FALLING = _synthetic("loss-scale-falling", Category.LossSpike, 0.35)
# The gradient norm jumping twentyfold: the instability before a loss spike. Like a spike the
# loss came back from, below the floor: a human looks before anything is rolled back.
GRAD_NORM_SPIKE = _synthetic("grad-norm-spike", Category.LossSpike, 0.35)
TELEMETRY_FALLEN_OFF = _synthetic("telemetry-xid-79", Category.GPUFallenOff, 0.9)
TELEMETRY_ECC = _synthetic("telemetry-ecc", Category.ECCError, 0.9)
TELEMETRY_NVLINK = _synthetic("telemetry-nvlink", Category.NVLinkError, 0.85)
TELEMETRY_HOT = _synthetic("telemetry-temperature", Category.Unknown, 0.0, Role.context)
EXIT_SIGKILL = _synthetic("exit-code-sigkill", Category.HostOOM, 0.55, corroborates=True)
EXIT_SEGFAULT = _synthetic("exit-code-segfault", Category.Unknown, 0.4)  # as "segfault"
HEARTBEAT_STALE = _synthetic("heartbeat-stale", Category.Hang, 0.4)
# Every log ends in ordinary output (INFO lines, progress): no error, no exit status. A job
# that failed like that stopped making progress; which rank stalled, the logs cannot say.
SILENCE = _synthetic("log-ends-in-silence", Category.Hang, 0.3, Role.symptom)
# Nor does the word table find a cause, and no last line says that anything failed or ended,
# though the last is no progress line (a metrics table, a thread dump): weaker still, as a
# report may have cut the lines that said why (silence.ends_unexplained).
UNEXPLAINED_END = _synthetic("log-ends-unexplained", Category.Hang, 0.2, Role.symptom)
# Collective timeouts while a rank was still saving a checkpoint: the save is the cause.
SAVE_UNFINISHED = _synthetic("checkpoint-save-unfinished", Category.CheckpointError, 0.6)
# Ranks timed out in different collectives at the same sequence number: the code diverged.
COLLECTIVE_MISMATCH = _synthetic("collectives-mismatched", Category.ScriptError, 0.75)
_SYNTHETIC_SOURCE = 1_000_000  # sorts after every real file when there is no timestamp


def synthetic_hit(
    signature: Signature,
    text: str,
    host: str | None,
    *,
    file: str = "<job>",
    line: int = 0,
    gpu: str | None = None,
    source_index: int = _SYNTHETIC_SOURCE,
    rank: int | None = None,
) -> Hit:
    return Hit(
        signature=signature,
        source_index=source_index,
        file=file,
        line=line,
        text=text,
        host=host,
        rank=rank,
        gpu=gpu,
        timestamp=None,
    )


def curve_hits(scans: Sequence[SourceScan]) -> list[Hit]:
    """What each source's loss, loss-scale and gradient-norm readings say."""
    hits = []
    for scan in scans:
        found: list[tuple[Signature, str, int]] = []
        lasting, passed = find_spikes(scan.loss_points)
        if lasting is not None:
            found.append((LOSS_SPIKE, lasting.describe(), lasting.line))
        elif passed is not None:
            found.append((LOSS_SPIKE_PASSED, passed.describe(), passed.line))
        collapse = find_scale_collapse(scan.scale_points)
        if collapse is not None:
            signature = LOSS_SCALE_COLLAPSE if collapse.deep else LOSS_SCALE_FALLING
            found.append((signature, collapse.describe(), collapse.line))
        blowup = find_grad_norm_spike(scan.grad_points)
        if blowup is not None:
            found.append((GRAD_NORM_SPIKE, blowup.describe(), blowup.line))
        for signature, text, line in found:
            hits.append(
                synthetic_hit(
                    signature,
                    text,
                    scan.source.host,
                    file=scan.source.name,
                    line=line,
                    source_index=scan.index,
                    rank=scan.source.rank,
                )
            )
    return hits
