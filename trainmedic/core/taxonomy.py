"""Failure taxonomy: every label, the layer it belongs to and its default remediation.

The labels are a contract (CLI JSON, artifacts, events): never rename one.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class Category(StrEnum):
    NVLinkError = "NVLinkError"
    ECCError = "ECCError"
    GPUFallenOff = "GPUFallenOff"
    CUDAError = "CUDAError"
    NCCLTimeout = "NCCLTimeout"
    NCCLError = "NCCLError"
    NetworkError = "NetworkError"
    StorageError = "StorageError"
    NodeFailure = "NodeFailure"
    CUDAOutOfMemory = "CUDAOutOfMemory"
    DataloaderKilled = "DataloaderKilled"
    HostOOM = "HostOOM"
    CheckpointError = "CheckpointError"
    ScriptError = "ScriptError"
    LossSpike = "LossSpike"
    NaNLoss = "NaNLoss"
    Hang = "Hang"
    Unknown = "Unknown"


class Layer(StrEnum):
    infrastructure = "infrastructure"
    framework = "framework"
    script = "script"
    training = "training"
    unknown = "unknown"


class Action(StrEnum):
    """What the runbook does about a diagnosis."""

    isolate_and_retry = "isolate_and_retry"  # known bad node: drain it, resubmit elsewhere
    locate_and_retry = "locate_and_retry"  # infra fault, origin unknown: pair test, then retry
    retry = "retry"  # transient infra/framework: resubmit from the newest checkpoint
    retry_with_changes = "retry_with_changes"  # resubmit with a config change (num_workers=0...)
    rollback = "rollback"  # training instability: earlier checkpoint, skip batches
    notify_owner = "notify_owner"  # script bug: never auto-retried
    investigate = "investigate"  # a human looks first


class Remediation(BaseModel):
    model_config = ConfigDict(frozen=True)

    action: Action
    auto_retry: bool
    summary: str
    hints: tuple[str, ...] = ()


_INFRA_NODE = Remediation(
    action=Action.isolate_and_retry,
    auto_retry=True,
    summary="Hardware fault: drain the origin node, run its diagnostics, resubmit from the "
    "newest valid checkpoint on healthy nodes.",
)
_INFRA_FABRIC = Remediation(
    action=Action.locate_and_retry,
    auto_retry=True,
    summary="Collective/fabric fault without a proven origin: run the two-round pair test to "
    "locate faulty nodes, then resubmit from the newest valid checkpoint.",
)

REMEDIATIONS: dict[Category, Remediation] = {
    Category.NVLinkError: _INFRA_NODE,
    Category.ECCError: _INFRA_NODE,
    Category.GPUFallenOff: _INFRA_NODE,
    Category.NodeFailure: _INFRA_NODE,
    Category.CUDAError: Remediation(
        action=Action.locate_and_retry,
        auto_retry=True,
        summary="CUDA runtime fault (often a failing GPU): check the node's Xid/ECC telemetry, "
        "pair-test if no origin is proven, resubmit from the newest valid checkpoint.",
    ),
    Category.NCCLTimeout: _INFRA_FABRIC,
    Category.NCCLError: _INFRA_FABRIC,
    Category.NetworkError: _INFRA_FABRIC,
    Category.StorageError: Remediation(
        action=Action.retry,
        auto_retry=True,
        summary="Storage I/O error: check the filesystem mount, then resubmit from the newest "
        "valid checkpoint (a checkpoint written during the error is skipped by its checksum).",
    ),
    Category.CUDAOutOfMemory: Remediation(
        action=Action.notify_owner,
        auto_retry=False,
        summary="GPU memory exhausted: a configuration problem, not a node fault.",
        hints=(
            "lower the micro-batch size or enable activation checkpointing",
            "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation",
        ),
    ),
    Category.DataloaderKilled: Remediation(
        action=Action.retry_with_changes,
        auto_retry=True,
        summary="A dataloader worker was killed: resubmit with num_workers=0 and GC at fixed "
        "per-rank intervals.",
        hints=("num_workers=0", "gc.collect() every N steps on every rank (same N on all)"),
    ),
    Category.HostOOM: Remediation(
        action=Action.retry_with_changes,
        auto_retry=True,
        summary="Host memory exhausted (OOM killer): resubmit with fewer dataloader workers and "
        "periodic GC.",
        hints=("num_workers=0", "gc.collect() every N steps on every rank (same N on all)"),
    ),
    Category.CheckpointError: Remediation(
        action=Action.investigate,
        auto_retry=False,
        summary="The checkpoint could not be saved or loaded: verify its manifest; a human "
        "chooses the checkpoint to resume from.",
    ),
    Category.ScriptError: Remediation(
        action=Action.notify_owner,
        auto_retry=False,
        summary="Bug in the training script: sent to the job owner with the traceback; never "
        "retried automatically.",
    ),
    Category.LossSpike: Remediation(
        action=Action.rollback,
        auto_retry=True,
        summary="Loss spike: resume from the newest checkpoint before the spike and skip the "
        "data batches from that checkpoint through the spike.",
    ),
    Category.NaNLoss: Remediation(
        action=Action.rollback,
        auto_retry=True,
        summary="Loss became NaN: resume from the newest healthy checkpoint before it and skip "
        "the batches that followed.",
    ),
    Category.Hang: Remediation(
        action=Action.locate_and_retry,
        auto_retry=True,
        summary="No progress and no error: capture stacks, pair-test the job's nodes, resubmit "
        "from the newest valid checkpoint.",
    ),
    Category.Unknown: Remediation(
        action=Action.investigate,
        auto_retry=False,
        summary="No rule explains the logs: a human confirms or corrects the diagnosis.",
    ),
}

LAYERS: dict[Category, Layer] = {
    **{
        c: Layer.infrastructure
        for c in (
            Category.NVLinkError,
            Category.ECCError,
            Category.GPUFallenOff,
            Category.CUDAError,
            Category.NCCLTimeout,
            Category.NCCLError,
            Category.NetworkError,
            Category.StorageError,
            Category.NodeFailure,
        )
    },
    **{
        c: Layer.framework
        for c in (
            Category.CUDAOutOfMemory,
            Category.DataloaderKilled,
            Category.HostOOM,
            Category.CheckpointError,
        )
    },
    Category.ScriptError: Layer.script,
    Category.LossSpike: Layer.training,
    Category.NaNLoss: Layer.training,
    Category.Hang: Layer.infrastructure,
    Category.Unknown: Layer.unknown,
}


def layer_of(category: Category) -> Layer:
    return LAYERS[category]


def remediation_for(category: Category) -> Remediation:
    return REMEDIATIONS[category]
