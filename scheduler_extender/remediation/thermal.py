"""Thermal migration: which pods to evict from GPUs hot for longer than ``migrateAfter``.

One pod per hot GPU per ``migrateAfter``: the lowest QoS class, the most recently placed of
those that are not leaving already. The GPU then has ``migrateAfter`` to cool before the next
one goes. ``evictions`` is the pure decision; ``Migration`` the controller that acts on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scheduler_extender.domain import Assignment
from scheduler_extender.k8s.client import JsonDict
from scheduler_extender.policy.rules.thermal import ThermalArgs
from scheduler_extender.remediation.actuator import Actuator
from scheduler_extender.state.cluster import ClusterState

GpuKey = tuple[str, int]
"""(node, GPU index)."""


@dataclass(frozen=True, slots=True)
class HotGpu:
    """A GPU at or above maxTemp, and for how long."""

    node: str
    index: int
    hot_for_s: float


@dataclass(frozen=True, slots=True)
class Eviction:
    """A pod to move off a hot GPU, and why (said in the log)."""

    pod: Assignment
    gpu: GpuKey
    reason: str


def evictions(
    hot: Sequence[HotGpu],
    pods: Mapping[str, Sequence[Assignment]],
    args: ThermalArgs,
    last_evicted: Mapping[GpuKey, float],
    now: float,
) -> list[Eviction]:
    """The evictions due now. ``last_evicted``: when each GPU last had a pod evicted."""
    out = []
    for gpu in hot:
        key = (gpu.node, gpu.index)
        if gpu.hot_for_s <= args.migrate_after_s:
            continue
        if now - last_evicted.get(key, -float("inf")) < args.migrate_after_s:
            continue  # the last eviction's pod is still leaving; give the GPU time to cool
        on_gpu = [a for a in pods.get(gpu.node, ()) if gpu.index in a.gpu_indices]
        if not on_gpu:
            continue
        pod = min(on_gpu, key=lambda a: (a.qos, -a.assigned_at))
        out.append(
            Eviction(
                pod,
                key,
                f"gpu {gpu.index} of node {gpu.node} at or above {args.max_temp_c:g} °C for "
                f"{gpu.hot_for_s:.0f} s (migrateAfter {args.migrate_after_s:g} s); "
                f"{pod.qos.wire} is the lowest class on it",
            )
        )
    return out


def leaving(pod: JsonDict | None) -> bool:
    """Whether a Pod object is on its way out already (``deletionTimestamp`` set)."""
    return bool(pod and (pod.get("metadata") or {}).get("deletionTimestamp"))


class Migration:
    """The controller: the hot GPUs the telemetry shows, their pods, the evictions due."""

    def __init__(
        self,
        state: ClusterState,
        act: Actuator,
        pods: Callable[[], Mapping[str, JsonDict]],
    ) -> None:
        self.state = state
        self.act = act
        self.pods = pods
        self._last: dict[GpuKey, float] = {}

    def hot_gpus(self) -> list[HotGpu]:
        """Every GPU the telemetry shows at or above maxTemp, with how long it has been."""
        now = self.state.clock.monotonic()
        out = []
        for node in self.state.store.nodes():
            record = self.state.store.get(node)
            if record is None or not record.thermal:
                continue
            index_of = dict(zip(record.digest.uuids, record.digest.column("index"), strict=True))
            for uuid_, st in record.thermal.items():
                if st.hot_since is not None and uuid_ in index_of:
                    out.append(HotGpu(node, int(index_of[uuid_]), now - st.hot_since))
        return out

    async def step(self) -> list[Eviction]:
        """The evictions due, taken (or, with dryRun, only logged)."""
        spec = self.state.policy.spec
        now = self.state.clock.monotonic()
        args = spec.remediation
        # Through the gate here too, so that a node refused (stale, opted out) loses no turn.
        hot = [g for g in self.hot_gpus() if self.act.refusal(g.node, args) is None]
        objects = self.pods()
        pods = {
            gpu.node: [
                a
                for a in self.state.allocations.on_node(gpu.node)
                if not leaving(objects.get(a.pod_uid))
            ]
            for gpu in hot
        }
        due = evictions(hot, pods, spec.thermal_throttling, self._last, now)
        for ev in due:
            if await self.act.evict(ev.pod, "thermal", ev.reason, args):
                self._last[ev.gpu] = now  # not taken: tried again next round
        return due
