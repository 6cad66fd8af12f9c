"""Memory rule: GPU memory blocks on ONE GPU (per-card best fit), and whole free GPUs.

Pure; imports only numpy, pydantic, ``domain`` and ``policy.base``. Its term, memoryFit,
depends on the pod: ``verdict`` works it out (best fit here, or the fragmentation rule's score).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from scheduler_extender.domain import MAX_BLOCK_MIB, MIN_BLOCK_MIB
from scheduler_extender.policy.base import (
    ArgsModel,
    Duration,
    Section,
    Term,
    class_weights,
    clip01,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class IdleReleaseArgs(ArgsModel):
    """``spec.memory.idleRelease``: idle blocks lent to best-effort pods (ours)."""

    enabled: bool = Field(
        False,
        description="Lend the idle blocks of pods that stay below `below` of their budget for "
        "`after` to best-effort pods, taken back (the borrowers evicted) as soon as an owner "
        "grows. Needs remediation.enabled (the leader takes them back).",
    )
    below: float = Field(
        0.7, gt=0, le=1, description="A pod using less than this share of its blocks is idle."
    )
    after: Duration = Field(
        300.0, description="How long a pod stays idle before its idle blocks are lent (5m)."
    )


class MemoryArgs(ArgsModel):
    """``spec.memory`` (ours)."""

    block_mib: int = Field(
        4096,
        alias="blockMiB",
        ge=MIN_BLOCK_MIB,
        le=MAX_BLOCK_MIB,
        description="MiB per edgegpu.io/gpu-mem-block, 256 to 1048576; 4 GiB makes 3 blocks of "
        "a 15 GiB T4. At least 256: the device plugin lists each block to kubelet, in a message "
        "that must stay within kubelet's 4 MiB gRPC limit.",
    )
    assume_ttl_s: Duration = Field(
        300.0,
        alias="assumeTTL",
        description="How long a bind's reservation counts while telemetry does not show the pod.",
    )
    idle_used_mib: float = Field(
        512.0,
        alias="idleUsedMiB",
        ge=0,
        description="MiB in use (driver, persistence daemon) up to which a GPU counts as free "
        "and loses no memory block.",
    )
    over_budget: Literal["warn", "evict"] = Field(
        "warn",
        alias="overBudget",
        description="A pod using more GPU memory than its blocks: warn (an Event) or evict it "
        "after overBudgetGrace (the leader, with remediation enabled).",
    )
    over_budget_grace_s: Duration = Field(
        60.0,
        alias="overBudgetGrace",
        description="How long a pod may stay over its blocks before overBudget: evict acts (1m).",
    )
    idle_release: IdleReleaseArgs = Field(
        default_factory=IdleReleaseArgs,
        alias="idleRelease",
        description="Idle blocks lent to best-effort pods (off by default).",
    )


SECTION = Section(
    "memory", MemoryArgs, "GPU memory blocks (edgegpu.io/gpu-mem-block) and their budgets."
)


def capacity_blocks(memory_total_mib: FloatArray, args: MemoryArgs) -> IntArray:
    """Blocks a GPU has in all: floor(total / blockMiB); unknown total → 0."""
    total = np.fmax(memory_total_mib, 0.0)
    # floor(total / blockMiB), not floor_divide: the same for MiB counts and ten times faster.
    return np.floor(total / args.block_mib).astype(np.int64)


def room_blocks(
    memory_total_mib: FloatArray,
    unaccounted_used_mib: FloatArray,
    allocated_blocks: IntArray,
    args: MemoryArgs,
    lent_blocks: IntArray | int = 0,
) -> IntArray:
    """Blocks left on each GPU, below zero where more are held than it has.

    room = capacity − allocated − ceil(unaccounted used / blockMiB) (+ lent), where
    *allocated* are blocks given at bind (whether or not telemetry shows them yet) and
    *unaccounted used* is memory in use by anything that is not an assigned pod. Up to
    ``idleUsedMiB`` of it (the driver's own) costs no block, so an idle GPU has as many blocks
    free as the device plugin advertises for it, and kube-scheduler's count agrees. With
    ``lent_blocks`` (idle blocks of the GPU's pods), the room of a best-effort pod, which may
    borrow them.
    """
    unaccounted = np.fmax(unaccounted_used_mib, 0.0)
    foreign = np.where(unaccounted > args.idle_used_mib, unaccounted, 0.0)
    used = np.ceil(foreign / args.block_mib).astype(np.int64)
    room: IntArray = capacity_blocks(memory_total_mib, args) - allocated_blocks - used + lent_blocks
    return room


def free_blocks(
    total: FloatArray,
    unaccounted: FloatArray,
    allocated: IntArray,
    args: MemoryArgs,
    borrowed: IntArray | int = 0,
) -> IntArray:
    """A GPU's own free blocks: ``room_blocks``, at least 0.

    ``borrowed`` are the blocks best-effort pods hold in lent blocks (part of ``allocated``):
    they are not taken from the GPU's own room.
    """
    out: IntArray = np.maximum(room_blocks(total, unaccounted, allocated - borrowed, args), 0)
    return out


def idle_blocks(budget_mib: float, used_mib: float, block_mib: int, below: float) -> int:
    """Whole blocks a pod can lend: as many as leave its use below ``below`` of the rest.

    ``k = floor((budget - used / below) / block)``, at least 0: a pod lending ``k`` blocks can
    have ``budget - k × block``, and its use stays under ``below`` of that. As its use grows
    towards what it can have, it lends fewer blocks (and the borrowers go when its GPU is
    short), so a borrower can never hold the lender's memory for good.
    """
    return max(int((budget_mib - max(used_mib, 0.0) / below) // block_mib), 0)


def is_idle(
    unaccounted_used_mib: FloatArray,
    allocated_blocks: IntArray,
    whole_taken: BoolArray,
    args: MemoryArgs,
) -> BoolArray:
    """A GPU is free as a whole when nothing is assigned to it and nothing else uses memory."""
    used = np.fmax(unaccounted_used_mib, 0.0)
    idle: BoolArray = (allocated_blocks == 0) & ~whole_taken & (used <= args.idle_used_mib)
    return idle


def fit_score(free: IntArray, capacity: IntArray, request_blocks: int, pack: bool) -> FloatArray:
    """How well a request fits a GPU, in 0..1.

    left = (free − request) / capacity;  pack: 1 − left (best fit);  spread: left.
    A whole-GPU request (request_blocks = 0) fits every free GPU equally: 1.
    """
    if request_blocks <= 0:
        return np.ones(free.shape, dtype=np.float64)
    # Over a capacity of 0 (no GPU, unknown size) the share is ±inf, or NaN → 0.
    empty = np.where(free > request_blocks, 1.0, 0.0)
    left = clip01(np.divide(free - request_blocks, capacity, out=empty, where=capacity > 0))
    return 1.0 - left if pack else left


TERM = Term(
    "memoryFit",
    "Best fit (packing classes) or most room left.",
    class_weights(realtime=1, training=1, inference=3, best_effort=3),
)
