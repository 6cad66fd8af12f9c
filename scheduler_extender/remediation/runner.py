"""The leader's remediation loop: every few seconds, evict what ``thermal.evictions`` says.

Acts only while this replica leads (or when leader election is off) and ``spec.remediation``
is enabled; with ``dryRun`` it logs and counts what it would do. Evictions go through the
Eviction API, so PodDisruptionBudgets hold (a refused one is tried again later).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from scheduler_extender.k8s.client import KubeApi, KubeError
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.remediation import thermal
from scheduler_extender.state.cluster import ClusterState

log = logging.getLogger("scheduler_extender")

PERIOD_S = 5.0


class Remediator:
    """Runs ``step`` every ``PERIOD_S`` while the app runs."""

    def __init__(
        self,
        state: ClusterState,
        kube: KubeApi,
        metrics: ExtenderMetrics,
        leading: Callable[[], bool],
    ) -> None:
        self.state = state
        self.kube = kube
        self.metrics = metrics
        self.leading = leading
        self._last: dict[thermal.GpuKey, float] = {}

    def hot_gpus(self) -> list[thermal.HotGpu]:
        """Every GPU the telemetry shows at or above maxTemp, with how long it has been."""
        now = self.state.clock.monotonic()
        out = []
        for node in self.state.store.nodes():
            record = self.state.store.get(node)
            if record is None or not record.thermal:
                continue
            index_of = dict(zip(record.digest.uuids, record.digest.column("index"), strict=True))
            for uuid, st in record.thermal.items():
                if st.hot_since is not None and uuid in index_of:
                    out.append(thermal.HotGpu(node, int(index_of[uuid]), now - st.hot_since))
        return out

    async def step(self) -> list[thermal.Eviction]:
        """One round: the evictions due, taken (or, with dryRun, only logged)."""
        spec = self.state.policy.spec
        if not spec.remediation.enabled or not self.leading():
            return []
        now = self.state.clock.monotonic()
        hot = self.hot_gpus()
        pods = {gpu.node: self.state.allocations.on_node(gpu.node) for gpu in hot}
        due = thermal.evictions(hot, pods, spec.thermal_throttling, self._last, now)
        for ev in due:
            self._last[ev.gpu] = now
            pod = f"{ev.pod.namespace}/{ev.pod.name}"
            if spec.remediation.dry_run:
                log.warning("remediation (dry run): would evict %s: %s", pod, ev.reason)
                self.metrics.remediation.labels("evict", "thermal", "dry_run").inc()
                continue
            try:
                await asyncio.to_thread(self.kube.evict_pod, ev.pod.namespace, ev.pod.name)
            except KubeError as exc:
                result = {404: "gone", 429: "blocked"}.get(exc.status, "failed")
                log.warning("remediation: evicting %s: %s (%s)", pod, exc, result)
                self.metrics.remediation.labels("evict", "thermal", result).inc()
                if result == "blocked":
                    self._last.pop(ev.gpu, None)  # a budget forbids it now: try again next round
                continue
            log.warning("remediation: evicted %s: %s", pod, ev.reason)
            self.metrics.remediation.labels("evict", "thermal", "evicted").inc()
        return due

    async def run(self) -> None:
        """``step`` every ``PERIOD_S``; no error ends the loop."""
        while True:
            await asyncio.sleep(PERIOD_S)
            try:
                await self.step()
            except Exception:
                log.exception("remediation round failed; carrying on")
