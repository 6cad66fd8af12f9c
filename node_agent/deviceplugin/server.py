"""The device plugin's gRPC server on its socket in kubelet's device-plugins folder.

It registers the plugin with kubelet, and serves and registers again whenever its socket
disappears or kubelet's socket is replaced (a kubelet restart removes every plugin socket).
Imports grpc, the generated API and ``plugin``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc

from node_agent.deviceplugin import api_pb2, api_pb2_grpc
from node_agent.deviceplugin.plugin import RESOURCE, BlockPlugin

log = logging.getLogger("node_agent.deviceplugin")

SOCKET = "edgegpu-gpu-mem-block.sock"
KUBELET_SOCKET = "kubelet.sock"
API_VERSION = "v1beta1"


class DevicePluginServer:
    """Serves a plugin on its socket in kubelet's device-plugins folder and registers it.

    Starts again and registers again whenever its socket disappears or kubelet's socket is
    replaced (a kubelet restart removes every plugin socket).
    """

    def __init__(
        self,
        plugin: BlockPlugin,
        folder: Path,
        *,
        resource: str = RESOURCE,
        socket: str = SOCKET,
        poll_s: float = 1.0,
    ) -> None:
        self.plugin = plugin
        self.folder = folder
        self.resource = resource
        self.socket = socket
        self.poll_s = poll_s
        self.registrations = 0

    @property
    def path(self) -> Path:
        """The plugin's socket."""
        return self.folder / self.socket

    def _kubelet_id(self) -> tuple[int, int] | None:
        try:
            st = (self.folder / KUBELET_SOCKET).stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    async def _register(self) -> None:
        target = f"unix://{self.folder / KUBELET_SOCKET}"
        async with grpc.aio.insecure_channel(target) as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket,
                    resource_name=self.resource,
                    options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=10.0,
            )
        self.registrations += 1
        log.info("registered %s with kubelet (%s)", self.resource, self.path)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve and stay registered until ``stop``; no error ends it (nor the agent)."""
        warned = False
        while not stop.is_set():
            kubelet = self._kubelet_id()
            if kubelet is None:
                if not warned:
                    log.warning("no kubelet socket in %s yet: waiting", self.folder)
                    warned = True
                await sleep_or_stop(stop, self.poll_s)
                continue
            warned = False
            try:
                await self._serve(stop, kubelet)
            except Exception as exc:  # a folder it cannot write, a path too long for a socket
                log.error("device plugin on %s: %s; trying again", self.path, exc)
                await sleep_or_stop(stop, max(self.poll_s, 5.0))
        self.path.unlink(missing_ok=True)

    async def _serve(self, stop: asyncio.Event, kubelet: tuple[int, int]) -> None:
        """One server's life: until kubelet restarts, our socket goes, or ``stop``."""
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.plugin, server)  # type: ignore[no-untyped-call]
        self.path.unlink(missing_ok=True)
        server.add_insecure_port(f"unix://{self.path}")
        await server.start()
        try:
            await self._register()
            while not stop.is_set() and self.path.exists() and self._kubelet_id() == kubelet:
                await sleep_or_stop(stop, self.poll_s)
            if not stop.is_set():
                log.warning("kubelet restarted (or our socket was removed): registering again")
        except grpc.aio.AioRpcError as exc:
            log.warning("registering with kubelet failed: %s; retrying", exc.details())
            await sleep_or_stop(stop, self.poll_s)
        finally:
            await server.stop(grace=0.5)


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less once ``stop`` is set."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        pass
