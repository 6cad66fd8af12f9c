"""The table's rows written from the nodes' last reports and from their GPU assignments.

``write_telemetry`` writes the telemetry part of several nodes' rows in one go (the digests'
floats and the GPUs' thermal state); ``write_allocations`` one node's assignment columns: the
blocks and whole GPUs taken, the memory in use that no assigned pod explains, and the blocks
lent to best-effort pods. Imports numpy, ``domain``, ``policy``, ``telemetry`` and the
``state`` ledgers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from scheduler_extender.domain import Assignment, QosClass
from scheduler_extender.policy.document import PolicySpec
from scheduler_extender.state.allocations import Allocations
from scheduler_extender.state.columns import GPU_REPORT_COLUMNS
from scheduler_extender.state.lending import Lending
from scheduler_extender.state.table import NodeTable
from scheduler_extender.telemetry.report import DIGEST_COLUMNS
from scheduler_extender.telemetry.store import NodeRecord

Place = Callable[[str], tuple[str | None, bool]]
"""A node's rack (None: none) and RDMA flag, as its labels say."""


def write_telemetry(
    table: NodeTable, records: Sequence[tuple[str, NodeRecord]], place: Place
) -> None:
    """Write the telemetry part of these nodes' rows from their records (one each)."""
    racks, rdmas, driver_ok, received, interval, counts = [], [], [], [], [], []
    hot: list[tuple[int, NodeRecord]] = []  # (first GPU's row, record) of nodes with state
    at = 0
    for node, record in records:
        d = record.digest
        rack, rdma = place(node)
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
    table.write_nodes(
        [node for node, _ in records],
        received_at=received,
        interval_s=interval,
        driver_ok=driver_ok,
        racks=racks,
        rdma=rdmas,
        gpus=gpus,
        counts=counts,
    )


def write_allocations(
    table: NodeTable,
    node: str,
    allocations: Allocations,
    record: NodeRecord | None,
    lending: Lending,
    spec: PolicySpec,
) -> bool:
    """Write the node's assignment columns; False when there was nothing to write.

    Nothing is written for a node with no report, no assignment and no row.
    """
    blocks, whole, pods = allocations.totals(node)
    unaccounted: dict[int, float] = {}
    owners: dict[int, list[tuple[Assignment, float]]] = {}
    lends = spec.lends_idle_blocks
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
                explained = sum(
                    min(mib, _budget_mib(allocations, uid, spec)) for uid, mib in by_pod.items()
                )
                used = max(used - explained, 0.0)
                if lends:  # only pods whose use is measured: their processes are seen
                    found = ((allocations.get(uid), mib) for uid, mib in by_pod.items())
                    owners[i] = [(a, mib) for a, mib in found if a is not None]
            unaccounted[i] = used
    if record is None and not blocks and not whole and node not in table:
        return False
    lent: dict[int, int] = {}
    if record is not None and lends:
        args = spec.memory
        lent = lending.lent(node, record.received_at, owners, args, unread, free)
    # Best-effort pods sit in lent blocks first: the GPU's own free room is what is left
    # after those they fill (pods of other classes may take it).
    best_effort: dict[int, int] = {}
    for a in allocations.on_node(node) if lent else ():
        if a.qos is QosClass.BEST_EFFORT and not a.whole:
            for i in a.gpu_indices:
                best_effort[i] = best_effort.get(i, 0) + a.mem_blocks
    borrowed = {i: min(n, lent[i]) for i, n in best_effort.items() if i in lent}
    table.write_allocations(node, blocks, whole, unaccounted, lent, borrowed)
    return True


def _budget_mib(allocations: Allocations, pod_uid: str, spec: PolicySpec) -> float:
    """GPU memory a pod was given at bind: its blocks, or all of a whole GPU."""
    a = allocations.get(pod_uid)
    if a is None or a.whole or not a.mem_blocks:
        return math.inf
    return float(a.mem_blocks * spec.memory.block_mib)


_AS_TABLE = {"memory_used_mib": "unaccounted_used_mib"}  # until assigned pods are subtracted
_FROM_DIGEST = [GPU_REPORT_COLUMNS.index(_AS_TABLE.get(c, c)) for c in DIGEST_COLUMNS]
"""Where each of a digest's GPU columns goes in a ``GPU_REPORT_COLUMNS`` row."""
_BELOW_SINCE, _HOT = GPU_REPORT_COLUMNS.index("below_since"), GPU_REPORT_COLUMNS.index("hot")
