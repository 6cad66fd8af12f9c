"""Combine the rules into one verdict and one 0..10 score per node, for every node at once.

``verdict`` decides on each node's own GPUs; here staleness and topology are applied to that,
and scores become kube-scheduler's points. Pure: ``evaluate`` is a function of the node batch,
the pod's demand, the policy and the time. Imports numpy, ``domain`` and the rule modules only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from scheduler_extender.domain import PodDemand
from scheduler_extender.policy.base import MAX_SCORE, Reason
from scheduler_extender.policy.batch import NodeBatch
from scheduler_extender.policy.document import Policy
from scheduler_extender.policy.rules import TERMS, fragmentation, topology
from scheduler_extender.policy.verdict import (
    BoolArray,
    FloatArray,
    IntArray,
    demand_weights,
    gpu_facts,
    gpu_verdict,
    host_verdict,
)

_TOPOLOGY = TERMS.index("topology")
# A plain int: numpy converts an IntEnum member slowly, and every request compares against it.
_OK = int(Reason.OK)


@dataclass(frozen=True, slots=True)
class Context:
    """What a decision needs besides the nodes: the time and the pod's group placement."""

    now: float
    """The extender's monotonic clock, in seconds."""
    group_racks: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Racks where pods of the pod's group already run."""
    rack_free: FloatArray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    """Free capacity per rack id, for placing a new group."""
    mix: fragmentation.DemandMix = fragmentation.EMPTY_MIX
    """The learned shape mix, for fragmentation scoring."""


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The verdict for every node of a batch, with every score term kept for explanation."""

    passed: BoolArray
    reason: IntArray
    """A ``Reason`` per node; a node that fails open keeps its reason (it explains the score)."""
    score: FloatArray
    """Weighted score in 0..1."""
    points: IntArray
    """Score on kube-scheduler's extender scale, 0..MAX_SCORE."""
    gpus: IntArray
    """(N, k): the GPU slots bind would choose; -1 where none."""
    terms: FloatArray
    """(N, len(TERMS)): each term's raw value (0..1) for the chosen GPUs."""
    weights: tuple[float, ...]
    """Weight of each term; a term with weight 0 does not count."""


def finish(
    reason: IntArray,
    gpu_sum: FloatArray,
    known: BoolArray,
    stale: BoolArray,
    topo: FloatArray,
    demand: PodDemand,
    policy: Policy,
) -> tuple[BoolArray, IntArray, FloatArray, IntArray]:
    """Apply staleness and topology to GPU verdicts: (passed, reason, score, points).

    A stale node fails with TELEMETRY_STALE unless the pod's class fails open; then it keeps
    its verdict but scores 0, as does a node that never reported (MISSING) and fails open.

        score = (gpu_sum + w_topology · topology) / Σ_t w_t,   points = round(MAX_SCORE · score)
    """
    fail_open = policy.spec.stale_telemetry.fail_open.get(demand.qos, False)
    ok = reason == _OK  # a node that never reported is never OK (MISSING)
    scored = ok
    if stale.any():  # ``stale`` implies ``known``
        if not fail_open:
            reason = np.where(stale, np.int64(Reason.TELEMETRY_STALE), reason)
            ok = reason == _OK
        scored = ok & ~stale
    passed = ok | ~known if fail_open else ok
    weights = demand_weights(demand, policy)
    total = sum(weights)
    raw = gpu_sum + weights[_TOPOLOGY] * topo if weights[_TOPOLOGY] > 0 else gpu_sum
    score = np.where(scored, raw * (1.0 / total), 0.0) if total > 0 else np.zeros(raw.shape)
    return passed, reason, score, to_points(score)


def relative_points(score: FloatArray, passed: BoolArray, step: float) -> IntArray:
    """Points relative to the best passing node: MAX_SCORE − ⌈(best − score) / step⌉, ≥ 0.

    kube-scheduler's 0..10 extender scale cannot tell apart nodes whose scores differ by less
    than 0.05; this spends the ten points on the scores near the best candidate instead
    (``spec.prioritize.relativeStep``). Nodes that did not pass get 0.
    """
    if not passed.any():
        return np.zeros(score.shape[0], dtype=np.int64)
    best = score[passed].max()
    below = np.ceil((best - score) / step - 1e-9)
    points: IntArray = np.where(passed, np.maximum(MAX_SCORE - below, 0), 0).astype(np.int64)
    return points


def prioritize_points(
    score: FloatArray, passed: BoolArray, policy: Policy, points: IntArray | None = None
) -> IntArray:
    """The points /prioritize answers for these scores.

    ``relative_points`` when ``spec.prioritize.relativeStep`` is set, else ``to_points``
    (``points``, when the caller has them already).
    """
    step = policy.spec.prioritize.relative_step
    if step is not None:
        return relative_points(score, passed, step)
    return to_points(score) if points is None else points


def to_points(score: FloatArray) -> IntArray:
    """A 0..1 score on kube-scheduler's extender scale: round(MAX_SCORE · score)."""
    points: IntArray = np.minimum(np.maximum(np.floor(score * MAX_SCORE + 0.5), 0), MAX_SCORE)
    return points.astype(np.int64)


def is_stale(
    known: BoolArray, age_s: FloatArray, interval_s: FloatArray, policy: Policy
) -> BoolArray:
    """Nodes whose last report is older than ``staleTelemetry.after`` (or 3 × their interval)."""
    after = policy.spec.stale_telemetry.stale_after_s(interval_s)
    stale: BoolArray = known & (age_s > after)  # NaN: not stale
    return stale


def stale_from(
    known: BoolArray, received_at: FloatArray, interval_s: FloatArray, policy: Policy
) -> FloatArray:
    """About when each node turns stale without a new report: a millisecond early, never late.

    +inf for a node that never reported or whose interval is unknown.
    """
    at = received_at + policy.spec.stale_telemetry.stale_after_s(interval_s) - 1e-3
    return np.where(known & ~np.isnan(at), at, np.inf)


def topology_term(
    rack: IntArray, rdma: BoolArray, demand: PodDemand, policy: Policy, ctx: Context
) -> FloatArray:
    """The topology term of every node (zeros for a pod without a group)."""
    if demand_weights(demand, policy)[_TOPOLOGY] <= 0:
        return np.zeros(rack.shape[0])
    return topology.score(rack, rdma, ctx.group_racks, ctx.rack_free, policy.spec.topology)


def evaluate(batch: NodeBatch, demand: PodDemand, policy: Policy, ctx: Context) -> Evaluation:
    """Filter and score every node of the batch for one pod: ``gpu_verdict`` then ``finish``.

    A pod that asks for no GPU passes everywhere and scores by ``host_verdict`` (its
    memoryFit term).
    """
    n = batch.size
    weights = demand_weights(demand, policy)
    facts = gpu_facts(batch, policy)
    if not demand.wants_gpu:
        score = host_verdict(facts, demand, policy, ctx.mix)
        terms = np.zeros((n, len(TERMS)))
        terms[:, TERMS.index("memoryFit")] = score
        everywhere = np.ones(n, dtype=np.bool_)
        return Evaluation(
            passed=everywhere,
            reason=np.zeros(n, dtype=np.int64),
            score=score,
            points=prioritize_points(score, everywhere, policy),
            gpus=np.full((n, 1), -1, dtype=np.int64),
            terms=terms,
            weights=weights,
        )
    verdict = gpu_verdict(facts, demand, policy, ctx.now, ctx.mix)
    topo = topology_term(batch.rack, batch.rdma, demand, policy, ctx)
    stale = is_stale(batch.known, batch.age_s, batch.interval_s, policy)
    passed, reason, score, points = finish(
        verdict.reason, verdict.gpu_sum, batch.known, stale, topo, demand, policy
    )
    return Evaluation(
        passed=passed,
        reason=reason,
        score=score,
        points=prioritize_points(score, passed, policy, points),
        gpus=np.where((reason == Reason.OK)[:, None], verdict.gpus, -1),
        terms=np.concatenate([verdict.terms, topo[:, None]], axis=1),
        weights=weights,
    )
