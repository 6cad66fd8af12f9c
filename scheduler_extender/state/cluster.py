"""``ClusterState``: telemetry, node labels and GPU assignments kept consistent in one table.

Every write (a push, a bind, a label change, an expiry) rewrites the rows it touches, so that a
request only gathers rows and calls the pure policy. The parts it keeps consistent are each in
their own module: rows written from reports and assignments (``rows``), assignments corrected
from what reports say pods hold (``corrections``), holds and reservations (``holds``),
the rack room cache (``room``), unlisted nodes (``unlisted``), labels and racks (``places``),
pods' demands (``demands``), lent blocks read back (``borrowing``). Imports ``telemetry``,
``policy``, ``domain`` and the other ``state`` modules.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from scheduler_extender.domain import Assignment, PodDemand, QosClass
from scheduler_extender.policy.batch import NodeBatch
from scheduler_extender.policy.combine import Context, Evaluation, evaluate
from scheduler_extender.policy.document import DEFAULT_POLICY, Policy
from scheduler_extender.policy.rules.fragmentation import DemandMix
from scheduler_extender.state import borrowing, hysteresis, lending as lending_rules, places, rows
from scheduler_extender.state.allocations import Allocations
from scheduler_extender.state.corrections import Corrections
from scheduler_extender.state.decide import Decision, decide
from scheduler_extender.state.demands import Demands
from scheduler_extender.state.holds import Holds
from scheduler_extender.state.host import HostLedger
from scheduler_extender.state.places import NodeLabels
from scheduler_extender.state.room import RackRoom
from scheduler_extender.state.table import NodeTable
from scheduler_extender.state.unlisted import MAX_UNLISTED_NODES, Unlisted
from scheduler_extender.state.verdicts import VerdictCache
from scheduler_extender.telemetry.clock import Clock
from scheduler_extender.telemetry.decode import TelemetryReport
from scheduler_extender.telemetry.store import NodeStatus, PutResult, Received, TelemetryStore

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 10.0
"""How often silent unlisted nodes are looked for (at a push or a metrics scrape)."""


class ClusterState:
    """The extender's whole memory. Not thread-safe: every call comes from one event loop."""

    def __init__(
        self,
        clock: Clock,
        policy: Policy = DEFAULT_POLICY,
        *,
        max_unlisted_nodes: int = MAX_UNLISTED_NODES,
    ) -> None:
        self.clock = clock
        self.policy = policy
        self.unlisted = Unlisted(max_unlisted_nodes)
        """Nodes with telemetry that no Node object lists, at most ``max_unlisted_nodes``."""
        self._next_sweep = 0.0
        self.store = TelemetryStore()
        self.table = NodeTable()
        self.allocations = Allocations()
        self.host = HostLedger()
        self.node_labels = NodeLabels()
        """Node objects' labels (from the watch), by node."""
        self.verdicts = VerdictCache()
        """Per-row GPU facts and verdicts by demand shape, kept until a row is written."""
        self.demands = Demands(policy.spec.fragmentation)
        """What pods asked for, and the shape mix of fragmentation scoring."""
        self.room = RackRoom()
        """Free room per rack, for choosing a rack for a new job group."""
        self.lending = lending_rules.Lending()
        """Which pods stay idle, for lending their idle blocks (``memory.idleRelease``)."""
        self.foreign_processes = 0
        """Processes in reports that named a pod assigned to another node or GPU (ignored)."""
        self.corrections = Corrections()
        """The GPUs reports showed pods hold where bind had said others."""
        self.holds = Holds(self.allocations, self.corrections, self._write_allocations)
        """Assignments made and dropped; which are reservations not bound yet."""

    # -- inputs -----------------------------------------------------------------------------
    def set_policy(self, policy: Policy) -> None:
        """Put a new policy in force; rows are rewritten (rack label or thresholds may differ)."""
        old, new = self.policy.spec, policy.spec
        if (old.lends_idle_blocks, old.memory) != (new.lends_idle_blocks, new.memory):
            self.lending = lending_rules.Lending()  # idle times seen under other rules start over
        self.policy = policy
        self.verdicts.clear()
        self.demands.set_args(policy.spec.fragmentation)
        self._write_nodes(self.store.nodes())

    def ingest(
        self, report: TelemetryReport | Received, *, bound_to_node: bool = False
    ) -> PutResult:
        """Take one agent report (``ingest_many``)."""
        return self.ingest_many((report,), bound_to_node=bound_to_node)[0]

    def ingest_many(
        self, reports: Sequence[TelemetryReport | Received], *, bound_to_node: bool = False
    ) -> list[PutResult]:
        """Take agent reports in arrival order; the rows they change are written together.

        ``bound_to_node``: their sender's credential may report for the node it names only (a
        token bound to that node, an agent pod on it). Else a report naming a node that is
        neither kept nor listed by a Node object, while ``max_unlisted_nodes`` are kept, is
        refused (``PutResult.refused``): nothing of it is kept.
        """
        now, wall = self.clock.monotonic(), self.clock.wall()
        thermal, ttl = self.policy.spec.thermal_throttling, self.policy.spec.memory.assume_ttl_s
        results = []
        taken: dict[str, None] = {}  # nodes in order, once each (a later push of one wins)
        for report in reports:
            push = Received.of(report) if isinstance(report, TelemetryReport) else report
            node = push.digest.node
            listed = node in self.node_labels
            if not (listed or bound_to_node or node in self.unlisted.nodes) and self._full():
                results.append(self.unlisted.refuse(node))
                continue
            before = self.store.get(node)
            heat = hysteresis.advance(before, push, now, thermal)
            result = self.store.put(push, now, wall, heat)
            results.append(result)
            if not result.accepted:
                continue
            record = self.store.get(node)
            if record is not None:
                for level, message in hysteresis.transitions(before, record, now, thermal):
                    log.log(level, "%s", message)
            if not listed:
                self.unlisted.nodes.add(node)
            taken[node] = None
            holders = push.report.holders
            if holders and self.allocations.holds_gpus(node):
                self.corrections.correct(
                    self.allocations, node, holders, push.digest, self.clock.wall(), self.holds.pods
                )
            self.foreign_processes += self.holds.renew_seen(node, push.digest.pods, now + ttl)
        if taken:
            self._write_nodes(list(taken))
        self.forget_silent_nodes()  # after: a node that just reported is not silent
        return results

    def _full(self) -> bool:
        """Whether ``max_unlisted_nodes`` are kept, once the silent ones are forgotten."""
        if len(self.unlisted.nodes) < self.unlisted.max_nodes:
            return False
        self.forget_silent_nodes()
        return len(self.unlisted.nodes) >= self.unlisted.max_nodes

    def assigned_to(self, pod_uid: str, node: str, index: int) -> Assignment | None:
        """The pod's assignment when it is on GPU ``index`` of ``node``, as a report says.

        A report speaks for its own node only: None for a pod assigned to another node or GPU,
        as for an unassigned one.
        """
        a = self.allocations.get(pod_uid)
        if a is None or a.node != node or index not in a.gpu_indices:
            return None
        return a

    def forget_silent_nodes(self) -> list[str]:
        """Forget the unlisted nodes silent for long (``FORGET_AFTER_STALE``).

        Looks every ``SWEEP_EVERY_S`` at most (an earlier call does nothing); the nodes
        forgotten. A node that a Node object lists is kept, however silent.
        """
        now = self.clock.monotonic()
        if now < self._next_sweep or not self.unlisted.nodes:
            return []
        self._next_sweep = now + SWEEP_EVERY_S
        gone = self.unlisted.silent(self.store, now, self.policy.spec.stale_telemetry)
        for node in gone:
            self.forget_node(node)
        self.unlisted.forgotten += len(gone)
        return gone

    @property
    def corrected_assignments(self) -> int:
        """Assignments whose GPUs a report showed the pod does not hold, and were corrected."""
        return self.corrections.count

    @property
    def unlisted_nodes(self) -> int:
        """How many nodes with telemetry no Node object lists."""
        return len(self.unlisted.nodes)

    @property
    def max_unlisted_nodes(self) -> int:
        """At most this many nodes are kept that no Node object lists."""
        return self.unlisted.max_nodes

    @property
    def refused_nodes(self) -> int:
        """Pushes refused for naming a new unlisted node over ``max_unlisted_nodes``."""
        return self.unlisted.refused

    @property
    def forgotten_nodes(self) -> int:
        """Unlisted nodes forgotten after their silence."""
        return self.unlisted.forgotten

    def set_node_labels(self, node: str, labels: Mapping[str, str]) -> None:
        """Labels of a Node object (from a watch); they win over the agent's labels."""
        self.node_labels.set(node, labels)
        self.unlisted.nodes.discard(node)
        self.table.set_labels(node, *self._place(node))

    def forget_node(self, node: str) -> None:
        """Drop everything about a node that left the cluster (or went silent, unlisted)."""
        self.store.forget(node)
        self.unlisted.nodes.discard(node)
        self.node_labels.forget(node)
        self.corrections.forget_node(node)
        self.host.forget_node(node)
        self.lending.forget(node)
        self.table.remove(node)

    def set_host_allocatable(self, node: str, cpu_milli: float, memory_mib: float) -> None:
        """A Node's allocatable CPU (millicores) and memory (MiB); NaN where unknown."""
        if self.host.set_allocatable(node, cpu_milli, memory_mib):
            self._write_host(node)

    def host_pod(self, pod_uid: str, node: str, cpu_milli: int, memory_mib: int) -> None:
        """A pod bound to (or running on) ``node`` requests this host CPU and memory."""
        for changed in self.host.place(pod_uid, node, cpu_milli, memory_mib):
            self._write_host(changed)

    def host_pod_gone(self, pod_uid: str) -> None:
        """A pod no longer holds host room (deleted, finished, bind failed)."""
        for changed in self.host.remove(pod_uid):
            self._write_host(changed)

    def _write_host(self, node: str) -> None:
        self.table.set_host_room(node, *self.host.free(node))

    def remember_demand(self, demand: PodDemand) -> None:
        """Keep what a pod asked for, so that bind (which gets only the pod's name) knows it.

        A pod not seen before also counts once in the shape mix of fragmentation scoring.
        """
        self.demands.remember(demand)

    @property
    def mix(self) -> DemandMix:
        """The shape mix in force (empty until fragmentation scoring has seen requests)."""
        return self.demands.mix

    def demand_of(self, pod_uid: str) -> PodDemand | None:
        """What a pod asked for at its last filter or prioritize."""
        return self.demands.get(pod_uid)

    def assign(self, assignment: Assignment, authoritative: bool = False) -> None:
        """Record GPUs given to a pod; assumed assignments expire unless telemetry shows them."""
        ttl = self.policy.spec.memory.assume_ttl_s
        self.holds.assign(assignment, None if authoritative else self.clock.monotonic() + ttl)

    def reserve(self, assignment: Assignment) -> None:
        """Hold GPUs for a pod from its prioritize until its bind (``RESERVE_TTL_S`` at most).

        kube-scheduler binds in the background while it already filters the next pod: without
        the hold, that pod's filter would still see the GPUs free and its bind be refused.
        """
        self.holds.reserve(assignment, self.clock.monotonic())

    def reserved(self, pod_uid: str) -> bool:
        """Whether the pod's assignment is a reservation (prioritized, not bound yet)."""
        return self.holds.reserved(pod_uid)

    def release(self, pod_uid: str) -> None:
        """Free a pod's GPUs (bind failed, pod deleted)."""
        self.holds.release(pod_uid)

    def expire(self) -> None:
        """Drop assumed assignments and reservations whose time is up."""
        self.holds.expire(self.clock.monotonic())

    # -- decisions --------------------------------------------------------------------------
    def batch(
        self, names: Sequence[str], labels: Sequence[Mapping[str, str] | None] | None = None
    ) -> NodeBatch:
        """Gather the rows of the named nodes; ``labels`` (full Node objects) override racks."""
        rows = self.table.rows(names)
        batch = self.table.gather(rows, self.clock.monotonic(), self.policy.spec.thermal_throttling)
        if labels is not None:
            rack, rdma = self.override_racks(batch.rack, batch.rdma, labels)
            batch = dataclasses.replace(batch, rack=rack, rdma=rdma)
        return batch

    def override_racks(
        self,
        rack: npt.NDArray[np.int64],
        rdma: npt.NDArray[np.bool_],
        labels: Sequence[Mapping[str, str] | None],
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """Racks and RDMA flags as full Node objects' labels (where given) say."""
        return places.override_racks(self.table, rack, rdma, labels, self.policy.spec.topology)

    def context(self, demand: PodDemand) -> Context:
        """The time, plus where the pod's group runs and how much room each rack has."""
        now = self.clock.monotonic()
        if demand.group is None:
            return Context(now=now, mix=self.mix)
        group_racks = places.racks_of(self.table, self.allocations.nodes_of_group(demand.group))
        rack_free = self.room.per_rack(self.table, self.policy, demand.needs_whole_gpu)
        return Context(now=now, group_racks=group_racks, rack_free=rack_free, mix=self.mix)

    def decide(
        self,
        names: Sequence[str],
        demand: PodDemand,
        labels: Sequence[Mapping[str, str] | None] | None = None,
    ) -> Decision:
        """Filter and prioritize verdicts of the named nodes for a pod (the request path).

        The same verdicts as ``evaluate``, from the per-row caches; ``labels`` (full Node
        objects) override racks.
        """
        self.expire()
        rows = self.table.rows(names)
        racks = None
        if labels is not None and demand.group is not None:
            col = self.table.column
            racks = self.override_racks(col("rack")[rows], col("rdma")[rows], labels)
        ctx = self.context(demand)
        return decide(self.table, self.verdicts, rows, demand, self.policy, ctx, racks)

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
        return self.allocations.gpus_held(node, QosClass.TRAINING)

    def node_status(self, node: str) -> NodeStatus | None:
        """The node's faults, self-test verdict and boots as its last report says (None: none)."""
        record = self.store.get(node)
        return record.status if record else None

    def telemetry_fresh(self, node: str) -> bool:
        """Whether the node's last report is within the staleness bound (False: none)."""
        record = self.store.get(node)
        if record is None:
            return False
        after = self.policy.spec.stale_telemetry.stale_after_s(record.digest.interval_s)
        return bool(self.clock.monotonic() - record.received_at <= after)

    def gpu_uuids(self, node: str, indices: Sequence[int]) -> tuple[str, ...]:
        """UUIDs of a node's GPUs by index, from its last report ('' when unknown)."""
        record = self.store.get(node)
        return record.gpu_uuids(indices) if record else tuple("" for _ in indices)

    # -- internals --------------------------------------------------------------------------
    def _place(self, node: str) -> tuple[str | None, bool]:
        """The node's rack and RDMA flag, from its agent's labels and its Node object's."""
        record = self.store.get(node)
        labels = self.node_labels.of(node, record.digest.labels if record else {})
        return places.rack_and_rdma(labels, self.policy.spec.topology)

    def _write_nodes(self, nodes: Sequence[str]) -> None:
        """Write the telemetry part of these nodes' rows from their last reports."""
        records = [(node, record) for node in nodes if (record := self.store.get(node))]
        if not records:
            return
        rows.write_telemetry(self.table, records, self._place)
        for node, _ in records:
            if self.allocations.holds_gpus(node):
                self._write_allocations(node)
            else:
                # Nothing assigned: the row's assignment columns are already empty (the last
                # release rewrote them) and all memory in use is unaccounted, as just written.
                self.room.mark(self.table, node)

    def _write_allocations(self, node: str) -> None:
        record = self.store.get(node)
        spec = self.policy.spec
        if rows.write_allocations(self.table, node, self.allocations, record, self.lending, spec):
            self.room.mark(self.table, node)

    def lent_blocks(self, node: str) -> dict[str, int]:
        """Blocks the node's GPUs lend to best-effort pods, by GPU uuid.

        The agent's device plugin advertises them to kubelet.
        """
        if not self.policy.spec.lends_idle_blocks:
            return {}
        return borrowing.lent_by_uuid(self.table, node, self.gpu_uuids)

    def borrowers_to_evict(self) -> list[tuple[Assignment, int]]:
        """Best-effort pods to evict to give back lent blocks an owner needs again.

        Each with the blocks its GPU is short; nothing unless idle blocks are lent.
        """
        if not self.policy.spec.lends_idle_blocks:
            return []
        return borrowing.borrowers_due(
            self.table, self.store.nodes(), self.allocations, self.lending,
            self.policy.spec.memory, self.reserved,
        )  # fmt: skip
