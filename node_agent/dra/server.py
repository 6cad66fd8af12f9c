"""The DRA plugin's gRPC server: its registration with kubelet and the DRAPlugin service.

kubelet watches its ``plugins_registry`` folder; for a new socket there it asks ``GetInfo``
(type ``DRAPlugin``, the driver's name, the services it speaks) and says with
``NotifyRegistrationStatus`` whether it took the plugin. The info names no endpoint of its own,
so kubelet calls the DRAPlugin service on the same socket: one path, whatever mount namespace
the agent and kubelet see it from. A kubelet restart finds the socket again and registers it
once more. Imports grpc, the generated APIs and ``plugin``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc

from node_agent.deviceplugin.server import sleep_or_stop
from node_agent.dra import dra_pb2_grpc, health_pb2_grpc, registration_pb2, registration_pb2_grpc
from node_agent.dra.health import DeviceHealth
from node_agent.dra.plugin import DRIVER, DraPlugin

log = logging.getLogger("node_agent.dra")

SERVICE = "v1.DRAPlugin"
"""The service kubelet calls, as it names it in the registration's versions."""
HEALTH = "v1alpha1.DRAResourceHealth"
"""The device health service, named the same way."""


class _Registration(registration_pb2_grpc.RegistrationServicer):
    def __init__(self, on_status: Any, services: list[str]) -> None:
        self._on_status = on_status
        self._services = services

    async def GetInfo(
        self, request: registration_pb2.InfoRequest, context: Any
    ) -> registration_pb2.PluginInfo:
        return registration_pb2.PluginInfo(
            type="DRAPlugin", name=DRIVER, endpoint="", supported_versions=self._services,
        )  # fmt: skip

    async def NotifyRegistrationStatus(
        self, request: registration_pb2.RegistrationStatus, context: Any
    ) -> registration_pb2.RegistrationStatusResponse:
        self._on_status(request.plugin_registered, request.error)
        return registration_pb2.RegistrationStatusResponse()


class DraServer:
    """Serves the plugin and its registration socket until stopped; no error ends the agent."""

    def __init__(
        self,
        plugin: DraPlugin,
        registry_dir: Path = Path("/var/lib/kubelet/plugins_registry"),
        *,
        health: DeviceHealth | None = None,
        poll_s: float = 1.0,
    ) -> None:
        """``health``: the device health service, served on the same socket when given."""
        self.plugin = plugin
        self.health = health
        self.socket = registry_dir / f"{DRIVER}.sock"
        self.poll_s = poll_s
        self.registered: bool | None = False
        """Whether kubelet took the plugin, as it last said."""

    def _status(self, registered: bool, error: str) -> None:
        if registered:
            log.info("kubelet registered the DRA plugin %s (%s)", DRIVER, self.socket)
        else:
            log.error("kubelet refused the DRA plugin %s: %s", DRIVER, error)
        self.registered = registered

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop``; start again when the socket is removed."""
        while not stop.is_set():
            try:
                await self._serve(stop)
            except Exception as exc:  # a folder it cannot write, a path too long for a socket
                log.error("DRA plugin on %s: %s; trying again", self.socket, exc)
                await sleep_or_stop(stop, max(self.poll_s, 5.0))
        self.registered = False
        self.socket.unlink(missing_ok=True)

    async def _serve(self, stop: asyncio.Event) -> None:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        dra_pb2_grpc.add_DRAPluginServicer_to_server(self.plugin, server)  # type: ignore[no-untyped-call]
        registration_pb2_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
            _Registration(self._status, [SERVICE, HEALTH] if self.health else [SERVICE]), server
        )
        if self.health is not None:
            health_pb2_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
                self.health, server
            )
        self.socket.unlink(missing_ok=True)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        try:
            while not stop.is_set() and self.socket.exists():
                await sleep_or_stop(stop, self.poll_s)
            if not stop.is_set():
                log.warning("the DRA plugin's socket was removed: serving again")
                self.registered = False
        finally:
            await server.stop(grace=0.5)
