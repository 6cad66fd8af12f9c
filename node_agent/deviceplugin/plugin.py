"""The kubelet device plugin for ``edgegpu.io/gpu-mem-block`` (API v1beta1), served by the agent.

kubelet sees one device per memory block per GPU, named ``<GPU uuid>::<k>``, so it counts the
blocks per node and admits a pod only where they are free. The extender chose one GPU for each
pod at bind; ``GetPreferredAllocation`` steers kubelet to blocks of that GPU (the pending pod on
this node asking that many blocks, as the extender's ``/v1/nodes/{node}/assignments`` lists
them: the one kubelet's PodResources lists as being admitted, else the oldest assigned), and
``Allocate`` gives the container the GPU its blocks are on (``NVIDIA_VISIBLE_DEVICES``, or an
AMD or Intel GPU's device nodes) and the memory budget, only where that GPU is the one chosen at
bind: otherwise, or when the choice is not known, it fails and says why. The first
``ListAndWatch`` answer waits for the agent's first sample. A GPU the agent finds unhealthy has
its blocks marked Unhealthy in ``ListAndWatch`` and Healthy again when it recovers, with no
restart. Its server is ``server.DevicePluginServer``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from node_agent.deviceplugin import api_pb2, api_pb2_grpc
from node_agent.deviceplugin.devices import (
    Assigned,
    GpuBlocks,
    Lookup,
    device_id,
    gpu_of,
    lent_device_id,
    preferred,
)
from node_agent.deviceplugin.podresources import Held

log = logging.getLogger("node_agent.deviceplugin")

RESOURCE = "edgegpu.io/gpu-mem-block"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
LOOKUP_TIMEOUT_S = 2.0
"""How long admission may wait for the extender's assignments (then: no GPU to steer to, and
``Allocate`` fails)."""
SETTLE_S = 10.0
"""How long ``Allocate`` asks again for a pod no extender lists yet: a replica that did not bind
it learns of it from its watch, and a pod given its node by hand (no bind) is known to the
extenders only once their watch has seen it, which on a busy control plane (or just after a
replica restarted) can take seconds. Only such a pod waits this long."""
CLAIM_TTL_S = 600.0
"""A pod matched to an allocation is not matched again for this long (kubelet admits a pod
once; a pod whose allocation failed is failed, and its owner makes a new one)."""
OFFER_TTL_S = 30.0
"""How long a preferred allocation's match waits for its ``Allocate`` (kubelet sends it right
after, for the same container)."""
ADMITTING_S = 30.0
"""How long after kubelet first lists a pod this plugin takes it for one being admitted: its
admission asks for a preferred allocation and an allocation per container, each waiting on
the extenders' assignments (``LOOKUP_TIMEOUT_S``, ``SETTLE_S``). A pod listed longer without
blocks (its GPU on an init container, which kubelet's list leaves out) is not."""
MAX_OFFERS = 64
"""Matches kept for the ``Allocate`` calls to come (kubelet admits one container at a time)."""
MAX_REQUEST_IDS = 65_536
"""Device IDs one preferred allocation request may name in all (kubelet names at most the
node's)."""


@dataclass(frozen=True, slots=True)
class _Match:
    """What one container's request was matched to.

    A pending pod's container and its GPU, or why none.
    """

    size: int
    at: float
    pod: Assigned | None = None
    container: int = 0
    code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION
    why: str = ""


class BlockPlugin(api_pb2_grpc.DevicePluginServicer):
    """The DevicePlugin service (grpc.aio) over the agent's latest view of its GPUs."""

    def __init__(
        self,
        lookup: Lookup,
        block_mib: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
        held: Held | None = None,
        settle_s: float = 0.0,
    ) -> None:
        self._lookup = lookup
        self._held = held
        """kubelet's record of the containers given blocks already (survives our restarts)."""
        self._settle_s = settle_s
        """``SETTLE_S`` in the agent; 0 asks once."""
        self._block_mib = block_mib
        self._clock = clock
        self._gpus: tuple[GpuBlocks, ...] = ()
        self._advertised: frozenset[str] = frozenset()
        self._version = 0
        """0 until the agent's first sampling round: nothing is streamed before it."""
        self._changed = asyncio.Condition()
        self._claimed: dict[str, float] = {}
        self._offers: list[_Match] = []
        """Matches made by ``GetPreferredAllocation``, for the ``Allocate`` that follows."""
        self._listed_since: dict[str, float] = {}
        """When this plugin first saw kubelet list each pod it lists now."""
        self._given: dict[str, float] = {}
        """Devices given by an accepted ``Allocate``, and when (an init container's blocks
        are given again to the app container, with no preferred allocation before)."""

    async def update(self, gpus: Sequence[GpuBlocks]) -> None:
        """The GPUs as the agent reads them now: ``ListAndWatch`` streams a change at once."""
        new = tuple(gpus)
        if new == self._gpus and self._version:
            return
        for old, cur in zip(self._gpus, new, strict=False):
            if old.uuid == cur.uuid and old.healthy != cur.healthy:
                log.warning(
                    "gpu %s: blocks now %s", cur.uuid, HEALTHY if cur.healthy else UNHEALTHY
                )
        async with self._changed:
            self._gpus, self._version = new, self._version + 1
            self._advertised = frozenset(d.ID for d in self.devices())
            self._changed.notify_all()

    def devices(self) -> list[api_pb2.Device]:
        """Every block of every GPU, with its GPU's health, and the idle blocks it lends."""
        out = []
        for g in self._gpus:
            health = HEALTHY if g.healthy else UNHEALTHY
            out += [api_pb2.Device(ID=device_id(g.uuid, k), health=health) for k in range(g.blocks)]
            out += [
                api_pb2.Device(ID=lent_device_id(g.uuid, k), health=health) for k in range(g.lent)
            ]
        return out

    # -- the service ------------------------------------------------------------------------
    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Any
    ) -> api_pb2.DevicePluginOptions:
        """Preferred allocation on (the GPU chosen at bind), no pre-start hook."""
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Any
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        """The devices once the agent has sampled its GPUs, then again on every change.

        Until kubelet hangs up; never an empty list for want of a first sample.
        """
        seen = [0]
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: self._version != seen[0])
                seen[0] = self._version
            yield api_pb2.ListAndWatchResponse(devices=self.devices())

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Any
    ) -> api_pb2.PreferredAllocationResponse:
        """Blocks on the GPU the extender chose for the pod being admitted.

        Only blocks this plugin advertised are offered (others named are skipped), each once,
        and never more than there are: the size asked is clipped to them.
        """
        named = sum(
            len(req.available_deviceIDs) + len(req.must_include_deviceIDs)
            for req in request.container_requests
        )
        if named > MAX_REQUEST_IDS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{named} device IDs in one request, more than {MAX_REQUEST_IDS}",
            )
        assigned = await self._safe_lookup()
        held = await self._holders()
        out = []
        for req in request.container_requests:
            match = self._match(assigned, req.allocation_size, held)
            self._offers = [*self._offers[-(MAX_OFFERS - 1) :], match]
            target = match.pod.gpu_uuid if match.pod is not None else None
            if target is None:
                log.warning(
                    "preferred allocation of %d blocks: %s; the tightest fit is offered, and "
                    "Allocate will refuse it unless an extender answers then",
                    req.allocation_size,
                    match.why,
                )
            must = [d for d in dict.fromkeys(req.must_include_deviceIDs) if d in self._advertised]
            available = [d for d in dict.fromkeys(req.available_deviceIDs) if d in self._advertised]
            size = max(0, min(req.allocation_size, len({*must, *available})))
            ids = preferred(available, must, size, target)
            out.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=out)

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: Any
    ) -> api_pb2.AllocateResponse:
        """The container gets the GPU its blocks are on, and its memory budget.

        Only blocks this plugin advertised, all of one GPU, and that GPU the one the extender
        chose at bind for the pod being admitted; anything else fails with the reason (kubelet
        fails the pod's admission with it, and the pod's owner makes a new one).
        """
        out = []
        for req in request.container_requests:
            ids = list(req.devices_ids)
            problem = self._invalid(ids)
            if problem:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            gpu = gpu_of(ids[0])
            refused = await self._refusal(ids, gpu)
            if refused is not None:
                log.warning("allocate refused: %s", refused[1])
                await context.abort(*refused)
            now = self._clock()
            self._given = {d: t for d, t in self._given.items() if now - t < CLAIM_TTL_S}
            self._given.update(dict.fromkeys(ids, now))
            budget = len(ids) * self._block_mib()
            envs = {"EDGEGPU_GPU_UUID": gpu, "EDGEGPU_MEM_LIMIT_MIB": str(budget)}
            nodes = next((g.device_nodes for g in self._gpus if g.uuid == gpu), ())
            if not nodes:
                envs["NVIDIA_VISIBLE_DEVICES"] = gpu
            specs = [
                api_pb2.DeviceSpec(container_path=n, host_path=n, permissions="rw") for n in nodes
            ]
            log.info("allocate: %d blocks of %s (%d MiB)", len(ids), gpu, budget)
            out.append(api_pb2.ContainerAllocateResponse(envs=envs, devices=specs))
        return api_pb2.AllocateResponse(container_responses=out)

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Any
    ) -> api_pb2.PreStartContainerResponse:
        """Nothing to do before a container starts."""
        return api_pb2.PreStartContainerResponse()

    # -- checking an allocation -------------------------------------------------------------
    def _invalid(self, ids: list[str]) -> str | None:
        """Why kubelet's device IDs cannot be one container's blocks; None when they can."""
        if not ids:
            return "no device IDs to allocate"
        if len(ids) > len(self._advertised):
            return f"{len(ids)} device IDs, more than the {len(self._advertised)} advertised"
        if len(set(ids)) != len(ids):
            return f"device IDs given more than once among {len(ids)}"
        unknown = [d for d in ids if d not in self._advertised]
        if unknown:
            return f"not devices this plugin advertised: {', '.join(unknown[:3])[:300]}"
        gpus = sorted({gpu_of(d) for d in ids})
        if len(gpus) != 1:
            return f"memory blocks must be on one GPU; these are on {len(gpus)}: {gpus}"
        return None

    async def _refusal(self, ids: list[str], gpu: str) -> tuple[grpc.StatusCode, str] | None:
        """Why these blocks are not the ones bind chose for the container being admitted.

        The container is the one ``GetPreferredAllocation`` matched just before (kubelet calls
        it right before ``Allocate``), else it is matched now the same way. Blocks given lately
        and given again with no preferred allocation before are an init container's, reused by
        the pod's app container.
        """
        now = self._clock()
        size = len(ids)
        self._offers = [m for m in self._offers if now - m.at < OFFER_TTL_S]
        # The latest of that size: kubelet allocates right after its preferred allocation.
        offer = next((m for m in reversed(self._offers) if m.size == size), None)
        if offer is not None:
            self._offers.remove(offer)
        elif all(d in self._given and now - self._given[d] < CLAIM_TTL_S for d in ids):
            log.info("allocate: %d blocks of %s given again (an init container's)", size, gpu)
            return None
        match = offer
        if match is None or match.pod is None:
            match = self._match(await self._safe_lookup(), size, await self._holders())
            for _ in range(4 if self._settle_s > 0 else 0):
                if match.pod is not None:
                    break
                await asyncio.sleep(self._settle_s / 4)
                match = self._match(await self._safe_lookup(), size, await self._holders())
        pod = match.pod
        if pod is None:
            why = f"{match.why}: the GPU chosen at bind is not known, and {size} blocks of {gpu}"
            return match.code, f"{why} are not given on a guess"
        if pod.gpu_uuid != gpu:
            return grpc.StatusCode.FAILED_PRECONDITION, (
                f"pod {pod.namespace}/{pod.name} (container {match.container}) was bound to GPU "
                f"{pod.gpu_uuid}, but kubelet chose {size} blocks of GPU {gpu}"
            )
        return None

    # -- matching a request to the pod ------------------------------------------------------
    async def _safe_lookup(self) -> list[Assigned] | None:
        """The extender's assignments on this node; None when no extender answered in time."""
        try:
            # kubelet admits pods one at a time and waits on us: never long.
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                found = await self._lookup()
        except TimeoutError:
            log.warning("no extender answered within %g s", LOOKUP_TIMEOUT_S)
            return None
        except Exception as exc:
            log.warning("assignments lookup failed: %s", exc)
            return None
        if found is None:
            log.warning("no extender answered with this node's GPU assignments")
        return found

    async def _holders(self) -> dict[str, int]:
        held = (await self._held() if self._held is not None else None) or {}
        now = self._clock()
        self._listed_since = {k: self._listed_since.get(k, now) for k in held}
        return held

    def _match(self, assigned: list[Assigned] | None, size: int, held: dict[str, int]) -> _Match:
        """The oldest pending pod's container asking ``size`` blocks (``_claim``), or why none."""
        now = self._clock()
        if assigned is None:
            return _Match(size, now, code=grpc.StatusCode.UNAVAILABLE,
                          why="no extender answered with this node's GPU assignments")  # fmt: skip
        found = self._claim(assigned, size, held)
        if found is None:
            return _Match(size, now, why=f"no pod bound here by the extender waits for a "
                                         f"container of {size} blocks")  # fmt: skip
        return _Match(size, now, found[0], found[1])

    def _claim(
        self, assigned: list[Assigned], size: int, held: dict[str, int]
    ) -> tuple[Assigned, int] | None:
        """The pending pod with a container asking ``size`` blocks, and that container.

        The pod kubelet is admitting: the oldest of those it began to list lately (``held``,
        ``ADMITTING_S``), else the oldest of all (kubelet's pod resources not known). Each
        container is matched once (kubelet allocates per container, in order): not the ones
        matched here lately, nor the first ``held[pod]`` block containers of a pod, which
        kubelet says hold blocks already.
        """
        now = self._clock()
        self._claimed = {k: t for k, t in self._claimed.items() if now - t < CLAIM_TTL_S}
        pending = [
            (a, k)
            for a in assigned
            if a.phase in (None, "Pending")
            for k, blocks in enumerate(a.containers or (a.blocks,))
            if blocks == size
            and f"{a.uid}/{k}" not in self._claimed
            and k >= held.get(f"{a.namespace}/{a.name}", 0)
        ]
        # kubelet lists a pod (PodResources) from the moment it starts admitting it: where it
        # lists some of these, lately, the one it admits now is among them.
        since = [self._listed_since.get(f"{a.namespace}/{a.name}") for a, _ in pending]
        admitting = [
            p
            for p, t in zip(pending, since, strict=True)
            if t is not None and now - t <= ADMITTING_S
        ]
        pending = admitting or pending
        if not pending:
            return None
        pod, k = min(pending, key=lambda p: (p[0].assigned_at, p[0].uid, p[1]))
        self._claimed[f"{pod.uid}/{k}"] = now
        log.info("matched %s/%s container %d: %s", pod.namespace, pod.name, k, pod.gpu_uuid)
        return pod, k
