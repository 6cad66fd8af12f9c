"""``ClusterState``: telemetry, node labels and GPU assignments kept consistent in one table.

Every write (a push, a bind, a label change, an expiry) rewrites the rows it touches, so that a
request only gathers rows and calls the pure policy. Imports ``telemetry``, ``policy``,
``domain`` and the other ``state`` modules.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from scheduler_extender.domain import Assignment, Health, PodDemand, QosClass
from scheduler_extender.names import RDMA_LABEL
from scheduler_extender.policy import memory
from scheduler_extender.policy.combine import Context, Evaluation, NodeBatch, evaluate
from scheduler_extender.policy.document import DEFAULT_POLICY, Policy
from scheduler_extender.state.allocations import Allocations
from scheduler_extender.state.table import NodeTable
from scheduler_extender.telemetry.clock import Clock
from scheduler_extender.telemetry.schema import TelemetryReport
from scheduler_extender.telemetry.store import PutResult, TelemetryStore

DEMAND_CACHE_SIZE = 16_384


class ClusterState:
    """The extender's whole memory. Not thread-safe: every call comes from one event loop."""

    def __init__(self, clock: Clock, policy: Policy = DEFAULT_POLICY) -> None:
        self.clock = clock
        self.policy = policy
        self.store = TelemetryStore()
        self.table = NodeTable()
        self.allocations = Allocations()
        self._node_labels: dict[str, Mapping[str, str]] = {}
        self._demands: OrderedDict[str, PodDemand] = OrderedDict()

    # -- inputs -----------------------------------------------------------------------------
    def set_policy(self, policy: Policy) -> None:
        """Put a new policy in force; rows are rewritten (rack label or thresholds may differ)."""
        self.policy = policy
        for node in self.store.nodes():
            self._write_node(node)

    def ingest(self, report: TelemetryReport) -> PutResult:
        """Take one agent report."""
        now = self.clock.monotonic()
        result = self.store.put(report, now, self.clock.wall(), self.policy.spec.thermal_throttling)
        if result.accepted:
            ttl = self.policy.spec.memory.assume_ttl_s
            for gpu in report.gpus:
                for proc in gpu.processes:
                    if proc.pod_uid:
                        self.allocations.renew(proc.pod_uid, now + ttl)
            self._write_node(report.node)
        return result

    def set_node_labels(self, node: str, labels: Mapping[str, str]) -> None:
        """Labels of a Node object (from a watch); they win over the agent's labels."""
        self._node_labels[node] = dict(labels)
        rack, rdma = self._rack_and_rdma(self._labels_of(node))
        self.table.set_labels(node, rack, rdma)

    def forget_node(self, node: str) -> None:
        """Drop everything about a node that left the cluster."""
        self.store.forget(node)
        self._node_labels.pop(node, None)
        self.table.remove(node)

    def remember_demand(self, demand: PodDemand) -> None:
        """Keep what a pod asked for, so that bind (which gets only the pod's name) knows it."""
        self._demands[demand.uid] = demand
        self._demands.move_to_end(demand.uid)
        while len(self._demands) > DEMAND_CACHE_SIZE:
            self._demands.popitem(last=False)

    def demand_of(self, pod_uid: str) -> PodDemand | None:
        """What a pod asked for at its last filter or prioritize."""
        return self._demands.get(pod_uid)

    def assign(self, assignment: Assignment, authoritative: bool = False) -> None:
        """Record GPUs given to a pod; assumed assignments expire unless telemetry shows them."""
        expires = (
            None
            if authoritative
            else (self.clock.monotonic() + self.policy.spec.memory.assume_ttl_s)
        )
        moved_from = self.allocations.add(assignment, expires)
        for node in {assignment.node, moved_from} - {None}:
            self._write_allocations(str(node))

    def release(self, pod_uid: str) -> None:
        """Free a pod's GPUs (bind failed, pod deleted)."""
        node = self.allocations.remove(pod_uid)
        if node is not None:
            self._write_allocations(node)

    def expire(self) -> None:
        """Drop assumed assignments whose time is up."""
        for node in self.allocations.expire(self.clock.monotonic()):
            self._write_allocations(node)

    # -- decisions --------------------------------------------------------------------------
    def batch(
        self, names: Sequence[str], labels: Sequence[Mapping[str, str] | None] | None = None
    ) -> NodeBatch:
        """Gather the rows of the named nodes; ``labels`` (full Node objects) override racks."""
        rows = self.table.rows(names)
        batch = self.table.gather(rows, self.clock.monotonic(), self.policy.spec.thermal_throttling)
        if labels is not None:
            rack = batch.rack.copy()
            rdma = batch.rdma.copy()
            for i, node_labels in enumerate(labels):
                if node_labels:
                    name, flag = self._rack_and_rdma(node_labels)
                    rack[i] = self.table.rack_id(name)
                    rdma[i] = flag
            batch = dataclasses.replace(batch, rack=rack, rdma=rdma)
        return batch

    def context(self, demand: PodDemand) -> Context:
        """The time, plus where the pod's group runs and how much room each rack has."""
        now = self.clock.monotonic()
        if demand.group is None:
            return Context(now=now)
        racks = {
            self.table.column("rack")[row]
            for node in self.allocations.nodes_of_group(demand.group)
            if (row := self.table.row(node)) is not None
        }
        group_racks = np.array(sorted(r for r in racks if r >= 0), dtype=np.int64)
        return Context(now=now, group_racks=group_racks, rack_free=self._rack_free(demand))

    def evaluate(
        self,
        names: Sequence[str],
        demand: PodDemand,
        labels: Sequence[Mapping[str, str] | None] | None = None,
    ) -> Evaluation:
        """Filter and score the named nodes for a pod."""
        self.expire()
        return evaluate(self.batch(names, labels), demand, self.policy, self.context(demand))

    def performance_gpus(self, node: str) -> list[int]:
        """GPU indices of a node that hold training or realtime pods (kept at full clocks)."""
        return sorted(
            {
                i
                for a in self.allocations.on_node(node)
                if a.qos >= QosClass.TRAINING
                for i in a.gpu_indices
            }
        )

    def gpu_uuids(self, node: str, indices: Sequence[int]) -> tuple[str, ...]:
        """UUIDs of a node's GPUs by index, from its last report ('' when unknown)."""
        record = self.store.get(node)
        by_index = {g.index: g.uuid for g in record.report.gpus} if record else {}
        return tuple(by_index.get(i, "") for i in indices)

    # -- internals --------------------------------------------------------------------------
    def _labels_of(self, node: str) -> Mapping[str, str]:
        record = self.store.get(node)
        agent = record.report.labels if record else {}
        return {**agent, **self._node_labels.get(node, {})}

    def _rack_and_rdma(self, labels: Mapping[str, str]) -> tuple[str | None, bool]:
        topo = self.policy.spec.topology
        rack = labels.get(topo.rack_label) or (
            labels.get(topo.rack_label_fallback) if topo.rack_label_fallback else None
        )
        return rack, labels.get(RDMA_LABEL, "").lower() == "true"

    def _write_node(self, node: str) -> None:
        record = self.store.get(node)
        if record is None:
            return
        report = record.report
        health = report.node_health
        rack, rdma = self._rack_and_rdma(self._labels_of(node))
        gpus = []
        for gpu in report.gpus:
            state = record.thermal.get(gpu.uuid)
            gpus.append(
                {
                    "index": gpu.index,
                    "temperature_c": _num(gpu.temperature_c),
                    "power_w": _num(gpu.power_w),
                    "power_limit_w": _num(gpu.power_limit_w),
                    "utilization_pct": _num(gpu.utilization_pct),
                    "memory_total_mib": _num(gpu.memory_total_mib),
                    "unaccounted_used_mib": _num(gpu.memory_used_mib),
                    "below_since": _num(state.below_since if state else None),
                    "hot": bool(state and state.hot_since is not None),
                    "health": int(Health.from_wire(gpu.health)),
                }
            )
        self.table.write_node(
            node,
            received_at=record.received_at,
            interval_s=report.interval_s,
            driver_ok=health.driver_ok is not False and health.device_nodes_ok is not False,
            rack=rack,
            rdma=rdma,
            gpus=gpus,
        )
        self._write_allocations(node)

    def _write_allocations(self, node: str) -> None:
        blocks, whole, pods = self.allocations.totals(node)
        unaccounted: dict[int, float] = {}
        record = self.store.get(node)
        if record is not None:
            for gpu in record.report.gpus:
                if gpu.memory_used_mib is None:
                    continue
                ours = pods.get(gpu.index, set())
                explained = sum(
                    p.used_mib or 0.0 for p in gpu.processes if p.pod_uid and p.pod_uid in ours
                )
                unaccounted[gpu.index] = max(gpu.memory_used_mib - explained, 0.0)
        if record is None and not blocks and not whole and node not in self.table:
            return
        self.table.write_allocations(node, blocks, whole, unaccounted)

    def _rack_free(self, demand: PodDemand) -> npt.NDArray[np.float64]:
        rows = self.table.all_rows()
        if rows.size == 0 or self.table.rack_count == 0:
            return np.zeros(0)
        batch = self.table.gather(rows, self.clock.monotonic(), self.policy.spec.thermal_throttling)
        args = self.policy.spec.memory
        usable = batch.present & (batch.health != Health.UNHEALTHY)
        if demand.needs_whole_gpu:
            room = memory.is_idle(
                batch.unaccounted_used_mib, batch.allocated_blocks, batch.whole_taken, args
            ).astype(np.float64)
        else:
            room = memory.free_blocks(
                batch.memory_total_mib, batch.unaccounted_used_mib, batch.allocated_blocks, args
            ).astype(np.float64)
        per_node = np.where(usable, room, 0.0).sum(axis=1)
        known = batch.rack >= 0
        return np.bincount(
            batch.rack[known], weights=per_node[known], minlength=self.table.rack_count
        ).astype(np.float64)


def _num(value: float | None) -> float:
    return float("nan") if value is None else float(value)
