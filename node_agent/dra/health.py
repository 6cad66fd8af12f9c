"""kubelet's DRA device health service: each GPU's health, streamed into its pods' status.

kubelet (``ResourceHealthStatus``, beta and on in 1.36) keeps one ``NodeWatchResources`` stream
open to the plugin and writes what it hears into the ``allocatedResourcesStatus`` of the
containers that hold the device. A GPU's health changes are sent at once, and all of them again
every ``PERIOD_S``, stamped with the time of the sample they come from: a device whose last
sample is older than ``TIMEOUT_S`` reads Unknown, as it should when the agent has stopped
sampling. Imports grpc, the generated API and the standard library.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from node_agent.dra import health_pb2, health_pb2_grpc
from scheduler_extender.names import dra_device_name

Health = tuple[float, dict[str, tuple[bool, str]]]
"""When the GPUs were last sampled (wall clock) and, by uuid, whether each is healthy, and why
not."""

PERIOD_S = 10.0
TIMEOUT_S = 30


class DeviceHealth(health_pb2_grpc.DRAResourceHealthServicer):
    """The node's GPUs' health, as ``health()`` says."""

    def __init__(
        self,
        pool: str,
        health: Callable[[], Health],
        *,
        poll_s: float = 1.0,
        period_s: float = PERIOD_S,
        timeout_s: int = TIMEOUT_S,
    ) -> None:
        """``timeout_s``: how old a sample may be before kubelet reads Unknown.

        A few of the agent's sampling intervals.
        """
        self.pool = pool
        self.timeout_s = timeout_s
        self._health = health
        self._poll_s = poll_s
        self._period_s = period_s

    def _response(self, sampled: Health) -> health_pb2.NodeWatchResourcesResponse:
        at, now = sampled
        stamp = int(at)
        return health_pb2.NodeWatchResourcesResponse(
            devices=[
                health_pb2.DeviceHealth(
                    device=health_pb2.DeviceIdentifier(
                        pool_name=self.pool, device_name=dra_device_name(uuid)
                    ),
                    health=health_pb2.HEALTHY if ok else health_pb2.UNHEALTHY,
                    last_updated_time=stamp,
                    health_check_timeout_seconds=self.timeout_s,
                    message=why,
                )
                for uuid, (ok, why) in sorted(now.items())
            ]
        )

    async def NodeWatchResources(
        self, request: health_pb2.NodeWatchResourcesRequest, context: Any
    ) -> AsyncIterator[health_pb2.NodeWatchResourcesResponse]:
        """Every GPU's health now, then each change, and all of it every ``period_s``."""
        last: dict[str, tuple[bool, str]] | None = None
        sent = 0.0
        while True:
            sampled = self._health()
            now = sampled[1]
            if now and (now != last or time.monotonic() - sent >= self._period_s):
                yield self._response(sampled)
                last, sent = now, time.monotonic()
            await asyncio.sleep(self._poll_s)
