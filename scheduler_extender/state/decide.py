"""Filter and prioritize verdicts for a candidate list, from the cached per-row GPU verdicts.

The same steps as the pure ``evaluate`` (``gpu_verdict``, staleness, topology, ``finish``), with
the GPU verdicts taken from ``VerdictCache``: only rows written since the last request of the
same shape are worked out again. ``best`` is the node filter answers alone in the ``best``
mode: the highest full-precision score, ties broken at random as kube-scheduler breaks them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler_extender.domain import PodDemand
from scheduler_extender.policy.combine import (
    Context,
    finish,
    is_stale,
    prioritize_points,
    topology_term,
)
from scheduler_extender.policy.document import Policy
from scheduler_extender.policy.verdict import host_verdict
from scheduler_extender.state.table import NodeTable
from scheduler_extender.state.verdicts import VerdictCache


@dataclass(frozen=True, slots=True)
class Decision:
    """Filter and prioritize answers for one request, aligned with its candidate list."""

    passed: npt.NDArray[np.bool_]
    reason: npt.NDArray[np.int64]
    score: npt.NDArray[np.float64]
    """The full-precision policy score (what ``best`` compares)."""
    points: npt.NDArray[np.int64]
    """The 0..10 points /prioritize answers."""
    gpus: npt.NDArray[np.int64]
    """(candidates, k): the GPU slots bind would choose on each, -1 where none."""
    ranked: bool = True
    """Whether the policy tells the candidates apart: not for a pod without GPUs unless
    fragmentation scoring weighs what it would strand."""

    def best(self, rng: np.random.Generator, single: bool) -> npt.NDArray[np.int64]:
        """Positions of the passing candidates that score highest.

        All of them, or one at random (``single``: a pod whose GPUs are reserved there).
        Candidates with GPUs to give come first: one that passes only because it has not
        reported yet has none for bind.
        """
        pool = self.passed & (self.gpus[:, 0] >= 0)
        if not pool.any():
            pool = self.passed
        if not pool.any():
            return np.zeros(0, dtype=np.int64)
        score = np.where(pool, self.score, -np.inf)
        top = np.flatnonzero(score == score.max())
        if single and top.size > 1:
            top = top[[int(rng.integers(top.size))]]
        return top


def decide(
    table: NodeTable,
    verdicts: VerdictCache,
    rows: npt.NDArray[np.int64],
    demand: PodDemand,
    policy: Policy,
    ctx: Context,
    racks: tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]] | None = None,
) -> Decision:
    """The verdicts of ``rows`` for ``demand`` at ``ctx`` (its time and shape mix).

    ``racks``: (rack, rdma) overriding the table's.
    """
    n = rows.shape[0]
    now, mix = ctx.now, ctx.mix
    if not demand.wants_gpu:
        passed = np.ones(n, dtype=np.bool_)
        ranked = policy.spec.fragmentation.enabled and not mix.empty
        if not ranked:
            score = np.zeros(n)
        else:
            score = host_verdict(verdicts.facts.take(table, rows, policy, now), demand, policy, mix)
        zeros = np.zeros(n, dtype=np.int64)
        points = prioritize_points(score, passed, policy)
        return Decision(passed, zeros, score, points, np.full((n, 1), -1), ranked)
    reason, gpu_sum, gpus = verdicts.lookup(table, rows, demand, policy, now, mix)
    col = table.column
    known = col("known")[rows]
    stale = is_stale(known, now - col("received_at")[rows], col("interval_s")[rows], policy)
    if demand.group is not None:
        rack, rdma = racks if racks is not None else (col("rack")[rows], col("rdma")[rows])
        topo = topology_term(rack, rdma, demand, policy, ctx)
    else:
        topo = np.zeros(n)
    passed, reason, score, points = finish(reason, gpu_sum, known, stale, topo, demand, policy)
    points = prioritize_points(score, passed, policy, points)
    return Decision(passed, reason, score, points, np.where(passed[:, None], gpus, -1))
