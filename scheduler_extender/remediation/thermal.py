"""Thermal migration, pure: which pods to evict from GPUs hot for longer than ``migrateAfter``.

One pod per hot GPU per ``migrateAfter``: the lowest QoS class, the most recently placed of
those. The GPU then has ``migrateAfter`` to cool before the next one goes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler_extender.domain import Assignment
from scheduler_extender.policy.rules.thermal import ThermalArgs

GpuKey = tuple[str, int]
"""(node, GPU index)."""


@dataclass(frozen=True, slots=True)
class HotGpu:
    """A GPU at or above maxTemp, and for how long."""

    node: str
    index: int
    hot_for_s: float


@dataclass(frozen=True, slots=True)
class Eviction:
    """A pod to move off a hot GPU, and why (said in the log)."""

    pod: Assignment
    gpu: GpuKey
    reason: str


def evictions(
    hot: Sequence[HotGpu],
    pods: Mapping[str, Sequence[Assignment]],
    args: ThermalArgs,
    last_evicted: Mapping[GpuKey, float],
    now: float,
) -> list[Eviction]:
    """The evictions due now. ``last_evicted``: when each GPU last had a pod evicted."""
    out = []
    for gpu in hot:
        key = (gpu.node, gpu.index)
        if gpu.hot_for_s <= args.migrate_after_s:
            continue
        if now - last_evicted.get(key, -float("inf")) < args.migrate_after_s:
            continue  # the last eviction's pod is still leaving; give the GPU time to cool
        on_gpu = [a for a in pods.get(gpu.node, ()) if gpu.index in a.gpu_indices]
        if not on_gpu:
            continue
        pod = min(on_gpu, key=lambda a: (a.qos, -a.assigned_at))
        out.append(
            Eviction(
                pod,
                key,
                f"gpu {gpu.index} of node {gpu.node} at or above {args.max_temp_c:g} °C for "
                f"{gpu.hot_for_s:.0f} s (migrateAfter {args.migrate_after_s:g} s); "
                f"{pod.qos.wire} is the lowest class on it",
            )
        )
    return out
