"""The per-row caches of the request path.

``FactsCache``: each node's ``gpu_facts`` (what its GPUs offer whatever the pod asks), worked
out once per row version and shared by every demand shape. ``VerdictCache``: per demand shape
(class, blocks or whole GPUs), each node's GPU verdict, kept until the node's row changes or one
of its GPUs leaves its cool-down. Both go by the table's row versions: a request recomputes
only the rows written since the last request of that shape, with the same pure ``gpu_verdict``
the policy defines.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_extender.domain import PodDemand
from scheduler_extender.policy.document import Policy
from scheduler_extender.policy.rules.fragmentation import EMPTY_MIX, DemandMix, HostRoom
from scheduler_extender.policy.verdict import GpuFacts, gpu_facts, gpu_verdict
from scheduler_extender.state.table import NodeTable

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

DemandKey = tuple[int, int, int, int, int]


def demand_key(demand: PodDemand) -> DemandKey:
    """What a GPU verdict depends on: the class (weights, whole-GPU rule) and the amounts.

    Host requests count too: fragmentation scoring takes them from the node's host room.
    """
    return (
        int(demand.qos),
        demand.mem_blocks,
        demand.whole_gpus,
        demand.cpu_milli,
        demand.host_memory_mib,
    )


@dataclass(slots=True)
class _Verdicts:
    version: IntArray
    reason: IntArray
    gpu_sum: FloatArray
    valid_until: FloatArray
    gpus: IntArray
    """(rows, k): the GPU slots bind would choose, -1 where the node does not fit."""

    @classmethod
    def empty(cls, rows: int, k: int) -> _Verdicts:
        return cls(
            version=np.full(rows, -1, dtype=np.int64),
            reason=np.zeros(rows, dtype=np.int64),
            gpu_sum=np.zeros(rows),
            valid_until=np.full(rows, -np.inf),
            gpus=np.full((rows, k), -1, dtype=np.int64),
        )

    def grow(self, rows: int) -> None:
        old = len(self.version)
        if rows <= old:
            return
        bigger = _Verdicts.empty(rows, self.gpus.shape[1])
        for name in ("version", "reason", "gpu_sum", "valid_until", "gpus"):
            getattr(bigger, name)[:old] = getattr(self, name)
            setattr(self, name, getattr(bigger, name))


def distinct(rows: IntArray) -> IntArray:
    """The rows once each.

    Rows already in increasing order (most candidate lists) come back as they
    are: checking the order costs a fraction of sorting them.
    """
    if rows.size < 2 or bool((rows[1:] > rows[:-1]).all()):
        return rows
    return np.unique(rows)


_FACT_ARRAYS = (
    "base_reason",
    "healthy",
    "excluded_until",
    "capacity",
    "open_free",
    "lendable",
    "idle",
)
"""The ``GpuFacts`` fields kept as they are, rows first (``terms`` and ``host`` are apart)."""


class FactsCache:
    """``gpu_facts`` of every row, kept until the row is written again. Cleared with the policy."""

    def __init__(self) -> None:
        self._version = np.zeros(0, dtype=np.int64)
        self._arrays: dict[str, npt.NDArray[Any]] = {}
        self._gpus = -1
        self._last: tuple[IntArray, IntArray, GpuFacts] | None = None
        """The rows last asked for, their versions then, and the facts answered."""
        self.computed_rows = 0
        """Rows worked out so far (for tests and benchmarks)."""

    def clear(self) -> None:
        """Forget everything (the policy changed)."""
        self._version = np.zeros(0, dtype=np.int64)
        self._arrays = {}
        self._gpus = -1
        self._last = None

    def _fit_to(self, table: NodeTable, sample: GpuFacts) -> None:
        """Make room for every row of the table (a new GPU width starts over)."""
        rows = table.capacity
        if self._gpus != table.gpu_slots:
            self.clear()
            self._gpus = table.gpu_slots
        old = self._version.shape[0]
        if rows <= old:
            return
        version = np.full(rows, -1, dtype=np.int64)
        version[:old] = self._version
        self._version = version
        parts = {name: getattr(sample, name) for name in _FACT_ARRAYS}
        parts["host_cpu"], parts["host_memory"] = sample.host.cpu, sample.host.memory
        for name, part in parts.items():
            bigger = np.zeros((rows, *part.shape[1:]), dtype=part.dtype)
            if name in self._arrays:
                bigger[:old] = self._arrays[name]
            self._arrays[name] = bigger
        terms = np.zeros((sample.terms.shape[0], rows, self._gpus))  # (terms, rows, GPUs)
        if "terms" in self._arrays:
            terms[:, :old] = self._arrays["terms"]
        self._arrays["terms"] = terms

    def refresh(self, table: NodeTable, rows: IntArray, policy: Policy, now: float) -> bool:
        """Work out again the facts of the rows written since they were last; whether any was."""
        if self._gpus == table.gpu_slots and self._version.shape[0] >= table.capacity:
            stale = self._version[rows] != table.column("version")[rows]
            if not stale.any():
                return False
            todo = distinct(rows[stale])
        else:
            todo = distinct(rows)
        fresh = gpu_facts(table.gather(todo, now, policy.spec.thermal_throttling), policy)
        self._fit_to(table, fresh)
        a = self._arrays
        for name in _FACT_ARRAYS:
            a[name][todo] = getattr(fresh, name)
        a["terms"][:, todo] = fresh.terms
        a["host_cpu"][todo], a["host_memory"][todo] = fresh.host.cpu, fresh.host.memory
        self._version[todo] = table.column("version")[todo]
        self.computed_rows += int(todo.size)
        return True

    def take(self, table: NodeTable, rows: IntArray, policy: Policy, now: float) -> GpuFacts:
        """The facts of these rows; rows written since they were last worked out are redone.

        Asked for the same rows as last time, none of them redone since, it answers the same
        facts again (the verdicts of several shapes ask for the same rows).
        """
        redo = self.refresh(table, rows, policy, now)
        last = self._last
        if (
            not redo
            and last is not None
            and last[0].shape == rows.shape
            and (last[0] == rows).all()
            and (last[1] == self._version[rows]).all()
        ):
            return last[2]
        a = self._arrays
        facts = GpuFacts(
            **{name: a[name].take(rows, axis=0) for name in _FACT_ARRAYS},
            terms=a["terms"].take(rows, axis=1),
            host=HostRoom(a["host_cpu"].take(rows), a["host_memory"].take(rows)),
        )
        for part in (*(getattr(facts, name) for name in _FACT_ARRAYS), facts.terms):
            part.flags.writeable = False  # handed out again: nobody may change it
        facts.host.cpu.flags.writeable = facts.host.memory.flags.writeable = False
        self._last = (rows.copy(), self._version[rows], facts)
        return facts


class VerdictCache:
    """GPU verdicts per demand shape and row. Cleared when the policy changes."""

    def __init__(self, max_shapes: int = 256) -> None:
        self._shapes: OrderedDict[DemandKey, _Verdicts] = OrderedDict()
        self._max = max_shapes
        self._mix_version = 0
        self.facts = FactsCache()
        self.recomputed_rows = 0
        """Rows recomputed so far (for tests and benchmarks)."""

    def clear(self) -> None:
        """Forget everything (the policy changed)."""
        self._shapes.clear()
        self.facts.clear()

    def lookup(
        self,
        table: NodeTable,
        rows: IntArray,
        demand: PodDemand,
        policy: Policy,
        now: float,
        mix: DemandMix = EMPTY_MIX,
    ) -> tuple[IntArray, FloatArray, IntArray]:
        """(reason, gpu_sum, gpus) of each row for this demand (``gpus``: the slots chosen).

        Rows that changed since the shape's last request are recomputed.

        A new snapshot of the shape mix (fragmentation scoring) makes every verdict stale.
        """
        if mix.version != self._mix_version:
            self._shapes.clear()
            self._mix_version = mix.version
        key = demand_key(demand)
        entry = self._shapes.get(key)
        if entry is None:
            entry = _Verdicts.empty(table.capacity, max(demand.gpu_count, 1))
            self._shapes[key] = entry
            while len(self._shapes) > self._max:
                self._shapes.popitem(last=False)
        else:
            self._shapes.move_to_end(key)
        entry.grow(table.capacity)
        version = table.column("version")
        dirty = (entry.version[rows] != version[rows]) | (now >= entry.valid_until[rows])
        if dirty.any():
            todo = distinct(rows[dirty])
            facts = self.facts.take(table, todo, policy, now)
            verdict = gpu_verdict(facts, demand, policy, now, mix)
            entry.reason[todo] = verdict.reason
            entry.gpu_sum[todo] = verdict.gpu_sum
            entry.valid_until[todo] = verdict.valid_until
            width = verdict.gpus.shape[1]  # fewer GPU slots than asked for: no fit anyway
            entry.gpus[todo] = -1
            entry.gpus[todo, :width] = verdict.gpus
            entry.version[todo] = version[todo]
            self.recomputed_rows += int(todo.size)
        return entry.reason[rows], entry.gpu_sum[rows], entry.gpus[rows]
