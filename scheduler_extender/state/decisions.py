"""Caches that keep the request path a few array operations long.

``FactsCache``: each node's ``gpu_facts`` (what its GPUs offer whatever the pod asks), worked
out once per row version and shared by every demand shape. ``VerdictCache``: per demand shape
(class, blocks or whole GPUs), each node's GPU verdict, kept until the node's row changes or one
of its GPUs leaves its cool-down. Both go by the table's row versions: a request recomputes
only the rows written since the last request of that shape, with the same pure ``gpu_verdict``
the policy defines.
``NameSets``: the scheduler sends the same candidate list again and again; the list's raw bytes
map to its rows and to a ready answer template.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt
import orjson

from scheduler_extender.domain import PodDemand
from scheduler_extender.policy.base import REASON_JSON, REASON_RESOLVABLE
from scheduler_extender.policy.combine import GpuFacts, gpu_facts, gpu_verdict
from scheduler_extender.policy.document import Policy
from scheduler_extender.policy.rules.fragmentation import EMPTY_MIX, DemandMix, HostRoom
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
    ) -> tuple[IntArray, FloatArray, FloatArray]:
        """(reason, gpu_sum, valid_until) of each row for this demand.

        Rows that changed since the shape's last request are recomputed.

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
            todo = distinct(rows[dirty])
            facts = self.facts.take(table, todo, policy, now)
            verdict = gpu_verdict(facts, demand, policy, now, mix)
            entry.reason[todo] = verdict.reason
            entry.gpu_sum[todo] = verdict.gpu_sum
            entry.valid_until[todo] = verdict.valid_until
            entry.version[todo] = version[todo]
            self.recomputed_rows += int(todo.size)
        return entry.reason[rows], entry.gpu_sum[rows], entry.valid_until[rows]


_ALL_PASSED_TAIL = b',"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}'

_FEW_FAILURES = 32
"""Up to this many failing names, the answer is cut from the request run by run."""

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
    _spans: list[list[int]] | None = None
    _body: npt.NDArray[np.uint8] | None = None
    _seg_len: IntArray | None = None
    _keys: npt.NDArray[np.object_] | None = None
    memo: AnswerMemo | None = field(default=None, repr=False)
    """Where answers for this list are kept (only lists known by their raw bytes)."""

    def _keys_json(self) -> npt.NDArray[np.object_]:
        """Per name ``b',"name":'``: failure maps are joined from these at C speed."""
        if self._keys is None:
            self._keys = np.empty(len(self.names), dtype=object)
            self._keys[:] = [b"," + orjson.dumps(n) + b":" for n in self.names]
        return self._keys

    def failures_json(self, failing: IntArray, reason_json: npt.NDArray[np.object_]) -> bytes:
        """``{"name":"reason",...}`` for the given name indices; ``reason_json`` per index."""
        if failing.size == 0:
            return b"{}"
        parts = np.empty(2 * failing.size, dtype=object)
        parts[0::2] = self._keys_json()[failing]
        parts[1::2] = reason_json
        parts[0] = parts[0][1:]  # no comma before the first entry
        return b"{" + b"".join(parts.tolist()) + b"}"

    def _segments(
        self, raw: bytes
    ) -> tuple[npt.NDArray[np.uint8], IntArray, list[list[int]]] | None:
        """The array's bytes from the first name on, each name's segment length, its span.

        A segment is ``"name",`` with any whitespace (the last one ``"name"``).

        None when the quotes do not pair up with the names (an escaped quote in a name).
        """
        if self._body is None or self._seg_len is None or self._spans is None:
            quotes = np.flatnonzero(np.frombuffer(raw, dtype=np.uint8) == ord('"'))
            if quotes.size != 2 * len(self.names) or quotes.size == 0:
                return None
            spans = quotes.reshape(-1, 2)  # (opening quote, closing quote) of each name
            starts = spans[:, 0]
            ends = np.append(starts[1:], spans[-1, 1] + 1)
            self._body = np.frombuffer(raw, dtype=np.uint8)[starts[0] : ends[-1]]
            self._seg_len = ends - starts
            self._spans = spans.tolist()
        return self._body, self._seg_len, self._spans

    def names_json(self, passed: npt.NDArray[np.bool_]) -> bytes:
        """The JSON array of the passing names, cut out of the request's own bytes.

        A few failures cost a few slices; many cost one vectorised byte mask over the array
        (about 60 µs at 5,000 names, however the failures are spread), never a string per name.
        """
        failing = np.flatnonzero(~passed)
        if self.raw is not None and failing.size == 0:
            return self.raw
        segments = None if self.raw is None else self._segments(self.raw)
        if self.raw is None or segments is None:
            return orjson.dumps(
                [n for n, ok in zip(self.names, passed.tolist(), strict=True) if ok]
            )
        raw = self.raw
        body, seg_len, spans = segments
        if failing.size > _FEW_FAILURES:
            kept = body[np.repeat(passed, seg_len)].tobytes().rstrip()
            return b"[" + (kept[:-1] if kept.endswith(b",") else kept) + b"]"
        # Copy the runs of passing names between the failures straight from the request.
        last = len(self.names) - 1
        runs = []
        start = 0
        for f in failing.tolist():
            if start <= f - 1:
                runs.append(raw[spans[start][0] : spans[f - 1][1] + 1])
            start = f + 1
        if start <= last:
            runs.append(raw[spans[start][0] : spans[last][1] + 1])
        return b"[" + b",".join(runs) + b"]"

    def filter_json(
        self, passed: npt.NDArray[np.bool_], reason: IntArray, shape: DemandKey
    ) -> bytes:
        """The whole ExtenderFilterResult in names mode, written from the request's bytes.

        The answer depends only on each name's verdict code (0 where it passed), so an answer
        already written for the same codes, list and shape is sent again as it is.
        """
        if self.memo is None or self.raw is None:
            return self._filter_json(passed, reason)
        codes = np.where(passed, 0, reason).astype(np.uint8).tobytes()
        return self.memo.answer(
            (self.raw, shape, "filter"), codes, lambda: self._filter_json(passed, reason)
        )

    def _filter_json(self, passed: npt.NDArray[np.bool_], reason: IntArray) -> bytes:
        if self.raw is not None and passed.all():
            return b'{"Nodes":null,"NodeNames":' + self.raw + _ALL_PASSED_TAIL
        failing = np.flatnonzero(~passed)
        codes = reason[failing]
        resolvable = REASON_RESOLVABLE[codes]
        return (
            b'{"Nodes":null,"NodeNames":'
            + self.names_json(passed)
            + b',"FailedNodes":'
            + self.failures_json(failing[resolvable], REASON_JSON[codes[resolvable]])
            + b',"FailedAndUnresolvableNodes":'
            + self.failures_json(failing[~resolvable], REASON_JSON[codes[~resolvable]])
            + b',"Error":""}'
        )

    def priorities(self, points: IntArray, shape: DemandKey | None = None) -> bytes:
        """The HostPriorityList for these names (kept for the same scores, list and shape)."""
        if self.memo is None or self.raw is None or shape is None:
            return self._priorities(points)
        codes = points.astype(np.uint8).tobytes()
        return self.memo.answer(
            (self.raw, shape, "prioritize"), codes, lambda: self._priorities(points)
        )

    def _priorities(self, points: IntArray) -> bytes:
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


MemoKey = tuple[bytes, DemandKey, str]


class AnswerMemo:
    """Encoded answers by (candidate list, demand shape, verb), with the codes each is for.

    Kept within a byte budget, least recently used out first.

    Verdicts change far less often than telemetry arrives (a report moves a node's numbers,
    rarely its verdict), so most requests find their answer already written; a changed code
    means a miss and a fresh answer, never a stale one.
    """

    def __init__(self, budget_bytes: int = 16 << 20) -> None:
        self._answers: OrderedDict[MemoKey, tuple[bytes, bytes]] = OrderedDict()
        self._budget = budget_bytes
        self._bytes = 0

    def answer(self, key: MemoKey, codes: bytes, write: Callable[[], bytes]) -> bytes:
        """The answer kept for this key if it was written for these very codes.

        Otherwise ``write()``'s answer, which is kept from then on.
        """
        entry = self._answers.get(key)
        if entry is not None and entry[0] == codes:
            self._answers.move_to_end(key)
            return entry[1]
        out = write()
        self._put(key, codes, out)
        return out

    def _put(self, key: MemoKey, codes: bytes, answer: bytes) -> None:
        # The list's bytes in the key count too: the memo may keep them alive.
        old = self._answers.pop(key, None)
        if old is not None:
            self._bytes -= len(key[0]) + len(old[0]) + len(old[1])
        size = len(key[0]) + len(codes) + len(answer)
        if size > self._budget // 4:
            return
        self._answers[key] = (codes, answer)
        self._bytes += size
        while self._bytes > self._budget:
            gone, (c, a) = self._answers.popitem(last=False)
            self._bytes -= len(gone[0]) + len(c) + len(a)


CACHED_NAMES = 100_000
"""Names held by the kept candidate lists together (twenty lists of 5,000 nodes): memory is
bounded by what the lists hold, not by how many there are. A longer list is never kept."""

K = TypeVar("K")
V = TypeVar("V")


class WeightedLru(Generic[K, V]):
    """Entries kept up to ``size`` of them and ``budget`` of weight, least recently used out."""

    def __init__(self, size: int, budget: int, weight: Callable[[V], int]) -> None:
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._size, self._budget, self._weight = size, budget, weight
        self.held = 0
        """The weight of the entries kept."""

    def get(self, key: K) -> V | None:
        """The entry, made the most recently used; None when not kept."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Keep an entry (replacing the key's), then drop the oldest while over a bound."""
        gone = self._entries.pop(key, None)
        self.held += self._weight(value) - (0 if gone is None else self._weight(gone))
        self._entries[key] = value
        while len(self._entries) > self._size or self.held > self._budget:
            _, old = self._entries.popitem(last=False)
            self.held -= self._weight(old)


class NameSets:
    """Raw NodeNames bytes → the names' rows, for the last lists seen (``CACHED_NAMES``)."""

    def __init__(self, size: int = 32, budget: int = CACHED_NAMES) -> None:
        self._sets: WeightedLru[bytes, NameSet] = WeightedLru(size, budget, lambda s: len(s.names))
        self._budget = budget
        self.memo = AnswerMemo()

    @property
    def held(self) -> int:
        """Names held by the kept lists."""
        return self._sets.held

    def get(self, raw: bytes | None, names: list[str], table: NodeTable) -> NameSet:
        """The NameSet for a list, built (and remembered by its raw bytes) when new.

        A list over the budget is answered without being kept (its NameSet has no ``raw``, so
        no decision of it is kept either).
        """
        if raw is not None and len(names) > self._budget:
            raw = None
        if raw is not None:
            known = self._sets.get(raw)
            if known is not None and known.index_version == table.index_version:
                return known
        entry = NameSet(names, table.rows(names), table.index_version, raw=raw, memo=self.memo)
        if raw is not None:
            self._sets.put(raw, entry)
        return entry
