"""``ClusterState``: telemetry, node labels and GPU assignments kept consistent in one table.

Every write (a push, a bind, a label change, an expiry) rewrites the rows it touches, so that a
request only gathers rows and calls the pure policy. Imports ``telemetry``, ``policy``,
``domain`` and the other ``state`` modules.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from scheduler_extender.domain import Assignment, Health, PodDemand, QosClass
from scheduler_extender.names import RDMA_LABEL
from scheduler_extender.policy.batch import NodeBatch
from scheduler_extender.policy.combine import (
    Context,
    Evaluation,
    evaluate,
)
from scheduler_extender.policy.document import DEFAULT_POLICY, Policy
from scheduler_extender.policy.rules import memory
from scheduler_extender.policy.rules.fragmentation import DemandMix, MixLearner
from scheduler_extender.state import lending as lending_rules
from scheduler_extender.state.allocations import Allocations
from scheduler_extender.state.decide import Decision, decide
from scheduler_extender.state.host import HostLedger
from scheduler_extender.state.table import GPU_REPORT_COLUMNS, NodeTable
from scheduler_extender.state.verdicts import VerdictCache
from scheduler_extender.telemetry.clock import Clock
from scheduler_extender.telemetry.decode import TelemetryReport
from scheduler_extender.telemetry.report import DIGEST_COLUMNS, Digest, PodHolder
from scheduler_extender.telemetry.store import NodeRecord, PutResult, Received, TelemetryStore

log = logging.getLogger("scheduler_extender.state")

DEMAND_CACHE_SIZE = 16_384
RESERVE_TTL_S = 5.0
"""How long GPUs held for a pod between prioritize and its bind stay held without the bind."""
MAX_UNLISTED_NODES = 16_384
"""Nodes kept that no Node object lists, by default: a push no credential binds to one node (a
static token for any node, a loopback push with no agent authentication) names a new one only
while fewer are kept. Above the largest fleet the extender is sized for (10,000 nodes), which
the embedded mode, with no Node objects at all, must hold."""
FORGET_AFTER_STALE = 10.0
FORGET_AFTER_MIN_S = 3600.0
"""A node that no Node object lists is forgotten once its telemetry is ``FORGET_AFTER_STALE``
times older than its ``staleAfter``, and an hour old at least (an edge link may drop for that
long): its row, its metric series and its place under ``MAX_UNLISTED_NODES``. Should it report
again, its agent's ``hot_s_ago`` restores a cool-down. A listed node is forgotten when its Node
is deleted."""
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
        self.max_unlisted_nodes = max_unlisted_nodes
        """At most this many nodes are kept that no Node object lists (``MAX_UNLISTED_NODES``)."""
        self._unlisted: set[str] = set()
        """Nodes with telemetry that no Node object lists (every node, in the embedded mode)."""
        self._next_sweep = 0.0
        self.forgotten_nodes = 0
        """Unlisted nodes forgotten after their silence (``FORGET_AFTER_STALE``)."""
        self.refused_nodes = 0
        """Pushes refused for naming a new unlisted node over ``max_unlisted_nodes``."""
        self.store = TelemetryStore()
        self.table = NodeTable()
        self.allocations = Allocations()
        self.host = HostLedger()
        self._node_labels: dict[str, Mapping[str, str]] = {}
        self._demands: OrderedDict[str, PodDemand] = OrderedDict()
        self._reserved: set[str] = set()
        """Pods whose assignment is a reservation made at prioritize, not yet bound."""
        self.verdicts = VerdictCache()
        """Per-row GPU facts and verdicts by demand shape, kept until a row is written."""
        self._mix = MixLearner(policy.spec.fragmentation)
        self._room_dirty: set[int] = set()
        """Rows whose free room (blocks, idle GPUs) must be recounted before racks are summed."""
        self._rack_free_cache: dict[bool, tuple[tuple[int, int, int], npt.NDArray[np.float64]]] = {}
        """Free room per rack, by whole-GPU or blocks, with the (writes, racks, policy) it is of."""
        self.lending = lending_rules.Lending()
        """Which pods stay idle, for lending their idle blocks (``memory.idleRelease``)."""
        self.foreign_processes = 0
        """Processes in reports that named a pod assigned to another node or GPU (ignored)."""
        self.corrected_assignments = 0
        """Assignments whose GPUs a report showed the pod does not hold, and were corrected."""
        self._held: dict[str, _Held] = {}
        """By pod uid: the GPUs a report showed the pod holds, where bind had said others (an
        assignment read again from the pod's annotations is corrected again)."""
        self._holders_seen: dict[str, tuple[int, tuple[PodHolder, ...], tuple[str, ...]]] = {}
        """By node: the holders and GPUs of its last report checked, with its assignments'
        stamp then (the same again is not checked again)."""

    # -- inputs -----------------------------------------------------------------------------
    def set_policy(self, policy: Policy) -> None:
        """Put a new policy in force; rows are rewritten (rack label or thresholds may differ)."""
        old = self.policy.spec
        if (old.lends_idle_blocks, old.memory) != (
            policy.spec.lends_idle_blocks,
            policy.spec.memory,
        ):
            self.lending = lending_rules.Lending()  # idle times seen under other rules start over
        self.policy = policy
        self.verdicts.clear()
        if policy.spec.fragmentation != self._mix.args:
            self._mix = MixLearner(policy.spec.fragmentation)
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
            listed = node in self._node_labels
            if not (listed or bound_to_node or node in self._unlisted) and self._full():
                self.refused_nodes += 1
                results.append(self._refusal(node))
                continue
            result = self.store.put(push, now, wall, thermal)
            results.append(result)
            if not result.accepted:
                continue
            if not listed:
                self._unlisted.add(node)
            taken[node] = None
            holders = push.report.holders
            if holders and self.allocations.holds_gpus(node):
                self._correct(node, holders, push.digest)
            for index, pod_uid, _ in push.digest.pods:
                if self.assigned_to(pod_uid, node, index) is not None:
                    self.allocations.renew(pod_uid, now + ttl)
                elif self.allocations.get(pod_uid) is not None:
                    self.foreign_processes += 1  # a pod of another node or GPU: ignored
        if taken:
            self._write_nodes(list(taken))
        self.forget_silent_nodes()  # after: a node that just reported is not silent
        return results

    def _full(self) -> bool:
        """Whether ``max_unlisted_nodes`` are kept, once the silent ones are forgotten."""
        if len(self._unlisted) < self.max_unlisted_nodes:
            return False
        self.forget_silent_nodes()
        return len(self._unlisted) >= self.max_unlisted_nodes

    def assigned_to(self, pod_uid: str, node: str, index: int) -> Assignment | None:
        """The pod's assignment when it is on GPU ``index`` of ``node``, as a report says.

        A report speaks for its own node only: None for a pod assigned to another node or GPU,
        as for an unassigned one.
        """
        a = self.allocations.get(pod_uid)
        if a is None or a.node != node or index not in a.gpu_indices:
            return None
        return a

    def _correct(self, node: str, holders: Sequence[PodHolder], d: Digest) -> None:
        """Make each assignment on ``node`` name the GPUs its pod holds, as the report says.

        A report speaks for its own node: only pods assigned to ``node`` are looked up (by
        namespace and name), and only GPUs it lists are taken. Whole GPUs are not the device
        plugin's (nothing is said of them); a name two assignments share, a pod listed on two
        GPUs, a reservation, and a bind of the last two report intervals are left alone.
        """
        seen = (self.allocations.stamp(node), tuple(holders), d.uuids)
        if self._holders_seen.get(node) == seen:
            return  # most reports: the same pods on the same GPUs, checked already
        held: dict[tuple[str, str], list[str]] = {}
        for h in holders:
            held.setdefault((h.namespace, h.name), []).append(h.gpu_uuid)
        index_of = dict(zip(d.uuids, map(int, d.column("index")), strict=True))
        on_node: dict[tuple[str, str], list[Assignment]] = {}
        for a in self.allocations.on_node(node):
            if (a.namespace, a.name) in held:
                on_node.setdefault((a.namespace, a.name), []).append(a)
        # A report of the first moments after a bind may still show a same-name predecessor.
        settled = self.clock.wall() - 2 * d.interval_s
        deferred = False
        for key, found in on_node.items():
            a = found[0]
            uuids = held[key]
            if len(found) > 1 or a.whole or any(u not in index_of for u in uuids):
                continue
            if a.assigned_at > settled or a.pod_uid in self._reserved:
                deferred = True  # a reservation or a fresh bind: judged by a later report
                continue
            if len(uuids) > 1:
                continue  # a block pod sits on one GPU
            truth = sorted((index_of[u], u) for u in uuids)
            indices = tuple(i for i, _ in truth)
            if indices == a.gpu_indices:
                continue
            corrected = _Held(node, indices, tuple(u for _, u in truth))
            self._held[a.pod_uid] = corrected
            self.allocations.add(corrected.apply(a), self.allocations.expires_at(a.pod_uid))
            self.corrected_assignments += 1
            log.warning(
                "pod %s/%s holds GPU %s of node %s, not GPU %s as assigned: its assignment is "
                "corrected (every action on it follows)",
                a.namespace, a.name, ",".join(map(str, indices)), node,
                ",".join(map(str, a.gpu_indices)),
            )  # fmt: skip
        # Stamped after the corrections it made: the same report again is not checked again.
        if not deferred:
            self._holders_seen[node] = (self.allocations.stamp(node), seen[1], seen[2])
        # The node's row is written after this, from the corrected assignments.

    def _refusal(self, node: str) -> PutResult:
        return PutResult(
            False,
            f"node {node!r} is refused: {self.max_unlisted_nodes} nodes that no Node object "
            "lists are kept already, and a credential not bound to one node names no more (a "
            f"silent one is forgotten after {FORGET_AFTER_STALE:g} x its staleAfter, "
            f"{FORGET_AFTER_MIN_S:g} s at least)",
            refused=True,
        )

    def forget_silent_nodes(self) -> list[str]:
        """Forget the unlisted nodes silent for long (``FORGET_AFTER_STALE``).

        Looks every ``SWEEP_EVERY_S`` at most (an earlier call does nothing); the nodes
        forgotten. A node that a Node object lists is kept, however silent.
        """
        now = self.clock.monotonic()
        if now < self._next_sweep or not self._unlisted:
            return []
        self._next_sweep = now + SWEEP_EVERY_S
        stale = self.policy.spec.stale_telemetry
        gone = []
        for node in self._unlisted:
            record = self.store.get(node)
            if record is None or now - record.received_at > max(
                FORGET_AFTER_STALE * stale.stale_after_s(record.digest.interval_s),
                FORGET_AFTER_MIN_S,
            ):
                gone.append(node)
        for node in gone:
            self.forget_node(node)
        self.forgotten_nodes += len(gone)
        return gone

    @property
    def unlisted_nodes(self) -> int:
        """How many nodes with telemetry no Node object lists."""
        return len(self._unlisted)

    def set_node_labels(self, node: str, labels: Mapping[str, str]) -> None:
        """Labels of a Node object (from a watch); they win over the agent's labels."""
        self._node_labels[node] = dict(labels)
        self._unlisted.discard(node)
        rack, rdma = self._rack_and_rdma(self._labels_of(node))
        self.table.set_labels(node, rack, rdma)

    def forget_node(self, node: str) -> None:
        """Drop everything about a node that left the cluster (or went silent, unlisted)."""
        self.store.forget(node)
        self._unlisted.discard(node)
        self._node_labels.pop(node, None)
        self._holders_seen.pop(node, None)
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
        if demand.uid not in self._demands and self.policy.spec.fragmentation.enabled:
            self._mix.observe(demand)
        self._demands[demand.uid] = demand
        self._demands.move_to_end(demand.uid)
        while len(self._demands) > DEMAND_CACHE_SIZE:
            self._demands.popitem(last=False)

    @property
    def mix(self) -> DemandMix:
        """The shape mix in force (empty until fragmentation scoring has seen requests)."""
        return self._mix.mix

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
        self._reserved.discard(assignment.pod_uid)
        self._hold(assignment, expires)

    def reserve(self, assignment: Assignment) -> None:
        """Hold GPUs for a pod from its prioritize until its bind (``RESERVE_TTL_S`` at most).

        kube-scheduler binds in the background while it already filters the next pod: without
        the hold, that pod's filter would still see the GPUs free and its bind be refused.
        """
        self._reserved.add(assignment.pod_uid)
        self._hold(assignment, self.clock.monotonic() + RESERVE_TTL_S)

    def reserved(self, pod_uid: str) -> bool:
        """Whether the pod's assignment is a reservation (prioritized, not bound yet)."""
        return pod_uid in self._reserved and self.allocations.get(pod_uid) is not None

    def _hold(self, assignment: Assignment, expires: float | None) -> None:
        held = self._held.get(assignment.pod_uid)
        if held is not None and held.node == assignment.node and not assignment.whole:
            assignment = held.apply(assignment)  # what the pod holds, not what bind chose
        moved_from = self.allocations.add(assignment, expires)
        for node in {assignment.node, moved_from} - {None}:
            self._write_allocations(str(node))

    def release(self, pod_uid: str) -> None:
        """Free a pod's GPUs (bind failed, pod deleted)."""
        self._reserved.discard(pod_uid)
        self._held.pop(pod_uid, None)
        node = self.allocations.remove(pod_uid)
        if node is not None:
            self._write_allocations(node)

    def expire(self) -> None:
        """Drop assumed assignments and reservations whose time is up."""
        for node in self.allocations.expire(self.clock.monotonic()):
            self._write_allocations(node)
        if self._reserved:
            self._reserved = {u for u in self._reserved if self.allocations.get(u) is not None}
        if self._held:
            self._held = {u: h for u, h in self._held.items() if self.allocations.get(u)}

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
        rack, rdma = rack.copy(), rdma.copy()
        for i, node_labels in enumerate(labels):
            if node_labels:
                name, flag = self._rack_and_rdma(node_labels)
                rack[i] = self.table.rack_id(name)
                rdma[i] = flag
        return rack, rdma

    def context(self, demand: PodDemand) -> Context:
        """The time, plus where the pod's group runs and how much room each rack has."""
        now = self.clock.monotonic()
        if demand.group is None:
            return Context(now=now, mix=self.mix)
        racks = {
            self.table.column("rack")[row]
            for node in self.allocations.nodes_of_group(demand.group)
            if (row := self.table.row(node)) is not None
        }
        group_racks = np.array(sorted(r for r in racks if r >= 0), dtype=np.int64)
        return Context(
            now=now, group_racks=group_racks, rack_free=self._rack_free(demand), mix=self.mix
        )

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
        if not self.allocations.holds_gpus(node):
            return []
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
        by_index = (
            dict(zip(map(int, record.digest.column("index")), record.digest.uuids, strict=True))
            if record
            else {}
        )
        return tuple(by_index.get(i, "") for i in indices)

    # -- internals --------------------------------------------------------------------------
    def _labels_of(self, node: str) -> Mapping[str, str]:
        record = self.store.get(node)
        agent = record.digest.labels if record else {}
        return {**agent, **self._node_labels.get(node, {})}

    def _rack_and_rdma(self, labels: Mapping[str, str]) -> tuple[str | None, bool]:
        topo = self.policy.spec.topology
        rack = labels.get(topo.rack_label) or (
            labels.get(topo.rack_label_fallback) if topo.rack_label_fallback else None
        )
        return rack, labels.get(RDMA_LABEL, "").lower() == "true"

    def _write_nodes(self, nodes: Sequence[str]) -> None:
        """Write the telemetry part of these nodes' rows from their last reports."""
        records = [(node, record) for node in nodes if (record := self.store.get(node))]
        if not records:
            return
        racks, rdmas, driver_ok, received, interval, counts = [], [], [], [], [], []
        hot: list[tuple[int, NodeRecord]] = []  # (first GPU's row, record) of nodes with state
        at = 0
        for node, record in records:
            d = record.digest
            rack, rdma = self._rack_and_rdma(self._labels_of(node))
            racks.append(rack)
            rdmas.append(rdma)
            driver_ok.append(d.driver_ok)
            received.append(record.received_at)
            interval.append(d.interval_s)
            counts.append(len(d.uuids))
            if record.thermal:
                hot.append((at, record))
            at += len(d.uuids)
        # One row per GPU in GPU_REPORT_COLUMNS order: the digests' rows, then the thermal
        # state of the GPUs that have one (NaN below_since and not hot for the others).
        digests = np.frombuffer(
            b"".join(record.digest.gpus for _, record in records), dtype=np.float64
        ).reshape(at, len(DIGEST_COLUMNS))
        gpus = np.empty((at, len(GPU_REPORT_COLUMNS)), dtype=np.float64)
        gpus[:, _FROM_DIGEST] = digests
        gpus[:, _BELOW_SINCE] = np.nan
        gpus[:, _HOT] = 0.0
        for first, record in hot:
            for i, uuid in enumerate(record.digest.uuids):
                state = record.thermal.get(uuid)
                if state is not None:
                    gpus[first + i, _BELOW_SINCE] = (
                        np.nan if state.below_since is None else state.below_since
                    )
                    gpus[first + i, _HOT] = state.hot_since is not None
        self.table.write_nodes(
            [node for node, _ in records],
            received_at=received,
            interval_s=interval,
            driver_ok=driver_ok,
            racks=racks,
            rdma=rdmas,
            gpus=gpus,
            counts=counts,
        )
        for node, _ in records:
            if self.allocations.holds_gpus(node):
                self._write_allocations(node)
            else:
                # Nothing assigned: the row's assignment columns are already empty (the last
                # release rewrote them) and all memory in use is unaccounted, as just written.
                self._write_room(node)

    def _write_allocations(self, node: str) -> None:
        blocks, whole, pods = self.allocations.totals(node)
        unaccounted: dict[int, float] = {}
        owners: dict[int, list[tuple[Assignment, float]]] = {}
        lending = self.policy.spec.lends_idle_blocks
        record = self.store.get(node)
        unread: dict[int, set[str]] = {}
        free: dict[int, float] = {}
        if record is not None:
            d = record.digest
            for index, used, total in zip(
                d.column("index"), d.column("memory_used_mib"), d.column("memory_total_mib"),
                strict=True,
            ):  # fmt: skip
                i = int(index)
                ours = pods.get(i)
                if math.isnan(used):
                    if ours:
                        unread[i] = ours
                    continue
                if not math.isnan(total):
                    free[i] = total - used
                if ours:
                    # A pod's use explains memory up to its budget: what it uses past its blocks
                    # counts against the GPU (never less than the real use).
                    by_pod: dict[str, float] = {}
                    for at, uid, mib in d.pods:
                        if at == i and uid in ours:
                            by_pod[uid] = by_pod.get(uid, 0.0) + mib
                    explained = sum(min(mib, self._budget_mib(uid)) for uid, mib in by_pod.items())
                    used = max(used - explained, 0.0)
                    if lending:  # only pods whose use is measured: their processes are seen
                        found = ((self.allocations.get(uid), mib) for uid, mib in by_pod.items())
                        owners[i] = [(a, mib) for a, mib in found if a is not None]
                unaccounted[i] = used
        if record is None and not blocks and not whole and node not in self.table:
            return
        lent: dict[int, int] = {}
        if record is not None and lending:
            args = self.policy.spec.memory
            lent = self.lending.lent(node, record.received_at, owners, args, unread, free)
        # Best-effort pods sit in lent blocks first: the GPU's own free room is what is left
        # after those they fill (pods of other classes may take it).
        best_effort: dict[int, int] = {}
        for a in self.allocations.on_node(node) if lent else ():
            if a.qos is QosClass.BEST_EFFORT and not a.whole:
                for i in a.gpu_indices:
                    best_effort[i] = best_effort.get(i, 0) + a.mem_blocks
        borrowed = {i: min(n, lent[i]) for i, n in best_effort.items() if i in lent}
        self.table.write_allocations(node, blocks, whole, unaccounted, lent, borrowed)
        self._write_room(node)

    def lent_blocks(self, node: str) -> dict[str, int]:
        """Blocks the node's GPUs lend to best-effort pods, by GPU uuid.

        The agent's device plugin advertises them to kubelet.
        """
        row = self.table.row(node)
        if not self.policy.spec.lends_idle_blocks or row is None:
            return {}
        lent = self.table.column("lent_blocks")[row]
        at = np.flatnonzero(lent).tolist()
        uuids = self.gpu_uuids(node, at) if at else ()
        return {u: int(lent[i]) for u, i in zip(uuids, at, strict=True) if u}

    def borrowers_to_evict(self) -> list[tuple[Assignment, int]]:
        """Best-effort pods to evict to give back lent blocks an owner needs again.

        Each with the blocks its GPU is short; nothing unless idle blocks are lent.
        """
        if not self.policy.spec.lends_idle_blocks:
            return []
        col = self.table.column
        args = self.policy.spec.memory
        out: list[tuple[Assignment, int]] = []
        for node in self.store.nodes():
            row = self.table.row(node)
            if row is None or not self.allocations.holds_gpus(node):
                continue
            if not self.lending.settled(node, args):
                continue  # which pods are idle is not known yet (a restart): nothing lent either
            room = memory.room_blocks(
                col("memory_total_mib")[row],
                col("unaccounted_used_mib")[row],
                col("allocated_blocks")[row],
                args,
                col("lent_blocks")[row],
            )
            unread = np.isnan(col("unaccounted_used_mib")[row])  # not judged without a reading
            short = {i: int(-r) for i, r in enumerate(room) if r < 0 and not unread[i]}
            if not short:
                continue
            on_node = [a for a in self.allocations.on_node(node) if not self.reserved(a.pod_uid)]
            for i, blocks in short.items():
                on_gpu = [a for a in on_node if i in a.gpu_indices]
                out.extend((a, blocks) for a in lending_rules.borrowers_to_evict(on_gpu, blocks))
        return out

    def _budget_mib(self, pod_uid: str) -> float:
        """GPU memory a pod was given at bind: its blocks, or all of a whole GPU."""
        a = self.allocations.get(pod_uid)
        if a is None or a.whole or not a.mem_blocks:
            return math.inf
        return float(a.mem_blocks * self.policy.spec.memory.block_mib)

    def _write_room(self, node: str) -> None:
        """Mark the node's room (free blocks, idle GPUs: the inputs of a rack's room) stale.

        Counted again only when a job group's racks are summed (``_refresh_room``), for every
        marked row at once: a telemetry push then costs one set insertion here.
        """
        row = self.table.row(node)
        if row is not None:
            self._room_dirty.add(row)

    def _refresh_room(self) -> None:
        """Recount free blocks and idle GPUs of the rows written since the last count."""
        if not self._room_dirty:
            return
        rows = np.fromiter(self._room_dirty, dtype=np.int64, count=len(self._room_dirty))
        self._room_dirty.clear()
        col = self.table.column
        args = self.policy.spec.memory
        usable = col("present")[rows] & (col("health")[rows] != Health.UNHEALTHY)
        unaccounted, allocated = col("unaccounted_used_mib")[rows], col("allocated_blocks")[rows]
        total, borrowed = col("memory_total_mib")[rows], col("borrowed_blocks")[rows]
        free = memory.free_blocks(total, unaccounted, allocated, args, borrowed)
        idle = memory.is_idle(unaccounted, allocated, col("whole_taken")[rows], args)
        self.table.set_room(
            rows,
            np.where(usable, free, 0).sum(axis=1).astype(np.float64),
            (idle & usable).sum(axis=1).astype(np.float64),
        )

    def _rack_free(self, demand: PodDemand) -> npt.NDArray[np.float64]:
        """Free room per rack id for the pod's kind of request (blocks or whole GPUs).

        Summed again only after a row changed: job groups arrive in bursts of pods.
        """
        if self.table.rack_count == 0:
            return np.zeros(0)
        whole = demand.needs_whole_gpu
        stamp = (self.table.writes, self.table.rack_count, id(self.policy))
        cached = self._rack_free_cache.get(whole)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        self._refresh_room()
        col = self.table.column
        rack = col("rack")
        room = col("idle_gpus") if whole else col("free_blocks")
        known = (rack >= 0) & col("known")
        free = np.bincount(
            rack[known], weights=np.nan_to_num(room[known]), minlength=self.table.rack_count
        ).astype(np.float64)
        free.flags.writeable = False
        self._rack_free_cache[whole] = (stamp, free)
        return free


@dataclasses.dataclass(frozen=True, slots=True)
class _Held:
    """The GPUs a report showed a pod holds on its node."""

    node: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]

    def apply(self, a: Assignment) -> Assignment:
        """The assignment naming these GPUs."""
        return dataclasses.replace(a, gpu_indices=self.gpu_indices, gpu_uuids=self.gpu_uuids)


_AS_TABLE = {"memory_used_mib": "unaccounted_used_mib"}  # until assigned pods are subtracted
_FROM_DIGEST = [GPU_REPORT_COLUMNS.index(_AS_TABLE.get(c, c)) for c in DIGEST_COLUMNS]
"""Where each of a digest's GPU columns goes in a ``GPU_REPORT_COLUMNS`` row."""
_BELOW_SINCE, _HOT = GPU_REPORT_COLUMNS.index("below_since"), GPU_REPORT_COLUMNS.index("hot")
