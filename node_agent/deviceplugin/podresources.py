"""Which containers kubelet has given devices already, from its PodResources API (v1, List).

After the agent restarts it no longer knows which pending pods it matched; kubelet does.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from node_agent.deviceplugin import podresources_pb2, podresources_pb2_grpc

log = logging.getLogger("node_agent.deviceplugin")

TIMEOUT_S = 1.0

Held = Callable[[], Awaitable[dict[str, int] | None]]
"""Per pod (``namespace/name``), how many of its containers hold devices of the resource;
None when kubelet could not be asked."""


def holders(socket: Path, resource: str) -> Held:
    """The lookup of containers holding ``resource`` devices, through kubelet's ``socket``."""

    async def held() -> dict[str, int] | None:
        try:
            async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
                stub = podresources_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
                answer = await stub.List(
                    podresources_pb2.ListPodResourcesRequest(), timeout=TIMEOUT_S
                )
        except grpc.aio.AioRpcError as exc:
            log.warning("kubelet's pod resources at %s: %s", socket, exc.details() or exc.code())
            return None
        out: dict[str, int] = {}
        for pod in answer.pod_resources:
            count = sum(
                1
                for c in pod.containers
                if any(d.resource_name == resource and d.device_ids for d in c.devices)
            )
            if count:
                out[f"{pod.namespace}/{pod.name}"] = count
        return out

    return held
