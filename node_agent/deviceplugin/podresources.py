"""Which containers kubelet has given devices, from its PodResources API (v1, List).

After the agent restarts it no longer knows which pending pods it matched; kubelet does. Its
answer is also the truth about which GPU's blocks each pod holds, which the agent reports.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from node_agent.deviceplugin import podresources_pb2, podresources_pb2_grpc

log = logging.getLogger("node_agent.deviceplugin")

TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class PodDevices:
    """One pod's devices of one resource, as kubelet gave them."""

    namespace: str
    name: str
    containers: tuple[tuple[str, ...], ...]
    """The device IDs of each container that holds any, in kubelet's order (none while
    kubelet is still admitting the pod)."""


Listing = Callable[[], Awaitable[list[PodDevices] | None]]
"""The pods kubelet lists, with their devices of the resource; None when kubelet could not be
asked. kubelet lists a pod from the start of its admission, before any device is given."""

Held = Callable[[], Awaitable[dict[str, int] | None]]
"""Per pod kubelet lists (``namespace/name``), how many of its containers hold devices of the
resource (0 for a pod being admitted); None when kubelet could not be asked."""


def pod_devices(socket: Path, resource: str, *, quiet: bool = False) -> Listing:
    """The lookup of pods holding ``resource`` devices, through kubelet's ``socket``.

    One List call per lookup. ``quiet``: a failure is logged at debug level only (the caller
    says once that kubelet cannot be asked).
    """

    async def listing() -> list[PodDevices] | None:
        try:
            async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
                stub = podresources_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
                answer = await stub.List(
                    podresources_pb2.ListPodResourcesRequest(), timeout=TIMEOUT_S
                )
        except grpc.aio.AioRpcError as exc:
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "kubelet's pod resources at %s: %s",
                socket,
                exc.details() or exc.code(),
            )
            return None
        out = []
        for pod in answer.pod_resources:
            containers = tuple(
                ids
                for c in pod.containers
                if (
                    ids := tuple(
                        i for d in c.devices if d.resource_name == resource for i in d.device_ids
                    )
                )
            )
            out.append(PodDevices(pod.namespace, pod.name, containers))
        return out

    return listing


def holders(socket: Path, resource: str) -> Held:
    """The lookup of containers holding ``resource`` devices, through kubelet's ``socket``."""
    listing = pod_devices(socket, resource)

    async def held() -> dict[str, int] | None:
        pods = await listing()
        if pods is None:
            return None
        out: dict[str, int] = {}
        for p in pods:  # a pod going and its same-name successor: the one holding more
            key = f"{p.namespace}/{p.name}"
            out[key] = max(out.get(key, 0), len(p.containers))
        return out

    return held
