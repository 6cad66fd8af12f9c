"""kubelet's DRA plugin for ``gpu.edgegpu.io``: prepares a claim's GPUs for its containers.

kubelet asks ``NodePrepareResources`` for the claims of a pod it is about to start, naming each
by namespace, name and uid only. The scheduler wrote the allocation (which of this node's GPUs,
how much memory) into the claim; the extender watches claims and lists this node's to its agent
(``/v1/nodes/{node}/claims``), so the node needs no credential for the API server. Each claim
gets a CDI spec file of its own: the container runtime (containerd 1.7 with CDI on, 2.x, CRI-O)
adds the GPU's environment and device nodes from it, the same the device plugin gives.
``NodeUnprepareResources`` removes the file. Both are idempotent: kubelet repeats them after
its restarts. Imports grpc, the generated API and the standard library.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node_agent.dra import dra_pb2, dra_pb2_grpc

log = logging.getLogger("node_agent.dra")

DRIVER = "gpu.edgegpu.io"
CDI_KIND = "edgegpu.io/gpu"
CDI_VERSION = "0.6.0"
_CDI_PREFIX = "edgegpu.io-gpu_"
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One device of an allocated claim, as the extender lists it."""

    request: str
    pool: str
    device: str
    gpu_uuid: str
    memory_mib: int | None
    """The memory the claim consumes of the GPU; None: all of it (the whole GPU)."""
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class AllocatedClaim:
    """A claim the scheduler allocated on this node, with its devices of our driver."""

    uid: str
    namespace: str
    name: str
    devices: tuple[ClaimDevice, ...]


ClaimLookup = Callable[[], Awaitable[dict[str, AllocatedClaim] | None]]
"""This node's allocated claims by uid, from the extenders; None when none answered."""


class DraPlugin(dra_pb2_grpc.DRAPluginServicer):
    """The DRAPlugin service (grpc.aio): CDI spec files for the claims kubelet prepares."""

    def __init__(
        self,
        lookup: ClaimLookup,
        cdi_dir: Path,
        device_nodes: Callable[[str], tuple[str, ...]] = lambda _uuid: (),
        gpus: Callable[[], set[str]] | None = None,
    ) -> None:
        """``device_nodes(uuid)``: an AMD or Intel GPU's device nodes; empty for NVIDIA.

        ``gpus()``: the uuids of this node's GPUs; a claim naming another is not prepared (None:
        not checked).
        """
        self._lookup = lookup
        self.cdi_dir = cdi_dir
        self._device_nodes = device_nodes
        self._gpus = gpus
        self.prepared = 0

    def spec_path(self, uid: str) -> Path:
        """The CDI spec file of one claim."""
        return self.cdi_dir / f"{_CDI_PREFIX}{uid}.json"

    async def NodePrepareResources(
        self, request: dra_pb2.NodePrepareResourcesRequest, context: Any
    ) -> dra_pb2.NodePrepareResourcesResponse:
        """Each claim's devices and their CDI ids; a claim that cannot be prepared says why."""
        out = dra_pb2.NodePrepareResourcesResponse()
        claims = await self._lookup() if request.claims else {}
        for claim in request.claims:
            answer = out.claims[claim.uid]
            where = f"claim {claim.namespace}/{claim.name} ({claim.uid})"
            if not _UID.fullmatch(claim.uid):
                answer.error = f"{where}: not a claim uid"
                continue
            if claims is None:
                answer.error = f"{where}: no extender answered: its allocation is not known yet"
                continue
            found = claims.get(claim.uid)
            if found is None or (found.namespace, found.name) != (claim.namespace, claim.name):
                answer.error = (f"{where}: no extender lists it as allocated on this node "
                                "(yet): kubelet will ask again")  # fmt: skip
                continue
            if not found.devices:
                answer.error = f"{where}: allocated no device of {DRIVER}"
                continue
            if len({_request(d.request) for d in found.devices}) > 1:
                # A container that names the whole claim would get every request's CDI
                # device, and each sets NVIDIA_VISIBLE_DEVICES: only one list would hold.
                answer.error = (f"{where}: more than one request of {DRIVER} in one claim is "
                                "not supported: ask one request with a count, or one claim per "
                                "request")  # fmt: skip
                continue
            mine = self._gpus() if self._gpus is not None else None
            foreign = [d.gpu_uuid for d in found.devices
                       if mine is not None and d.gpu_uuid not in mine]  # fmt: skip
            if foreign:
                answer.error = f"{where}: allocated {', '.join(foreign)}, no GPU of this node"
                continue
            try:
                ids = self._write_spec(found)
            except OSError as exc:
                answer.error = f"{where}: its CDI spec could not be written: {exc}"
                continue
            for d in found.devices:
                asked = _request(d.request)
                first = ids.pop(asked, None)
                answer.devices.append(
                    dra_pb2.Device(
                        request_names=[asked],
                        pool_name=d.pool,
                        device_name=d.device,
                        # One CDI device per request carries its every GPU (one variable names
                        # them all): kubelet gives it to the containers that name the request.
                        cdi_device_ids=[first] if first else [],
                        **({"share_id": d.share_id} if d.share_id else {}),
                    )
                )
            self.prepared += 1
            log.info("prepared %s: %s", where, ", ".join(
                f"{d.device} ({d.gpu_uuid}{f', {d.memory_mib} MiB' if d.memory_mib else ''})"
                for d in found.devices))  # fmt: skip
        return out

    async def NodeUnprepareResources(
        self, request: dra_pb2.NodeUnprepareResourcesRequest, context: Any
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        """Remove each claim's CDI spec (one already gone is fine)."""
        out = dra_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            answer = out.claims[claim.uid]
            if not _UID.fullmatch(claim.uid):
                answer.error = f"claim {claim.namespace}/{claim.name}: not a claim uid"
                continue
            try:
                self.spec_path(claim.uid).unlink(missing_ok=True)
            except OSError as exc:
                answer.error = f"claim {claim.namespace}/{claim.name}: {exc}"
                continue
            log.info("unprepared claim %s/%s (%s)", claim.namespace, claim.name, claim.uid)
        return out

    def _write_spec(self, claim: AllocatedClaim) -> dict[str, str]:
        """Write the claim's CDI spec (atomically): one CDI device per request of the claim.

        Returns each request's CDI device id.
        """
        by_request: dict[str, list[ClaimDevice]] = {}
        for d in claim.devices:
            by_request.setdefault(_request(d.request), []).append(d)
        cdi_devices = []
        ids = {}
        for request, devices in by_request.items():
            name = f"{claim.uid}-{request}"
            cdi_devices.append({"name": name, "containerEdits": self._edits(devices)})
            ids[request] = f"{CDI_KIND}={name}"
        spec = {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": cdi_devices}
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.cdi_dir, prefix=".tmp-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(spec, f)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.spec_path(claim.uid))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return ids

    def _edits(self, devices: list[ClaimDevice]) -> dict[str, Any]:
        """What a container gets for these GPUs: what the device plugin gives.

        The environment, and for AMD and Intel GPUs their device nodes.
        """
        uuids = [d.gpu_uuid for d in devices]
        env = {"EDGEGPU_GPU_UUID": ",".join(uuids)}
        nodes: list[str] = []
        for uuid in uuids:
            nodes += [n for n in self._device_nodes(uuid) if n not in nodes]
        if not nodes:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
        limits = [d.memory_mib for d in devices]
        if all(m is not None for m in limits):
            env["EDGEGPU_MEM_LIMIT_MIB"] = ",".join(str(m) for m in limits)
        edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(env.items())]}
        if nodes:
            edits["deviceNodes"] = [{"path": n} for n in nodes]
        return edits


def _request(name: str) -> str:
    """A result's request as the pod's containers name it.

    ``gpu/large`` (a subrequest of ``firstAvailable``) is ``gpu``.
    """
    return name.split("/", 1)[0]
