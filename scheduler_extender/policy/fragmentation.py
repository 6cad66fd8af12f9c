"""Fragmentation rule: place a pod where it leaves the least idle GPU that future pods cannot use.

A node's *fragment* with respect to a demand shape m (b_m blocks on one GPU, or k_m whole GPUs)
is the idle GPU it could not give m: every free block of the node if m fits nowhere on it, else
only the free blocks on GPUs too small for m (for whole-GPU shapes: every partly used GPU).
Weighted by how often each shape is asked for, F = Σ_m p_m · frag_m, in GPUs. A candidate
placement scores σ((F_before − F_after) / scale): the more fragment it removes (or the less it
adds), the better. This is the measure of Weng et al., "Beware of Fragmentation" (USENIX ATC '23),
restricted to what the extender sees: GPUs, not host CPU.

The shape mix is learned online from the GPU requests the extender is asked about
(``MixLearner``); its snapshot changes every ``refreshEvery`` requests so that cached
verdicts stay valid in between.

Pure; imports only numpy, pydantic, ``domain`` and ``policy.base``.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import Field

from scheduler_extender.domain import PodDemand
from scheduler_extender.policy.base import ArgsModel

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


K = TypeVar("K", bound=Hashable)


def commonest(counts: Counter[K], coverage: float) -> list[tuple[K, int]]:
    """The most common keys (ties: smaller key first) until they cover ``coverage`` of all."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    need = coverage * sum(counts.values())
    taken: list[tuple[K, int]] = []
    covered = 0
    for key, count in ranked:
        if covered >= need:
            break
        taken.append((key, count))
        covered += count
    return taken


class FragmentationArgs(ArgsModel):
    """``spec.fragmentation`` (ours)."""

    enabled: bool = Field(
        False,
        description="Score memoryFit by the fragmentation a placement leaves instead of best fit.",
    )
    window: int = Field(
        5000, gt=0, description="How many recent GPU requests the shape mix is learned from."
    )
    coverage: float = Field(
        0.95,
        gt=0,
        le=1,
        description="The most common shapes that cover this share of requests form the mix.",
    )
    refresh_every: int = Field(
        200,
        alias="refreshEvery",
        gt=0,
        description="Requests between two snapshots of the mix (cached verdicts last that long).",
    )
    scale_gpus: float = Field(
        1.0,
        alias="scaleGPUs",
        gt=0,
        description="Fragment change (GPUs) that moves the score from 0.5 to 0.73.",
    )


@dataclass(frozen=True, slots=True)
class DemandMix:
    """Shapes asked for and their frequencies (sum 1); ``version`` changes with every snapshot."""

    blocks: IntArray
    """Blocks on one GPU for a shared shape; 0 for a whole-GPU shape."""
    whole: IntArray
    """Whole GPUs for a whole-GPU shape; 0 for a shared one."""
    freq: FloatArray
    version: int

    @property
    def empty(self) -> bool:
        """No shape learned yet."""
        return self.freq.size == 0


EMPTY_MIX = DemandMix(
    blocks=np.zeros(0, dtype=np.int64),
    whole=np.zeros(0, dtype=np.int64),
    freq=np.zeros(0),
    version=0,
)


def demand_shape(demand: PodDemand) -> tuple[int, int]:
    """(blocks, whole GPUs) of a GPU demand; a whole-GPU demand has no block count."""
    if demand.needs_whole_gpu:
        return 0, demand.gpu_count
    return demand.mem_blocks, 0


class MixLearner:
    """Counts the shapes of the last ``window`` GPU requests; snapshots them now and then."""

    def __init__(self, args: FragmentationArgs) -> None:
        self.args = args
        self._recent: deque[tuple[int, int]] = deque(maxlen=args.window)
        self._since = 0
        self._mix = EMPTY_MIX

    @property
    def mix(self) -> DemandMix:
        """The snapshot in force."""
        return self._mix

    def observe(self, demand: PodDemand) -> None:
        """Count one pod's request; the caller counts each pod once (``remember_demand``)."""
        if not demand.wants_gpu:
            return
        self._recent.append(demand_shape(demand))
        self._since += 1
        if self._mix.empty or self._since >= self.args.refresh_every:
            self._mix = self.snapshot()
            self._since = 0

    def snapshot(self) -> DemandMix:
        """The most common shapes covering ``coverage`` of the window, renormalised."""
        taken = commonest(Counter(self._recent), self.args.coverage)
        freq = np.array([c for _, c in taken], dtype=np.float64)
        return DemandMix(
            blocks=np.array([s[0] for s, _ in taken], dtype=np.int64),
            whole=np.array([s[1] for s, _ in taken], dtype=np.int64),
            freq=freq / freq.sum() if freq.size else freq,
            version=self._mix.version + 1,
        )


def amount(free: IntArray, idle: BoolArray, capacity: IntArray, mix: DemandMix) -> FloatArray:
    """Fragment (GPUs) of node states: free blocks (..., G), idle GPUs (..., G), capacity (..., G).

    A slot without a GPU has capacity 0 and adds nothing.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(capacity > 0, free / capacity, 0.0)  # (..., G) in GPUs
    total = share.sum(axis=-1)  # (...)
    b = mix.blocks[:, None]  # (M, 1)
    shared = mix.whole == 0  # (M,)
    big = np.where(shared[:, None], free[..., None, :] >= b, idle[..., None, :])  # (..., M, G)
    hosts = big.sum(axis=-1) >= np.where(shared, 1, mix.whole)  # (..., M)
    small = np.where(big, 0.0, share[..., None, :]).sum(axis=-1)  # (..., M)
    per_shape = np.where(hosts, small, total[..., None])
    out: FloatArray = per_shape @ mix.freq
    return out


def sigmoid(x: FloatArray) -> FloatArray:
    """The logistic function."""
    out: FloatArray = 1.0 / (1.0 + np.exp(-x))
    return out


def score(
    free: IntArray,
    idle: BoolArray,
    capacity: IntArray,
    usable: BoolArray,
    demand: PodDemand,
    mix: DemandMix,
    args: FragmentationArgs,
) -> FloatArray:
    """Per GPU slot (N, G): σ(fragment removed / scale) if the pod takes this slot.

    A shared demand takes its blocks from that one slot. A whole-GPU demand takes ``gpu_count``
    idle GPUs and every idle GPU is alike, so all usable slots of a node score the same.
    Slots that are not ``usable`` score 0.
    """
    n, g = free.shape
    before = amount(free, idle, capacity, mix)  # (N,)
    if demand.needs_whole_gpu:
        k = demand.gpu_count
        # Take the first k usable idle slots: which ones does not change the fragment.
        rank = np.cumsum(usable & idle, axis=1)
        taken = usable & idle & (rank <= k)
        after = amount(np.where(taken, 0, free), idle & ~taken, capacity, mix)
        delta = np.broadcast_to((before - after)[:, None], (n, g))
    else:
        eye = np.eye(g, dtype=np.bool_)
        taken = np.broadcast_to(eye[None], (n, g, g))  # (N, slot taken, G)
        free_after = np.where(taken, free[:, None, :] - demand.mem_blocks, free[:, None, :])
        idle_after = idle[:, None, :] & ~taken
        after = amount(
            np.maximum(free_after, 0),
            idle_after,
            np.broadcast_to(capacity[:, None, :], taken.shape),
            mix,
        )  # (N, G)
        delta = before[:, None] - after
    out: FloatArray = np.where(usable, sigmoid(delta / args.scale_gpus), 0.0)
    return out
