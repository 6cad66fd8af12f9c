"""Blocks lent to best-effort pods, read back from the table's rows.

By GPU uuid for the agent's device plugin (which advertises them to kubelet), and the
best-effort pods to evict once an owner needs its blocks again (the leader's remediation round
evicts them). The rules of lending are ``state.lending``'s. Imports numpy, ``domain``,
``policy`` and the ``state`` ledgers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from scheduler_extender.domain import Assignment
from scheduler_extender.policy.rules import memory
from scheduler_extender.state import lending as lending_rules
from scheduler_extender.state.allocations import Allocations
from scheduler_extender.state.table import NodeTable


def lent_by_uuid(
    table: NodeTable, node: str, uuids: Callable[[str, Sequence[int]], tuple[str, ...]]
) -> dict[str, int]:
    """Blocks the node's GPUs lend, by GPU uuid (``uuids``: a node's GPU uuids by index)."""
    row = table.row(node)
    if row is None:
        return {}
    lent = table.column("lent_blocks")[row]
    at = np.flatnonzero(lent).tolist()
    found = uuids(node, at) if at else ()
    return {u: int(lent[i]) for u, i in zip(found, at, strict=True) if u}


def borrowers_due(
    table: NodeTable,
    nodes: Iterable[str],
    allocations: Allocations,
    lending: lending_rules.Lending,
    args: memory.MemoryArgs,
    reserved: Callable[[str], bool],
) -> list[tuple[Assignment, int]]:
    """Best-effort pods of ``nodes`` to evict to give back lent blocks an owner needs again.

    Each with the blocks its GPU is short; ``reserved``: whether a pod's assignment is a
    reservation (never evicted).
    """
    col = table.column
    out: list[tuple[Assignment, int]] = []
    for node in nodes:
        row = table.row(node)
        if row is None or not allocations.holds_gpus(node):
            continue
        if not lending.settled(node, args):
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
        on_node = [a for a in allocations.on_node(node) if not reserved(a.pod_uid)]
        for i, blocks in short.items():
            on_gpu = [a for a in on_node if i in a.gpu_indices]
            out.extend((a, blocks) for a in lending_rules.borrowers_to_evict(on_gpu, blocks))
    return out
