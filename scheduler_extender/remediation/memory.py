"""Two controllers of GPU memory: pods over their blocks, and lent blocks taken back.

``Budgets`` warns (an Event) as soon as a pod is seen using more GPU memory than its blocks and,
with ``memory.overBudget: evict``, evicts it once it has stayed over for ``overBudgetGrace``; a
pod counts as back under only once it has stayed under for ``overBudgetGrace`` too (one low
sample does not start its grace over). ``Reclaim`` evicts the best-effort pods of a GPU whose
lenders need their blocks again (``memory.idleRelease``), the latest assigned first; a borrower
a PodDisruptionBudget keeps for longer than ``drainTimeout`` is said in a Warning Event. Both act
through the ``Actuator``.
"""

from __future__ import annotations

import logging
import math

from scheduler_extender.domain import Assignment
from scheduler_extender.remediation.actuator import Actuator
from scheduler_extender.state.cluster import ClusterState

log = logging.getLogger("scheduler_extender.remediation")


def over_budget(state: ClusterState) -> dict[str, tuple[Assignment, float, float]]:
    """Pods whose processes use more GPU memory than their blocks: uid → (pod, MiB, budget).

    From fresh reports only, and only for processes on the GPU the pod is assigned to, in the
    report of its own node (a report never speaks for another node's pods).
    """
    spec = state.policy.spec
    block_mib = spec.memory.block_mib
    now = state.clock.monotonic()
    out: dict[str, tuple[Assignment, float, float]] = {}
    for node in state.store.nodes():
        record = state.store.get(node)
        if record is None:
            continue
        if now - record.received_at > spec.stale_telemetry.stale_after_s(record.report.interval_s):
            continue  # an old sample: staleness alone never evicts
        for g in record.report.gpus:
            used_by: dict[str, float] = {}
            for proc in g.processes:
                if proc.pod_uid and proc.used_mib is not None:
                    used_by[proc.pod_uid] = used_by.get(proc.pod_uid, 0.0) + proc.used_mib
            for uid, used in used_by.items():
                a = state.assigned_to(uid, node, g.index)
                if a is None or a.whole or not a.mem_blocks:
                    continue
                budget = float(a.mem_blocks * block_mib)
                if used > budget:
                    out[uid] = (a, used, budget)
    return out


class Budgets:
    """Pods over their memory blocks: a warning at once, an eviction after the grace."""

    def __init__(self, state: ClusterState, act: Actuator) -> None:
        self.state = state
        self.act = act
        self._over: dict[str, float] = {}
        """Pods over their blocks: uid → since when (monotonic; inf once evicted)."""
        self._under: dict[str, float] = {}
        """Pods over their blocks before, seen under since (monotonic)."""

    def reset(self) -> None:
        """Not acting for a while: every pod's grace starts over when acting again."""
        self._over.clear()
        self._under.clear()

    async def step(self) -> None:
        """One round."""
        spec = self.state.policy.spec
        now = self.state.clock.monotonic()
        over = over_budget(self.state)
        grace = spec.memory.over_budget_grace_s
        for uid in [u for u in self._over if u not in over]:
            under = self._under.setdefault(uid, now)
            if now - under >= grace or self.state.allocations.get(uid) is None:
                del self._over[uid], self._under[uid]  # under for a whole grace, or gone
        for uid, (pod, used, budget) in over.items():
            self._under.pop(uid, None)
            if self.act.refusal(pod.node, spec.remediation) is not None:
                continue
            message = (
                f"uses {used:.0f} MiB of GPU memory on {pod.node}, over its "
                f"{pod.mem_blocks} block(s) ({budget:.0f} MiB)"
            )
            since = self._over.get(uid)
            if since is None:
                self._over[uid] = now
                log.warning("pod %s/%s %s", pod.namespace, pod.name, message)
                self.act.metrics.remediation.labels("warn", "over_budget", "done").inc()
                ref = {"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": uid}
                await self.act.event(ref, "EdgeGPUOverBudget", message, "Warning")
            elif (
                spec.memory.over_budget == "evict"
                and now - since >= grace
                and await self.act.evict(pod, "over_budget", message, spec.remediation)
            ):
                self._over[uid] = math.inf  # on its way out: not again


class Reclaim:
    """Lent blocks taken back: the borrowers of a GPU whose owners need the memory go."""

    def __init__(self, state: ClusterState, act: Actuator) -> None:
        self.state = state
        self.act = act
        self._evicted: set[str] = set()
        """Best-effort pods evicted already (not again while they are still leaving)."""
        self._kept: dict[str, float] = {}
        """Borrowers due but kept (a budget, an error): since when (monotonic)."""

    async def step(self) -> None:
        """One round."""
        spec = self.state.policy.spec
        now = self.state.clock.monotonic()
        due = self.state.borrowers_to_evict()
        self._evicted = {u for u in self._evicted if self.state.allocations.get(u)}
        self._kept = {u: t for u, t in self._kept.items() if u in {p.pod_uid for p, _ in due}}
        for pod, short in due:
            if pod.pod_uid in self._evicted:
                continue
            message = (
                f"its GPU on {pod.node} is {short} block(s) short, and best-effort pods give "
                "memory back first (idle blocks lent are needed again)"
            )
            if await self.act.evict(pod, "reclaim", message, spec.remediation):
                self._evicted.add(pod.pod_uid)
                continue
            if not self.act.blocked_for(pod.pod_uid):
                continue  # not refused by the API (paused, stale, rate): not its budget
            since = self._kept.setdefault(pod.pod_uid, now)
            if now - since >= spec.remediation.drain_timeout_s and since > -math.inf:
                self._kept[pod.pod_uid] = -math.inf  # said once
                self.act.metrics.remediation.labels("evict", "reclaim", "kept_too_long").inc()
                ref = {"kind": "Pod", "namespace": pod.namespace, "name": pod.name,
                       "uid": pod.pod_uid}  # fmt: skip
                await self.act.event(
                    ref, "EdgeGPUReclaimBlocked",
                    f"kept for over {spec.remediation.drain_timeout_s:.0f} s (drainTimeout) by "
                    f"its PodDisruptionBudget or by errors while {message}: its lenders wait",
                    "Warning",
                )  # fmt: skip
