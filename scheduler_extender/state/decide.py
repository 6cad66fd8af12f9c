"""Filter and prioritize answers for requests, from the per-node verdicts ``ClusterState`` keeps.

A candidate list known by its bytes keeps its last decision per demand shape, and only rows
written since (or whose cool-down or freshness ran out) are decided again; a pod's prioritize
right after its filter is answered from that filter. Imports ``policy``, ``domain`` and the
other ``state`` modules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from scheduler_extender.domain import PodDemand
from scheduler_extender.policy.combine import (
    Context,
    finish,
    host_verdict,
    is_stale,
    prioritize_points,
    stale_from,
    topology_term,
)
from scheduler_extender.state.decisions import (
    CACHED_NAMES,
    DemandKey,
    NameSet,
    NameSets,
    WeightedLru,
    demand_key,
)

if TYPE_CHECKING:
    from scheduler_extender.state.cluster import ClusterState

DECISION_MEMO_SIZE = 64
"""Decisions kept by (candidate list, demand shape, group), holding ``CACHED_NAMES`` rows at
most together."""

_MemoKey = tuple[bytes, DemandKey, str | None]

_NO_ROWS = np.zeros(0, dtype=np.int64)

CYCLE_S = 1.0
"""How long after a pod's filter its prioritize is answered from what that filter saw."""


@dataclass(frozen=True, slots=True)
class _Rows:
    """Decided rows: the verdicts, and when each may change without a write.

    A row's deadline is when one of its GPUs leaves its cool-down or its telemetry turns stale.
    """

    passed: npt.NDArray[np.bool_]
    reason: npt.NDArray[np.int64]
    points: npt.NDArray[np.int64]
    score: npt.NDArray[np.float64]
    deadline: npt.NDArray[np.float64]

    def kept(self, version: npt.NDArray[np.int64], stamp: tuple[object, ...]) -> _Memo:
        """These verdicts as the decision of a whole list, at these row versions."""
        for array in (self.passed, self.reason, self.points, self.score, self.deadline, version):
            array.flags.writeable = False
        return _Memo(
            self.passed, self.reason, self.points, self.score, self.deadline, version, stamp
        )


@dataclass(frozen=True, slots=True)
class _Memo(_Rows):
    """A list's last decision for one shape, with the row versions it was made at.

    ``stamp`` is what else it depends on: the policy, the shape mix, the list's rows, and the
    racks and room of the pod's group.
    """

    version: npt.NDArray[np.int64]
    stamp: tuple[object, ...]

    def patched(
        self, at: npt.NDArray[np.int64], rows: _Rows, version: npt.NDArray[np.int64]
    ) -> _Memo:
        """A copy with the positions ``at`` decided again (earlier answers stay untouched)."""
        passed, reason = self.passed.copy(), self.reason.copy()
        points, score, deadline = self.points.copy(), self.score.copy(), self.deadline.copy()
        passed[at], reason[at] = rows.passed, rows.reason
        points[at], score[at], deadline[at] = rows.points, rows.score, rows.deadline
        return _Rows(passed, reason, points, score, deadline).kept(version, self.stamp)


@dataclass(slots=True)
class _Cycle:
    """The last filter: whose it was, what it depended on, and its verdict for each row."""

    uid: str
    shape: tuple[DemandKey, str | None]
    basis: tuple[object, ...]
    at: float
    rows: npt.NDArray[np.int64]
    verdicts: _Rows
    _position: npt.NDArray[np.int64] | None = None

    def positions(self, rows: npt.NDArray[np.int64], capacity: int) -> npt.NDArray[np.int64]:
        """Where each row sits in the filter's list; -1 for a row the filter did not decide."""
        if self._position is None or self._position.shape[0] < capacity:
            self._position = np.full(capacity, -1, dtype=np.int64)
            self._position[self.rows] = np.arange(self.rows.shape[0])
        return self._position[rows]


@dataclass(frozen=True, slots=True)
class Decision:
    """Filter and prioritize answers for one request, aligned with ``names``."""

    names: list[str]
    passed: npt.NDArray[np.bool_]
    reason: npt.NDArray[np.int64]
    points: npt.NDArray[np.int64]
    nameset: NameSet | None = None


class Decider:
    """Answers the verbs for one ``ClusterState``. Not thread-safe: use one event loop."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._namesets = NameSets()
        self._decisions: WeightedLru[_MemoKey, _Memo] = WeightedLru(
            DECISION_MEMO_SIZE, CACHED_NAMES, lambda memo: memo.passed.shape[0]
        )
        self._cycle: _Cycle | None = None

    def decide(
        self,
        names: list[str],
        demand: PodDemand,
        labels: Sequence[Mapping[str, str] | None] | None = None,
        raw_names: bytes | None = None,
        verb: str = "filter",
    ) -> Decision:
        """The filter/prioritize verdicts for a request, from cached per-node GPU verdicts.

        Gives the same answers as ``evaluate`` (the tests hold them to it); it only skips the
        work for rows that have not changed since the last request of the same shape. For a
        candidate list known by its bytes (names mode), the last decision of the same shape
        and group is kept, and only its rows that were written since, or whose cool-down or
        freshness ran out, are decided again.

        One exception, as kube-scheduler's own cycle works from one snapshot: a ``prioritize``
        that follows its pod's ``filter`` (no other pod's request between, within ``CYCLE_S``)
        scores the nodes as that filter saw them, so that filter and scores agree and the
        rows written in the millisecond between are not decided again.
        """
        state = self._state
        now = state.clock.monotonic()
        if verb == "prioritize":
            kept = self._from_cycle(names, demand, raw_names, now)
            if kept is not None:
                return kept
        self._cycle = None
        state.expire()
        n = len(names)
        if not demand.wants_gpu:
            passed = np.ones(n, dtype=np.bool_)
            zeros = np.zeros(n, dtype=np.int64)
            if not state.policy.spec.fragmentation.enabled or state.mix.empty:
                score = np.zeros(n)
            else:
                rows = state.table.rows(names)
                facts = state.verdicts.facts.take(state.table, rows, state.policy, now)
                score = host_verdict(facts, demand, state.policy, state.mix)
            return Decision(names, passed, zeros, prioritize_points(score, passed, state.policy))
        nameset = self._namesets.get(raw_names, names, state.table)
        rows = nameset.rows
        ctx, basis, stamp = self._grounds(nameset, demand)
        if labels is not None or nameset.raw is None:
            part = self._decide_rows(rows, demand, now, ctx, labels)
            self._remember_cycle(demand, basis, now, rows, part, verb)
            points = prioritize_points(part.score, part.passed, state.policy, part.points)
            return Decision(names, part.passed, part.reason, points, nameset)
        key = (nameset.raw, demand_key(demand), demand.group)
        memo = self._memo_for(key, nameset, demand, now, ctx, stamp)
        self._remember_cycle(demand, basis, now, rows, memo, verb)
        points = prioritize_points(memo.score, memo.passed, state.policy, memo.points)
        return Decision(names, memo.passed, memo.reason, points, nameset)

    def _memo_for(
        self,
        key: _MemoKey,
        nameset: NameSet,
        demand: PodDemand,
        now: float,
        ctx: Context | None,
        stamp: tuple[object, ...],
    ) -> _Memo:
        """The kept decision of a list for a shape, with the rows changed since decided again."""
        state = self._state
        rows = nameset.rows
        version = state.table.column("version")[rows]
        memo = self._decisions.get(key)
        if memo is None or memo.stamp != stamp:
            memo = self._decide_rows(rows, demand, now, ctx, None).kept(version, stamp)
        else:
            dirty = (version != memo.version) | (now >= memo.deadline)
            if dirty.any():
                at = np.flatnonzero(dirty)
                memo = memo.patched(
                    at, self._decide_rows(rows[at], demand, now, ctx, None), version
                )
        self._decisions.put(key, memo)
        return memo

    def _grounds(
        self, nameset: NameSet, demand: PodDemand
    ) -> tuple[Context | None, tuple[object, ...], tuple[object, ...]]:
        """(group context, basis, stamp) of a decision: what its kept answer rests on."""
        state = self._state
        ctx = state.context(demand) if demand.group is not None else None
        basis = self._basis(nameset)
        group = None if ctx is None else (ctx.group_racks.tobytes(), ctx.rack_free.tobytes())
        return ctx, basis, (*basis, group)

    def _basis(self, nameset: NameSet) -> tuple[object, ...]:
        """What every decision of a list rests on: the policy, the shape mix, the list's rows."""
        state = self._state
        return (id(state.policy), state.mix.version, nameset.index_version)

    def _remember_cycle(
        self,
        demand: PodDemand,
        basis: tuple[object, ...],
        now: float,
        rows: npt.NDArray[np.int64],
        verdicts: _Rows,
        verb: str,
    ) -> None:
        """A filter starts its pod's cycle; any other request ends the last one."""
        self._cycle = (
            _Cycle(demand.uid, (demand_key(demand), demand.group), basis, now, rows, verdicts)
            if verb == "filter" and demand.uid
            else None
        )

    def _from_cycle(
        self, names: list[str], demand: PodDemand, raw_names: bytes | None, now: float
    ) -> Decision | None:
        """The pod's prioritize answered from its own filter, when it is the same cycle."""
        state = self._state
        cycle, self._cycle = self._cycle, None
        if (
            cycle is None
            or cycle.uid != demand.uid
            or cycle.shape != (demand_key(demand), demand.group)
            or now - cycle.at > CYCLE_S
        ):
            return None
        nameset = self._namesets.get(raw_names, names, state.table)
        if cycle.basis != self._basis(nameset):
            return None
        v = cycle.verdicts
        if nameset.rows is cycle.rows:  # the very list the filter was sent
            passed, reason, score, points = v.passed, v.reason, v.score, v.points
        else:
            at = cycle.positions(nameset.rows, state.table.capacity)
            if (at < 0).any():
                return None
            passed, reason, score, points = v.passed[at], v.reason[at], v.score[at], v.points[at]
        points = prioritize_points(score, passed, state.policy, points)
        return Decision(names, passed, reason, points, nameset)

    def _decide_rows(
        self,
        rows: npt.NDArray[np.int64],
        demand: PodDemand,
        now: float,
        ctx: Context | None,
        labels: Sequence[Mapping[str, str] | None] | None,
    ) -> _Rows:
        """Verdicts of some rows, each on its own: its GPU verdict, staleness and topology."""
        state = self._state
        policy = state.policy
        reason, gpu_sum, valid_until = state.verdicts.lookup(
            state.table, rows, demand, policy, now, state.mix
        )
        col = state.table.column
        known = col("known")[rows]
        received_at, interval_s = col("received_at")[rows], col("interval_s")[rows]
        stale = is_stale(known, now - received_at, interval_s, policy)
        if ctx is not None:
            rack, rdma = col("rack")[rows], col("rdma")[rows]
            if labels is not None:
                rack, rdma = state.override_racks(rack, rdma, labels)
            topo = topology_term(rack, rdma, demand, policy, ctx)
        else:
            topo = np.zeros(rows.shape[0])
        passed, reason, score, points = finish(reason, gpu_sum, known, stale, topo, demand, policy)
        # A stale row stays stale until it is written again; a fresh one may turn stale.
        turns = np.where(stale, np.inf, stale_from(known, received_at, interval_s, policy))
        return _Rows(passed, reason, points, score, np.minimum(valid_until, turns))
