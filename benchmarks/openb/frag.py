"""The FGD paper's fragmentation measure (``NodeGpuShareFragAmount``), for many node states.

A node with free CPU C, free milli-GPU g_1..g_k and model t, against a typical pod m (CPU c_m,
milli per GPU r_m, GPU count n_m, accepted models T_m, frequency p_m):

- m asks for no GPU, or t ∉ T_m: every idle milli-GPU is fragment (Σ g);
- at least n_m GPUs have g_i ≥ r_m and C ≥ c_m: only the GPUs too small for m, Σ{g_i < r_m};
- otherwise (m lacks GPU, CPU or both): Σ g.

F = Σ_m p_m · frag(m). Memory is not part of the measure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from benchmarks.openb.trace import MAX_GPUS, MILLI, Nodes, Pods, TypicalPods

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class FragModel:
    """Typical pods as arrays, ready for ``amount``."""

    cpu: IntArray
    milli: IntArray
    num: IntArray
    freq: FloatArray
    access: BoolArray
    """(models, M): may typical pod m use a GPU of each model."""

    @classmethod
    def build(cls, typical: TypicalPods, pods: Pods, nodes: Nodes) -> FragModel:
        """Arrays for ``typical``, with model access resolved against the cluster's models."""
        shapes = typical.shapes
        access = np.ones((len(nodes.models), len(shapes)), dtype=np.bool_)
        for m, shape in enumerate(shapes):
            accepted = pods.specs[shape.spec]
            if accepted:
                access[:, m] = [model in accepted for model in nodes.models]
        return cls(
            cpu=np.array([s.cpu for s in shapes], dtype=np.int64),
            milli=np.array([s.milli for s in shapes], dtype=np.int64),
            num=np.array([s.num for s in shapes], dtype=np.int64),
            freq=typical.freq,
            access=access,
        )


def amount(cpu: IntArray, gpu: IntArray, model: IntArray, fm: FragModel) -> FloatArray:
    """Frag amount (milli-GPU) of each node state: cpu (...,), gpu (..., G), model (...,).

    Absent GPU slots hold 0 free and so add nothing.
    """
    total = gpu.sum(axis=-1)  # (...)
    g = gpu[..., None, :]  # (..., 1, G)
    r = fm.milli[:, None]  # (M, 1)
    big = g >= r  # (..., M, G)
    hosts = (big.sum(axis=-1) >= fm.num) & (cpu[..., None] >= fm.cpu)
    hosts &= fm.access[model] & (fm.milli > 0)
    small = np.where(big, 0, g).sum(axis=-1)  # (..., M)
    per_pod = np.where(hosts, small, total[..., None])
    out: FloatArray = per_pod @ fm.freq
    return out


def node_states(nodes: Nodes) -> tuple[IntArray, IntArray]:
    """Free CPU and per-slot free milli-GPU of the empty cluster."""
    slots = np.arange(MAX_GPUS)[None, :] < nodes.gpus[:, None]
    return nodes.cpu.copy(), np.where(slots, MILLI, 0).astype(np.int64)
