"""The devices kubelet is told of: one per memory block per GPU, named ``<GPU uuid>::<k>``.

The GPUs as the agent advertises them, the pods the extender placed on this node, how a block
names its GPU, which pods hold which GPU's blocks, the device nodes an AMD or Intel GPU needs,
and the choice of blocks on one GPU. Imports the standard library, ``podresources`` and
``model``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from node_agent.deviceplugin.podresources import PodDevices
from node_agent.model import GpuHolder


@dataclass(frozen=True, slots=True)
class GpuBlocks:
    """One GPU as kubelet is told of it."""

    uuid: str
    blocks: int
    healthy: bool
    lent: int = 0
    """Idle blocks of its pods the extender lets best-effort pods borrow, advertised besides."""
    device_nodes: tuple[str, ...] = ()
    """An AMD or Intel GPU's device nodes, given to the container; empty for NVIDIA (the
    container runtime reads ``NVIDIA_VISIBLE_DEVICES``)."""


@dataclass(frozen=True, slots=True)
class Assigned:
    """A pod the extender placed on this node, and the GPU it chose."""

    uid: str
    namespace: str
    name: str
    gpu_uuid: str
    blocks: int
    assigned_at: float
    phase: str | None
    containers: tuple[int, ...] = ()
    """Blocks each container asks for (kubelet allocates per container); empty: ``blocks``."""


Lookup = Callable[[], Awaitable[list[Assigned] | None]]
"""The GPU assignments on this node from the extender; None when no extender answered."""


def device_id(uuid: str, k: int) -> str:
    """The device kubelet sees for block ``k`` of a GPU."""
    return f"{uuid}::{k}"


def device_nodes(
    vendor: str, pci_bus_id: str | None, sys_root: Path = Path("/sys")
) -> tuple[str, ...]:
    """The device nodes a container needs for one AMD or Intel GPU; empty when not found.

    Its DRM card and render nodes, as sysfs lists them under its PCI device, and for AMD the
    compute interface ``/dev/kfd`` that every AMD GPU shares.
    """
    if not pci_bus_id:
        return ()
    drm = sys_root / "bus" / "pci" / "devices" / pci_bus_id.lower() / "drm"
    try:
        names = sorted(e.name for e in drm.iterdir() if e.name.startswith(("card", "renderD")))
    except OSError:
        return ()
    if not names:
        return ()
    nodes = tuple(f"/dev/dri/{name}" for name in names)
    return ("/dev/kfd", *nodes) if vendor == "amd" else nodes


def lent_device_id(uuid: str, k: int) -> str:
    """The device kubelet sees for the ``k``-th idle block a GPU lends."""
    return f"{uuid}::lent-{k}"


def gpu_of(device: str) -> str:
    """The GPU uuid a block device belongs to."""
    return device.rsplit("::", 1)[0]


def gpu_holders(pods: Iterable[PodDevices]) -> list[GpuHolder]:
    """Which GPU's blocks each pod holds, from kubelet's record of the devices it gave.

    A pod's blocks of one GPU are counted once each (an init container's blocks are given
    again to the app container); a pod holding blocks of two GPUs is listed once per GPU.
    Sorted by namespace, pod and GPU.
    """
    held: dict[tuple[str, str, str], set[str]] = {}
    for pod in pods:
        for ids in pod.containers:
            for device in ids:
                held.setdefault((pod.namespace, pod.name, gpu_of(device)), set()).add(device)
    return [GpuHolder(ns, name, gpu, len(ids)) for (ns, name, gpu), ids in sorted(held.items())]


def preferred(
    available: Sequence[str], must: Sequence[str], size: int, target: str | None
) -> list[str]:
    """``size`` blocks, all on one GPU where possible; linear in the number of IDs.

    The GPU of ``must`` if given, else ``target`` (the extender's choice) if it has room, else
    the GPU that fits most tightly.
    """
    by_gpu: dict[str, list[str]] = {}
    for device in available:
        by_gpu.setdefault(gpu_of(device), []).append(device)
    if must:
        gpu = gpu_of(must[0])
    elif target is not None and len(by_gpu.get(target, ())) >= size:
        gpu = target
    else:
        fits = [g for g, ds in by_gpu.items() if len(ds) >= size]
        gpu = min(fits, key=lambda g: (len(by_gpu[g]), g)) if fits else ""
    chosen: dict[str, None] = {}  # ordered, and membership in constant time
    for device in (*must, *by_gpu.get(gpu, ()), *available):
        # The chosen GPU's blocks; not enough on one GPU: kubelet will refuse or spread anyway.
        if len(chosen) >= size:
            break
        chosen.setdefault(device)
    return list(chosen)
