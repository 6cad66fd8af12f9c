"""Caches that keep the request path a few array operations long.

``VerdictCache``: per demand shape (class, blocks or whole GPUs), each node's GPU verdict, kept
until the node's row changes or one of its GPUs leaves its cool-down. A request recomputes
only the rows that changed since the last request of that shape, with the same pure
``gpu_verdict`` the policy defines. ``NameSets``: the scheduler sends the same candidate list
again and again; the list's raw bytes map to its rows and to a ready answer template.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import orjson

from scheduler_extender.domain import PodDemand
from scheduler_extender.policy.combine import gpu_verdict
from scheduler_extender.policy.document import Policy
from scheduler_extender.policy.fragmentation import EMPTY_MIX, DemandMix
from scheduler_extender.state.table import NodeTable

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

DemandKey = tuple[int, int, int]


def demand_key(demand: PodDemand) -> DemandKey:
    """What a GPU verdict depends on: the class (weights, whole-GPU rule) and the amounts."""
    return (int(demand.qos), demand.mem_blocks, demand.whole_gpus)


@dataclass(slots=True)
class _Verdicts:
    version: IntArray
    reason: IntArray
    gpu_sum: FloatArray
    valid_until: FloatArray

    @classmethod
    def empty(cls, rows: int) -> _Verdicts:
        return cls(
            version=np.full(rows, -1, dtype=np.int64),
            reason=np.zeros(rows, dtype=np.int64),
            gpu_sum=np.zeros(rows),
            valid_until=np.full(rows, -np.inf),
        )

    def grow(self, rows: int) -> None:
        old = len(self.version)
        if rows <= old:
            return
        bigger = _Verdicts.empty(rows)
        bigger.version[:old] = self.version
        bigger.reason[:old] = self.reason
        bigger.gpu_sum[:old] = self.gpu_sum
        bigger.valid_until[:old] = self.valid_until
        self.version, self.reason = bigger.version, bigger.reason
        self.gpu_sum, self.valid_until = bigger.gpu_sum, bigger.valid_until


class VerdictCache:
    """GPU verdicts per demand shape and row. Cleared when the policy changes."""

    def __init__(self, max_shapes: int = 256) -> None:
        self._shapes: OrderedDict[DemandKey, _Verdicts] = OrderedDict()
        self._max = max_shapes
        self._mix_version = 0
        self.recomputed_rows = 0
        """Rows recomputed so far (for tests and benchmarks)."""

    def clear(self) -> None:
        """Forget everything (the policy changed)."""
        self._shapes.clear()

    def lookup(
        self,
        table: NodeTable,
        rows: IntArray,
        demand: PodDemand,
        policy: Policy,
        now: float,
        mix: DemandMix = EMPTY_MIX,
    ) -> tuple[IntArray, FloatArray]:
        """(reason, gpu_sum) of each row for this demand, recomputing rows that changed.

        A new snapshot of the shape mix (fragmentation scoring) makes every verdict stale.
        """
        if mix.version != self._mix_version:
            self._shapes.clear()
            self._mix_version = mix.version
        key = demand_key(demand)
        entry = self._shapes.get(key)
        if entry is None:
            entry = _Verdicts.empty(table.capacity)
            self._shapes[key] = entry
            while len(self._shapes) > self._max:
                self._shapes.popitem(last=False)
        else:
            self._shapes.move_to_end(key)
        entry.grow(table.capacity)
        version = table.column("version")
        dirty = (entry.version[rows] != version[rows]) | (now >= entry.valid_until[rows])
        if dirty.any():
            todo = np.unique(rows[dirty])
            batch = table.gather(todo, now, policy.spec.thermal_throttling)
            verdict = gpu_verdict(batch, demand, policy, now, mix)
            entry.reason[todo] = verdict.reason
            entry.gpu_sum[todo] = verdict.gpu_sum
            entry.valid_until[todo] = verdict.valid_until
            entry.version[todo] = version[todo]
            self.recomputed_rows += int(todo.size)
        return entry.reason[rows], entry.gpu_sum[rows]


_TENS = np.array([ord(" ")] * 10 + [ord("1")], dtype=np.uint8)
_ONES = np.array([ord("0") + i for i in range(10)] + [ord("0")], dtype=np.uint8)


@dataclass(slots=True)
class NameSet:
    """One candidate list as the scheduler sent it."""

    names: list[str]
    rows: IntArray
    index_version: int
    raw: bytes | None = field(default=None, repr=False)
    """The NodeNames array exactly as sent, when known."""
    _template: npt.NDArray[np.uint8] | None = None
    _score_at: IntArray | None = None
    _spans: IntArray | None = None
    _keys: npt.NDArray[np.object_] | None = None
    _quoted_names: npt.NDArray[np.object_] | None = None

    def _quoted(self) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.object_]]:
        """Per name ``b'"name"'`` and ``b',"name":'``: answers are joined from these at C speed."""
        if self._keys is None or self._quoted_names is None:
            quoted = [orjson.dumps(n) for n in self.names]
            self._quoted_names = np.empty(len(quoted), dtype=object)
            self._quoted_names[:] = quoted
            self._keys = np.empty(len(quoted), dtype=object)
            self._keys[:] = [b"," + q + b":" for q in quoted]
        return self._quoted_names, self._keys

    def failures_json(self, failing: IntArray, reason_json: npt.NDArray[np.object_]) -> bytes:
        """``{"name":"reason",...}`` for the given name indices; ``reason_json`` per index."""
        if failing.size == 0:
            return b"{}"
        parts = np.empty(2 * failing.size, dtype=object)
        parts[0::2] = self._quoted()[1][failing]
        parts[1::2] = reason_json
        parts[0] = parts[0][1:]  # no comma before the first entry
        return b"{" + b"".join(parts.tolist()) + b"}"

    def names_json(self, passed: npt.NDArray[np.bool_]) -> bytes:
        """The JSON array of the passing names, cut out of the request's own bytes.

        Costs one slice per run of passing names, so a few failures among 5,000 nodes cost
        a few slices, not 5,000 strings.
        """
        if self.raw is None:
            return orjson.dumps(
                [n for n, ok in zip(self.names, passed.tolist(), strict=True) if ok]
            )
        if self._spans is None:
            quotes = np.flatnonzero(np.frombuffer(self.raw, dtype=np.uint8) == ord('"'))
            self._spans = quotes.reshape(-1, 2)  # (start quote, end quote) of each name
        spans = self._spans
        failing = np.flatnonzero(~passed)
        if failing.size == 0:
            return self.raw
        if 3 * failing.size > len(self.names) - failing.size:
            # Many failures: join the passing names (about 30 ns each) instead of many runs.
            return b"[" + b",".join(self._quoted()[0][passed].tolist()) + b"]"
        # A few failures: copy the runs of passing names between them straight from the request.
        starts = np.concatenate(([0], failing + 1))
        stops = np.concatenate((failing - 1, [len(self.names) - 1]))
        keep = starts <= stops
        raw = self.raw
        runs = [
            raw[spans[a, 0] : spans[b, 1] + 1]
            for a, b in zip(starts[keep].tolist(), stops[keep].tolist(), strict=True)
        ]
        return b"[" + b",".join(runs) + b"]"

    def priorities(self, points: IntArray) -> bytes:
        """The HostPriorityList for these names, written into a ready template.

        Each score takes two bytes (``" 7"`` or ``"10"``; JSON allows the space), so the
        answer is one copy and two vectorised writes, however many nodes there are.
        """
        if self._template is None:
            parts = [b"["]
            offsets = []
            pos = 1
            for i, name in enumerate(self.names):
                head = (b"," if i else b"") + b'{"Host":' + orjson.dumps(name) + b',"Score":'
                parts.append(head + b"  }")
                offsets.append(pos + len(head))
                pos += len(head) + 3
            parts.append(b"]")
            self._template = np.frombuffer(b"".join(parts), dtype=np.uint8)
            self._score_at = np.array(offsets, dtype=np.int64)
        assert self._score_at is not None
        out = self._template.copy()
        clipped = np.clip(points, 0, 10)
        out[self._score_at] = _TENS[clipped]
        out[self._score_at + 1] = _ONES[clipped]
        return out.tobytes()


class NameSets:
    """Raw NodeNames bytes → the names' rows, for the last few lists seen."""

    def __init__(self, size: int = 32) -> None:
        self._sets: OrderedDict[bytes, NameSet] = OrderedDict()
        self._size = size

    def get(self, raw: bytes | None, names: list[str], table: NodeTable) -> NameSet:
        """The NameSet for a list, built (and remembered by its raw bytes) when new."""
        if raw is not None:
            known = self._sets.get(raw)
            if known is not None and known.index_version == table.index_version:
                self._sets.move_to_end(raw)
                return known
        entry = NameSet(names, table.rows(names), table.index_version, raw=raw)
        if raw is not None:
            self._sets[raw] = entry
            while len(self._sets) > self._size:
                self._sets.popitem(last=False)
        return entry
