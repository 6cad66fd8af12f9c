"""Plain values the policy decides on: QoS classes, what a pod asks for, GPU health.

Imports nothing but the standard library; every other module may import this one.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

MAX_GPUS_PER_NODE = 64
"""Telemetry contract limits (``telemetry.schema``): GPUs a report may list, processes a GPU."""
MAX_PROCESSES_PER_GPU = 1024
MAX_HOLDERS_PER_NODE = 1024
"""Pods a report may list as holding a GPU's memory blocks (kubelet's default maxPods is 110)."""
MAX_BLOCKS_PER_HOLDER = 65_536
"""Memory blocks one pod may hold on one GPU in a report (the device plugin's cap on the device
IDs of one request)."""
MIN_BLOCK_MIB = 256
"""The smallest ``blockMiB``: the device plugin lists one device per block to kubelet in one
ListAndWatch message, and kubelet takes no gRPC message over 4 MiB; with smaller blocks a node
of large GPUs lists more devices than fit."""
MAX_BLOCK_MIB = 1_048_576
"""The largest ``blockMiB`` (1 TiB, more than any one GPU has; the agent follows no larger)."""
NAMESPACE_PATTERN = r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?$"
"""A Kubernetes namespace: a DNS label (63 characters at most)."""
POD_NAME_PATTERN = r"^[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?$"
"""A pod's name: a DNS subdomain (253 characters at most)."""
PRINTABLE_PATTERN = r"^[^\x00-\x1f\x7f]+$"
"""Text with no control characters (a GPU uuid, as the device plugin names its blocks)."""


def duplicate_holder(holders: Iterable[tuple[str, str, str]]) -> str | None:
    """Why a report's holders (namespace, pod name, GPU uuid) are refused; None when they are not.

    Each pod and GPU is listed once: the agent sums a pod's blocks of one GPU.
    """
    seen: set[tuple[str, str, str]] = set()
    for key in holders:
        if key in seen:
            return f"holder {key[0]}/{key[1]} of gpu {key[2]} appears twice"
        seen.add(key)
    return None


class QosClass(enum.IntEnum):
    """QoS classes, ordered: a larger value is a more important class."""

    BEST_EFFORT = 0
    INFERENCE = 1
    TRAINING = 2
    REALTIME = 3

    @property
    def wire(self) -> str:
        """The annotation value (``best-effort``, ``inference``, ...)."""
        return self.name.lower().replace("_", "-")

    @classmethod
    def from_wire(cls, value: str) -> QosClass:
        """Parse an annotation value; raises ``ValueError`` naming the allowed values."""
        for member in cls:
            if member.wire == value:
                return member
        allowed = ", ".join(m.wire for m in sorted(cls, reverse=True))
        raise ValueError(f"{value!r} is not a QoS class (one of: {allowed})")

    @property
    def packs(self) -> bool:
        """Low classes pack onto busy GPUs; high classes spread to cool, free ones."""
        return self <= QosClass.INFERENCE


class Health(enum.IntEnum):
    """GPU health as reported by the agent (telemetry ``health``)."""

    HEALTHY = 0
    DEGRADED = 1
    UNHEALTHY = 2

    @classmethod
    def from_wire(cls, value: str) -> Health:
        """Parse the telemetry value."""
        return cls[value.upper()]


@dataclass(frozen=True, slots=True)
class PodDemand:
    """What one pod asks of GPUs, read from its spec once per request.

    ``mem_blocks`` must fit on a single GPU; ``whole_gpus`` are GPUs nobody else uses.
    A pod asks for one kind or the other, never both.
    """

    uid: str
    namespace: str
    name: str
    qos: QosClass
    mem_blocks: int = 0
    whole_gpus: int = 0
    group: str | None = None
    priority: int = 0
    cpu_milli: int = 0
    """Host CPU the pod requests (millicores), as kube-scheduler counts it."""
    host_memory_mib: int = 0
    """Host memory the pod requests (MiB)."""
    through_claims: bool = False
    """The GPUs are asked through ResourceClaims of our DRA driver: the scheduler allocates
    which, and bind records none."""

    @property
    def wants_gpu(self) -> bool:
        """Whether the pod asks for any GPU resource at all."""
        return self.mem_blocks > 0 or self.whole_gpus > 0

    @property
    def needs_whole_gpu(self) -> bool:
        """Whole GPUs, or realtime: a realtime pod gets a GPU to itself (DESIGN.md §4)."""
        return self.whole_gpus > 0 or (self.qos is QosClass.REALTIME and self.mem_blocks > 0)

    @property
    def gpu_count(self) -> int:
        """How many GPUs the pod lands on."""
        return self.whole_gpus if self.whole_gpus > 0 else (1 if self.mem_blocks > 0 else 0)


@dataclass(frozen=True, slots=True)
class Assignment:
    """GPUs given to one pod at bind (or read back from its annotations)."""

    pod_uid: str
    namespace: str
    name: str
    node: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    mem_blocks: int
    whole: bool
    qos: QosClass
    group: str | None
    assigned_at: float
    """Wall-clock seconds since the epoch."""
