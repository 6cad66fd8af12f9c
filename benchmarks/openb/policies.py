"""The FGD paper's baselines, re-implemented from its simulator's score plugins.

Every scorer maps (node states, one pod shape) to an integer score per node on 0..100 (higher
wins) and the GPU slots the pod would get there. Scores depend only on the node's own state
and the pod's shape, so the replay keeps them per (shape, node) until the node changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from benchmarks.openb import frag
from benchmarks.openb.trace import MAX_GPUS, MILLI, Shape
from scheduler_extender.policy.rules.fragmentation import sigmoid

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

MAX_SPEC_CPU = 128_000
"""The simulator's "max node" CPU (milli-cores), used to normalise."""
MAX_SPEC_GPU = 8 * MILLI
"""The simulator's "max node" GPU (milli-GPU)."""
MAX_SCORE = 100
TAGS = MAX_GPUS + 1
"""GpuClustering's pod tags: 0 = sharing, k = k whole GPUs."""


@dataclass(frozen=True, slots=True)
class View:
    """Node states of some rows: free CPU, free milli-GPU per slot, model, GPU count."""

    cpu: IntArray
    gpu: IntArray
    model: IntArray
    gpus: IntArray
    frag: FloatArray
    """Frag amount of each row now (FGD's "before")."""
    tags: IntArray
    """(rows, TAGS): how many pods of each GpuClustering tag the node holds."""


class Scorer(Protocol):
    """One score plugin plus the GPU choice its Reserve step makes."""

    def score(self, view: View, shape: Shape) -> tuple[FloatArray, IntArray]:
        """(score per row, (rows, max(num, 1)) GPU slots; -1 for a CPU-only pod)."""
        ...

    def normalize(self, scores: FloatArray) -> FloatArray:
        """Scores of the feasible nodes after the plugin's NormalizeScore (if it has one)."""
        ...


def trunc(x: FloatArray) -> FloatArray:
    """Go's int64(float64): toward zero."""
    out: FloatArray = np.trunc(x)
    return out


def least_free(gpu: IntArray, shape: Shape) -> IntArray:
    """The ``num`` fitting slots with the least free milli-GPU (ties: lowest index).

    For whole-GPU pods every fitting slot is fully free, so this is the lowest-index free GPUs.
    """
    k = max(shape.num, 1)
    if not shape.wants_gpu:
        return np.full((gpu.shape[0], 1), -1, dtype=np.int64)
    key = np.where(gpu >= shape.milli, gpu, 10 * MILLI)
    out: IntArray = np.argsort(key, axis=1, kind="stable")[:, :k]
    return out


def take(gpu: IntArray, slots: IntArray, milli: int) -> IntArray:
    """Free milli-GPU after taking ``milli`` from each of ``slots`` (rows, k)."""
    after = gpu.copy()
    rows = np.arange(gpu.shape[0])[:, None]
    valid = slots >= 0
    np.subtract.at(after, (np.broadcast_to(rows, slots.shape)[valid], slots[valid]), milli)
    return after


class _Plain:
    """Base for plugins without NormalizeScore."""

    def normalize(self, scores: FloatArray) -> FloatArray:
        return scores


class DotProd(_Plain):
    """Tetris-style dot product, ``-dimext merge -norm max``; the *smallest* product wins."""

    name = "dotprod"

    def score(self, view: View, shape: Shape) -> tuple[FloatArray, IntArray]:
        node_cpu = view.cpu / MAX_SPEC_CPU
        node_gpu = view.gpu.sum(axis=1) / MAX_SPEC_GPU
        dot = node_cpu * (shape.cpu / MAX_SPEC_CPU) + node_gpu * (shape.total / MAX_SPEC_GPU)
        score = trunc(MAX_SCORE * (1.0 - dot / 2))
        score = np.where(view.cpu < shape.cpu, 0.0, score)
        return score, least_free(view.gpu, shape)


class BestFit:
    """Least leftover CPU and GPU (equal weights), min-max rescaled over feasible nodes."""

    name = "bestfit"

    def score(self, view: View, shape: Shape) -> tuple[FloatArray, IntArray]:
        left = (
            0.5 * (view.cpu - shape.cpu) / MAX_SPEC_CPU
            + 0.5 * (view.gpu.sum(axis=1) - shape.total) / MAX_SPEC_GPU
        )
        return trunc((1.0 - left) * MAX_SCORE), least_free(view.gpu, shape)

    def normalize(self, scores: FloatArray) -> FloatArray:
        hi, lo = scores.max(), scores.min()
        if hi == lo:
            return np.zeros_like(scores)
        out: FloatArray = (scores - lo) * MAX_SCORE // (hi - lo)
        return out


class GpuPacking(_Plain):
    """Three tiers: onto shared GPUs (fullest first), onto free GPUs of a used node, idle nodes."""

    name = "packing"

    def score(self, view: View, shape: Shape) -> tuple[FloatArray, IntArray]:
        slots = least_free(view.gpu, shape)
        if not shape.wants_gpu:
            return np.zeros(view.cpu.shape[0]), slots
        full = (view.gpu == MILLI).sum(axis=1)
        chosen = np.take_along_axis(view.gpu, slots, axis=1)
        fully_used = (chosen == MILLI).sum(axis=1)
        ratio = (chosen * 100 // MILLI).sum(axis=1)
        tier1 = np.maximum(MAX_SCORE - ratio // 10, MAX_SCORE // 2)
        tier2 = np.maximum(MAX_SCORE // 2 - fully_used, MAX_SCORE // 3)
        tier3 = np.maximum(MAX_SCORE // 3 - full, full)
        score = np.where(full == view.gpus, tier3, np.where(fully_used > 0, tier2, tier1))
        return score.astype(np.float64), slots


def cluster_tag(shape: Shape) -> int:
    """GpuClustering's tag of a pod: 0 sharing, k for k whole GPUs, -1 CPU-only."""
    if not shape.wants_gpu:
        return -1
    return 0 if shape.sharing else shape.num


class GpuClustering(_Plain):
    """Keep pods of one kind (sharing, k-GPU) together; fuller nodes first within a tier."""

    name = "clustering"

    def score(self, view: View, shape: Shape) -> tuple[FloatArray, IntArray]:
        slots = least_free(view.gpu, shape)
        tag = cluster_tag(shape)
        if tag < 0:
            return np.zeros(view.cpu.shape[0]), slots
        held = view.tags > 0
        kinds = held.sum(axis=1)
        mine = held[:, tag]
        base = np.select([mine & (kinds == 1), mine, kinds == 0], [75, 50, 25], default=0).astype(
            np.int64
        )
        fill = (MAX_SCORE // 4) * (MAX_SPEC_GPU - view.gpu.sum(axis=1)) // MAX_SPEC_GPU
        return (base + fill).astype(np.float64), slots


class Fgd(_Plain):
    """Fragmentation gradient descent: the placement that grows the node's frag the least."""

    name = "fgd"

    def __init__(self, model: frag.FragModel) -> None:
        self.model = model

    def score(self, view: View, shape: Shape) -> tuple[FloatArray, IntArray]:
        cpu_after = view.cpu - shape.cpu
        if shape.sharing:
            n, g = view.gpu.shape
            eye = np.eye(g, dtype=np.int64) * shape.milli
            after = view.gpu[:, None, :] - eye[None, :, :]  # (rows, G, G): slot i taken
            fits = view.gpu >= shape.milli
            f_after = frag.amount(
                np.broadcast_to(cpu_after[:, None], (n, g)),
                after,
                np.broadcast_to(view.model[:, None], (n, g)),
                self.model,
            )
            per_slot = trunc(MAX_SCORE * sigmoid((view.frag[:, None] - f_after) / MILLI))
            per_slot = np.where(fits, per_slot, -1.0)
            best = np.argmax(per_slot, axis=1)  # first maximum: lowest index on ties
            return per_slot[np.arange(n), best], best[:, None]
        slots = least_free(view.gpu, shape)
        after = take(view.gpu, slots, shape.milli)
        f_after = frag.amount(cpu_after, after, view.model, self.model)
        return trunc(MAX_SCORE * sigmoid((view.frag - f_after) / MILLI)), slots


BASELINES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd")
