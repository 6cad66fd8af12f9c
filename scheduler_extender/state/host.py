"""Host CPU and memory per node: allocatable (from Node objects) less what bound pods request.

Fragmentation scoring needs to know which nodes can still feed their idle GPUs with CPU and
memory. kube-scheduler keeps the same sums for its NodeResourcesFit; the extender keeps its own
from the Node and Pod watches and from its own binds. Imports nothing from the project.
"""

from __future__ import annotations

import math


class HostLedger:
    """Allocatable and requested host CPU (millicores) and memory (MiB) per node."""

    def __init__(self) -> None:
        self._allocatable: dict[str, tuple[float, float]] = {}
        self._pods: dict[str, tuple[str, int, int]] = {}
        self._requested: dict[str, list[int]] = {}
        """Per node: requested CPU, requested memory, and how many pods ask them."""

    def set_allocatable(self, node: str, cpu_milli: float, memory_mib: float) -> bool:
        """A node's allocatable CPU and memory (NaN = unknown); True if it changed."""
        new = (cpu_milli, memory_mib)
        old = self._allocatable.get(node)
        self._allocatable[node] = new
        return old is None or any(
            not (a == b or (math.isnan(a) and math.isnan(b))) for a, b in zip(old, new, strict=True)
        )

    def forget_node(self, node: str) -> None:
        """A node left: its allocatable is unknown again (its pods go with their own events)."""
        self._allocatable.pop(node, None)

    def place(self, pod_uid: str, node: str, cpu_milli: int, memory_mib: int) -> set[str]:
        """A pod runs (or is bound) on ``node`` with these requests; the nodes whose sums moved."""
        entry = (node, cpu_milli, memory_mib)
        old = self._pods.get(pod_uid)
        if old == entry:
            return set()
        changed = self._take_out(pod_uid)
        self._pods[pod_uid] = entry
        sums = self._requested.setdefault(node, [0, 0, 0])
        sums[0] += cpu_milli
        sums[1] += memory_mib
        sums[2] += 1
        return changed | {node}

    def remove(self, pod_uid: str) -> set[str]:
        """A pod ended or was deleted; the nodes whose sums moved."""
        return self._take_out(pod_uid)

    def _take_out(self, pod_uid: str) -> set[str]:
        old = self._pods.pop(pod_uid, None)
        if old is None:
            return set()
        node, cpu, memory = old
        sums = self._requested[node]
        sums[0] -= cpu
        sums[1] -= memory
        sums[2] -= 1
        if sums[2] == 0:  # a pod that asks for nothing is still one of the node's pods
            del self._requested[node]
        return {node}

    def free(self, node: str) -> tuple[float, float]:
        """Allocatable less requested (CPU millicores, memory MiB); NaN where unknown."""
        cpu, memory = self._allocatable.get(node, (math.nan, math.nan))
        used = self._requested.get(node, (0, 0))
        return cpu - used[0], memory - used[1]
