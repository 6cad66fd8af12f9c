"""The node's GPUs as the device plugin advertises them to kubelet, round after round.

Each GPU's memory blocks (kept, with its uuid, while the GPU is lost), the idle blocks it lends
as the extenders last said, an AMD or Intel GPU's device nodes, the block size (the extender's
policy, kept in the state file for the next start), and which pods hold which GPU's blocks as
kubelet's PodResources says. Imports ``model`` and the device plugin's modules.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

from node_agent.deviceplugin.devices import GpuBlocks, device_nodes, gpu_holders
from node_agent.deviceplugin.plugin import BlockPlugin
from node_agent.deviceplugin.podresources import Listing
from node_agent.deviceplugin.state import StateFile, starting_block_mib
from node_agent.model import GpuHealth, GpuHolder, Snapshot

log = logging.getLogger("node_agent")


class BlockInventory:
    """What the device plugin tells kubelet of the node's GPUs."""

    def __init__(self, *, block_mib: int | None = None, state: StateFile | None = None) -> None:
        """The blocks of ``--block-mib`` until an extender or the state says its size.

        ``state``: where the block size an extender said is kept; None: nowhere.
        """
        self.plugin: BlockPlugin | None = None
        """The device plugin served, where it runs."""
        self.pod_devices: Listing | None = None
        """kubelet's PodResources lookup, asked once a round where the device plugin runs: which
        pods hold which GPU's blocks, reported as ``holders``."""
        self.holders: list[GpuHolder] | None = None
        """Which pods held which GPU's blocks at the last round; None when not known."""
        self.lend: dict[str, int] = {}
        """Idle blocks each GPU lends to best-effort pods, as the extenders last said."""
        self.health: dict[str, tuple[bool, str]] = {}
        """By GPU uuid, as last sampled: healthy, or why not (the DRA plugin streams it)."""
        self.health_at = 0.0
        """When ``health`` was sampled (wall clock)."""
        self.sys_root = Path("/sys")
        """Where sysfs is (the device plugin finds AMD and Intel GPUs' device nodes there)."""
        self.state = state
        self._kept_block_mib = state.block_mib() if state is not None else None
        # MiB per memory block, as kubelet is told: the policy's, once an extender said it.
        self.block_mib, source = starting_block_mib(self._kept_block_mib, block_mib)
        log.info("memory blocks of %d MiB (%s) until an extender answers", self.block_mib, source)
        self._pod_resources_ok: bool | None = None
        """Whether kubelet's pod resources answered last time (None: not asked yet)."""
        self._blocks: dict[str, int] = {}
        """By GPU uuid: its block count when last read (kept while the GPU is lost)."""
        self._nodes: dict[str, tuple[str, ...]] = {}
        """By GPU uuid: an AMD or Intel GPU's device nodes, when last found."""
        self._uuid_at: dict[int, str] = {}
        """By index: the uuid last read there (a lost GPU reads under a placeholder)."""

    async def advertise(self, snap: Snapshot, healths: Mapping[int, GpuHealth]) -> None:
        """Tell the device plugin (where it runs) the GPUs of this sample."""
        gpus = self._gpus(snap, healths)  # also finds AMD and Intel GPUs' device nodes
        self.health = {self._uuid_at.get(r.index, r.uuid) if r.lost else r.uuid:
                       (False, "lost") if r.lost else _level(healths.get(r.index))
                       for r in snap.readings}  # fmt: skip
        self.health_at = time.time()
        if self.plugin is not None:
            await self.plugin.update(gpus)

    def gpu_uuids(self) -> set[str]:
        """The uuids of this node's GPUs, as sampled."""
        return set(self._uuid_at.values())

    def device_health(self) -> tuple[float, dict[str, tuple[bool, str]]]:
        """When the GPUs were last sampled, and by uuid whether each is healthy and why not."""
        return self.health_at, dict(self.health)

    def device_nodes_of(self, uuid: str) -> tuple[str, ...]:
        """An AMD or Intel GPU's device nodes as last found; empty for NVIDIA or unknown."""
        return self._nodes.get(uuid) or ()

    async def lend_blocks(
        self, lend: dict[str, int], snap: Snapshot, healths: Mapping[int, GpuHealth]
    ) -> None:
        """The blocks the extenders lend now; kubelet hears of a change at once."""
        changed, self.lend = lend != self.lend, lend
        if changed:
            await self.advertise(snap, healths)

    async def read_holders(self) -> None:
        """Which pods hold which GPU's blocks, from kubelet; None where it cannot be asked."""
        self.holders = await self._holders()

    async def _holders(self) -> list[GpuHolder] | None:
        if self.pod_devices is None or self.plugin is None:
            return None
        try:
            pods = await self.pod_devices()
        except Exception as exc:  # kubelet's answer is not ours to trust blindly
            log.warning("kubelet's pod resources: %s", exc)
            pods = None
        readable = pods is not None
        if readable != self._pod_resources_ok:
            if not readable:
                log.warning("kubelet's pod resources cannot be read: holders not reported")
            elif self._pod_resources_ok is not None:
                log.info("kubelet's pod resources read again: holders reported")
            self._pod_resources_ok = readable
        return None if pods is None else gpu_holders(pods)

    def _gpus(self, snap: Snapshot, healths: Mapping[int, GpuHealth]) -> list[GpuBlocks]:
        """Each GPU's memory blocks for kubelet; a lost GPU keeps its uuid and blocks.

        An NVIDIA GPU is given to the container by ``NVIDIA_VISIBLE_DEVICES``; an AMD or Intel
        GPU by its device nodes, and offers no blocks while they cannot be found.
        """
        out = []
        for r in snap.readings:
            uuid = self._uuid_at.get(r.index, r.uuid) if r.lost else r.uuid
            if not r.lost:
                self._uuid_at[r.index] = r.uuid
                if r.memory_total_mib is not None:
                    self._blocks[r.uuid] = int(r.memory_total_mib // self.block_mib)
                if r.vendor not in (None, "nvidia") and not self._nodes.get(r.uuid):
                    # Looked up in sysfs until found, then kept while the agent runs.
                    self._nodes[r.uuid] = device_nodes(r.vendor, r.pci_bus_id, self.sys_root)
            nodes = self._nodes.get(uuid)
            if nodes == ():  # an AMD or Intel GPU whose device nodes were not found
                continue
            h = healths.get(r.index)
            healthy = not r.lost and (h is None or h.level != "unhealthy")
            lent = self.lend.get(uuid, 0) if healthy else 0
            out.append(GpuBlocks(uuid, self._blocks.get(uuid, 0), healthy, lent, nodes or ()))
        return out

    def follow_block_mib(self, block_mib: int) -> None:
        """The policy's block size; kept in the state file when it is not what is kept."""
        if block_mib != self.block_mib:
            log.warning("memory blocks of %d MiB from now on (the extender's policy; was %d)",
                        block_mib, self.block_mib)  # fmt: skip
            self.block_mib = block_mib
        if self.state is not None and block_mib != self._kept_block_mib:
            self.state.save_block_mib(block_mib)  # tried once per size: a failure is logged
            self._kept_block_mib = block_mib


def _level(health: GpuHealth | None) -> tuple[bool, str]:
    if health is None or health.level != "unhealthy":
        return True, ""
    return False, ", ".join(health.reasons) or "unhealthy"
