"""Free room per rack (blocks, idle GPUs), for choosing a rack for a new job group.

A write marks the row's room stale; the room of the marked rows is counted again only when a
job group's racks are summed, for every marked row at once: a telemetry push then costs one set
insertion here. The sums per rack are kept until a row changes: job groups arrive in bursts of
pods. Imports numpy, ``domain``, ``policy`` and ``state.table``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scheduler_extender.domain import Health
from scheduler_extender.policy.document import Policy
from scheduler_extender.policy.rules import memory
from scheduler_extender.state.table import NodeTable


class RackRoom:
    """Rows whose room is stale, and the free room per rack last summed."""

    def __init__(self) -> None:
        self._dirty: set[int] = set()
        """Rows whose free room (blocks, idle GPUs) must be recounted before racks are summed."""
        self._cache: dict[bool, tuple[tuple[int, int, int], npt.NDArray[np.float64]]] = {}
        """Free room per rack, by whole-GPU or blocks, with the (writes, racks, policy) it is of."""

    def mark(self, table: NodeTable, node: str) -> None:
        """Mark the node's room (free blocks, idle GPUs: the inputs of a rack's room) stale."""
        row = table.row(node)
        if row is not None:
            self._dirty.add(row)

    def _refresh(self, table: NodeTable, args: memory.MemoryArgs) -> None:
        """Recount free blocks and idle GPUs of the rows written since the last count."""
        if not self._dirty:
            return
        rows = np.fromiter(self._dirty, dtype=np.int64, count=len(self._dirty))
        self._dirty.clear()
        col = table.column
        usable = col("present")[rows] & (col("health")[rows] != Health.UNHEALTHY)
        unaccounted, allocated = col("unaccounted_used_mib")[rows], col("allocated_blocks")[rows]
        total, borrowed = col("memory_total_mib")[rows], col("borrowed_blocks")[rows]
        free = memory.free_blocks(total, unaccounted, allocated, args, borrowed)
        idle = memory.is_idle(unaccounted, allocated, col("whole_taken")[rows], args)
        table.set_room(
            rows,
            np.where(usable, free, 0).sum(axis=1).astype(np.float64),
            (idle & usable).sum(axis=1).astype(np.float64),
        )

    def per_rack(self, table: NodeTable, policy: Policy, whole: bool) -> npt.NDArray[np.float64]:
        """Free room per rack id: idle GPUs when ``whole``, else free blocks.

        Summed again only after a row changed.
        """
        if table.rack_count == 0:
            return np.zeros(0)
        stamp = (table.writes, table.rack_count, id(policy))
        cached = self._cache.get(whole)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        self._refresh(table, policy.spec.memory)
        col = table.column
        rack = col("rack")
        room = col("idle_gpus") if whole else col("free_blocks")
        known = (rack >= 0) & col("known")
        free = np.bincount(
            rack[known], weights=np.nan_to_num(room[known]), minlength=table.rack_count
        ).astype(np.float64)
        free.flags.writeable = False
        self._cache[whole] = (stamp, free)
        return free
