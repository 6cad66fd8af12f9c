"""A columnar table of nodes: one row per node, one column slot per GPU index.

Rows are written when telemetry or assignments change; a request only gathers rows, so a verb
over 5,000 nodes is a few numpy take operations, not 5,000 objects. Row 0 is a blank row that
stands in for nodes nobody has heard of; ``columns`` says which columns there are. Imports
numpy, ``fields``, the policy and ``state.columns``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_extender.policy.batch import NodeBatch
from scheduler_extender.policy.rules import thermal
from scheduler_extender.state import columns
from scheduler_extender.state.columns import ALL_COLUMNS, AS_GATHERED, GPU_FLOAT
from scheduler_extender.telemetry.fields import KEPT


def _take(column: npt.NDArray[Any], rows: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
    """Some rows of a column: ``take`` is a few times faster than ``column[rows]`` in 2-D.

    Only for contiguous columns: ``take`` copies a strided view whole first.
    """
    return column.take(rows, axis=0)


class NodeTable:
    """Columns of per-node and per-GPU values. Not thread-safe: use one event loop."""

    def __init__(self, rows: int = 64, gpus: int = 8) -> None:
        self._index: dict[str, int] = {}
        self.index_version = 0
        """Bumped whenever a name gains or loses a row (caches of name → row check it)."""
        self._writes = 0
        self._names: list[str | None] = [None]
        self._free_rows: list[int] = []
        self._racks: dict[str, int] = {}
        self._rows = max(rows, 2)
        self._gpus = max(gpus, 1)
        self._cols: dict[str, npt.NDArray[Any]] = {}
        self._floats = np.zeros((0, 0, len(GPU_FLOAT)))
        """(rows, GPUs, float columns): the per-GPU float columns are views of it."""
        self._alloc(self._rows, self._gpus)

    # -- layout -----------------------------------------------------------------------------
    def _alloc(self, rows: int, gpus: int) -> None:
        old = self._cols
        new: dict[str, npt.NDArray[Any]] = {}
        floats = np.full((rows, gpus, len(GPU_FLOAT)), np.nan)
        was = self._floats
        floats[: was.shape[0], : was.shape[1]] = was
        self._floats = floats
        for name in ALL_COLUMNS:
            if name in GPU_FLOAT:
                new[name] = floats[:, :, GPU_FLOAT.index(name)]
                continue
            col = columns.blank(name, rows, gpus)
            if name in old:
                prev = old[name]
                if prev.ndim == 1:
                    col[: prev.shape[0]] = prev
                else:
                    col[: prev.shape[0], : prev.shape[1]] = prev
            new[name] = col
        self._cols, self._rows, self._gpus = new, rows, gpus

    def _row_for(self, node: str) -> int:
        row = self._index.get(node)
        if row is not None:
            return row
        if self._free_rows:
            row = self._free_rows.pop()
            self._names[row] = node
        else:
            row = len(self._names)
            self._names.append(node)
            if row >= self._rows:
                self._alloc(self._rows * 2, self._gpus)
        self._index[node] = row
        self.index_version += 1
        return row

    @property
    def writes(self) -> int:
        """Row writes so far: unchanged means no row has changed."""
        return self._writes

    def _touch(self, row: int) -> None:
        # Every write gives the row a new version; cached verdicts of the row then lapse.
        self._writes += 1
        self._cols["version"][row] = self._writes

    def _touch_rows(self, rows: npt.NDArray[np.int64]) -> None:
        """``_touch`` for several distinct rows at once."""
        first = self._writes + 1
        self._writes += rows.size
        self._cols["version"][rows] = np.arange(first, self._writes + 1)

    def _ensure_gpus(self, count: int) -> None:
        if count > self._gpus:
            self._alloc(self._rows, max(count, self._gpus * 2))

    def rack_id(self, rack: str | None) -> int:
        """Interned id of a rack name; -1 for none."""
        if not rack:
            return -1
        return self._racks.setdefault(rack, len(self._racks))

    def rack_name(self, rack_id: int) -> str | None:
        """The rack name for an id."""
        for name, rid in self._racks.items():
            if rid == rack_id:
                return name
        return None

    @property
    def rack_count(self) -> int:
        """How many rack names have been seen."""
        return len(self._racks)

    def __contains__(self, node: object) -> bool:
        return node in self._index

    def names(self) -> list[str]:
        """Every node with a row."""
        return [n for n in self._names[1:] if n is not None]

    @property
    def capacity(self) -> int:
        """Rows allocated (the length of every column)."""
        return self._rows

    @property
    def gpu_slots(self) -> int:
        """Width of the per-GPU columns."""
        return self._gpus

    # -- writes -----------------------------------------------------------------------------
    def write_node(
        self,
        node: str,
        *,
        received_at: float,
        interval_s: float,
        driver_ok: bool,
        rack: str | None,
        rdma: bool,
        gpus: npt.NDArray[np.float64],
    ) -> None:
        """Replace the telemetry part of a node's row.

        ``gpus`` has one row per reported GPU and one column per ``GPU_REPORT_COLUMNS`` entry:
        its index, the float readings (NaN = unknown), hot (0/1) and health code.
        """
        index = gpus[:, 0].astype(np.int64)
        slots = index.tolist()
        self._ensure_gpus(max(slots) + 1 if slots else 0)
        row = self._row_for(node)
        self._touch(row)
        self._write_node_part(row, received_at, interval_s, driver_ok, self.rack_id(rack), rdma)
        n = len(slots)
        if n and slots == list(range(n)):
            # GPUs 0..n-1, the usual case: slices, not fancy indexing, and only the slots past
            # the last GPU are blanked.
            at: slice | npt.NDArray[np.int64] = slice(0, n)
            blank: slice | None = slice(n, None) if n < self._gpus else None
        else:
            at, blank = index, slice(None)
        self._write_gpus(row, at, blank, gpus)

    def _write_gpus(
        self,
        rows: int | npt.NDArray[np.int64],
        at: slice | npt.NDArray[np.int64],
        blank: slice | None,
        gpus: npt.NDArray[np.float64],
    ) -> None:
        """Write GPU slots ``at`` of one row or of several, emptying slots ``blank`` first.

        ``gpus`` is in ``GPU_REPORT_COLUMNS`` order, with a leading row axis for several rows.
        """
        c = self._cols
        if blank is not None:
            self._floats[rows, blank] = np.nan
            for name in ("present", "hot", "health"):
                c[name][rows, blank] = columns.blank(name, 1, 1)[0, 0]
        self._floats[rows, at] = gpus[..., 1 : 1 + len(GPU_FLOAT)]
        c["present"][rows, at] = True
        c["hot"][rows, at] = gpus[..., -2] > 0
        c["health"][rows, at] = gpus[..., -1]

    def write_nodes(
        self,
        nodes: Sequence[str],
        *,
        received_at: Sequence[float],
        interval_s: Sequence[float],
        driver_ok: Sequence[bool],
        racks: Sequence[str | None],
        rdma: Sequence[bool],
        gpus: npt.NDArray[np.float64],
        counts: Sequence[int],
    ) -> None:
        """``write_node`` for several nodes (each at most once), in one go where it can.

        ``gpus`` holds the nodes' GPUs one after the other, ``counts[i]`` of them for
        ``nodes[i]``. When there are several nodes and each reports GPUs 0..n-1 for the same n
        (the usual case), every column is written once for all their rows; otherwise node by
        node (a row's scalar writes cost a fifth of a fancy-indexed one).
        """
        n = counts[0] if len(counts) else 0
        index = gpus[:, 0]
        if (
            len(nodes) < 2
            or any(k != n for k in counts)
            or not n
            or not ((index.reshape(len(nodes), n) == np.arange(n)).all())
        ):
            at = 0
            for i, node in enumerate(nodes):
                self.write_node(
                    node, received_at=received_at[i], interval_s=interval_s[i],
                    driver_ok=driver_ok[i], rack=racks[i], rdma=rdma[i],
                    gpus=gpus[at : at + counts[i]],
                )  # fmt: skip
                at += counts[i]
            return
        self._ensure_gpus(n)
        rows = np.fromiter(map(self._row_for, nodes), dtype=np.int64, count=len(nodes))
        self._touch_rows(rows)
        rack_ids = [self.rack_id(rack) for rack in racks]
        self._write_node_part(rows, received_at, interval_s, driver_ok, rack_ids, rdma)
        blank = slice(n, None) if n < self._gpus else None
        self._write_gpus(rows, slice(0, n), blank, gpus.reshape(len(nodes), n, gpus.shape[1]))

    def _write_node_part(
        self,
        at: int | npt.NDArray[np.int64],
        received_at: float | Sequence[float],
        interval_s: float | Sequence[float],
        driver_ok: bool | Sequence[bool],
        rack_id: int | Sequence[int],
        rdma: bool | Sequence[bool],
    ) -> None:
        """The per-node telemetry columns of one row (scalars) or of several (sequences)."""
        c = self._cols
        c["known"][at] = True
        c["received_at"][at] = received_at
        c["interval_s"][at] = interval_s
        c["driver_ok"][at] = driver_ok
        c["rack"][at] = rack_id
        c["rdma"][at] = rdma

    def set_room(
        self,
        rows: npt.NDArray[np.int64],
        free_blocks: npt.NDArray[np.float64],
        idle_gpus: npt.NDArray[np.float64],
    ) -> None:
        """Nodes' free capacity in all, by row (for choosing a rack for a new job group).

        Not a row write: a node's verdicts do not depend on it, so versions stay.
        """
        self._cols["free_blocks"][rows] = free_blocks
        self._cols["idle_gpus"][rows] = idle_gpus

    def write_allocations(
        self,
        node: str,
        blocks: dict[int, int],
        whole: set[int],
        unaccounted: dict[int, float],
        lent: dict[int, int] | None = None,
        borrowed: dict[int, int] | None = None,
    ) -> None:
        """Replace a node's assignment columns, its unexplained memory and its lent blocks."""
        if blocks or whole:
            self._ensure_gpus(max([*blocks, *whole]) + 1)
        row = self._row_for(node)
        self._touch(row)
        c = self._cols
        c["allocated_blocks"][row] = 0
        c["lent_blocks"][row] = 0
        c["borrowed_blocks"][row] = 0
        c["whole_taken"][row] = False
        for i, n in blocks.items():
            c["allocated_blocks"][row, i] = n
        for i, n in (lent or {}).items():
            if i < self._gpus:
                c["lent_blocks"][row, i] = n
        for i, n in (borrowed or {}).items():
            if i < self._gpus:
                c["borrowed_blocks"][row, i] = n
        for i in whole:
            c["whole_taken"][row, i] = True
        for i, mib in unaccounted.items():
            if i < self._gpus:
                c["unaccounted_used_mib"][row, i] = mib

    def set_host_room(self, node: str, cpu_milli: float, memory_mib: float) -> None:
        """A node's free host CPU and memory (NaN = unknown)."""
        row = self._row_for(node)
        self._touch(row)
        self._cols["host_cpu_free"][row] = cpu_milli
        self._cols["host_memory_free"][row] = memory_mib

    def set_labels(self, node: str, rack: str | None, rdma: bool) -> None:
        """Set a node's rack and RDMA flag (from a Node object or the agent's labels)."""
        row = self._row_for(node)
        self._touch(row)
        self._cols["rack"][row] = self.rack_id(rack)
        self._cols["rdma"][row] = rdma

    def remove(self, node: str) -> None:
        """Delete a node's row; the row is reused later."""
        row = self._index.pop(node, None)
        if row is None:
            return
        for name in ALL_COLUMNS:
            self._cols[name][row] = columns.blank(name, 1, self._gpus)[0]
        self._names[row] = None
        self._free_rows.append(row)
        self._touch(row)
        self.index_version += 1

    # -- reads ------------------------------------------------------------------------------
    def rows(self, names: Sequence[str]) -> npt.NDArray[np.int64]:
        """Row of each name; 0 (the blank row) for unknown names."""
        return np.array(list(map(self._index.get, names, repeat(0))), dtype=np.int64)

    def all_rows(self) -> npt.NDArray[np.int64]:
        """Rows of every node."""
        return np.fromiter(self._index.values(), dtype=np.int64, count=len(self._index))

    def row(self, node: str) -> int | None:
        """The row of one node, if it has one."""
        return self._index.get(node)

    def column(self, name: str) -> npt.NDArray[Any]:
        """One whole column (read-only by convention)."""
        return self._cols[name]

    def gather(
        self, rows: npt.NDArray[np.int64], now: float, args: thermal.ThermalArgs
    ) -> NodeBatch:
        """The batch the policy decides on, for the given rows."""
        c = self._cols
        floats = _take(self._floats, rows)  # one take of the block, then a view per column
        per_gpu = {name: floats[:, :, k] for k, name in enumerate(GPU_FLOAT)}
        return NodeBatch(
            **{name: _take(c[name], rows) for name in AS_GATHERED},
            readings={name: per_gpu[name] for name in KEPT},
            unaccounted_used_mib=per_gpu["unaccounted_used_mib"],
            age_s=now - _take(c["received_at"], rows),
            excluded_until=thermal.excluded_until(
                _take(c["hot"], rows), per_gpu["below_since"], args
            ),
        )
