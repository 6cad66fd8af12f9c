"""Combine the rules into one verdict and one 0..10 score per node, for every node at once.

Pure: ``evaluate`` is a function of the node batch, the pod's demand, the policy and the time.
Imports numpy, ``domain`` and the rule modules only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scheduler_extender.domain import Health, PodDemand, QosClass
from scheduler_extender.policy.base import MAX_SCORE, Reason
from scheduler_extender.policy.batch import NodeBatch
from scheduler_extender.policy.document import Policy
from scheduler_extender.policy.rules import REGISTRY, TERMS, fragmentation, memory, topology

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_TOPOLOGY = TERMS.index("topology")
# Plain ints: numpy converts an IntEnum member slowly, and every request compares against these.
_OK = int(Reason.OK)
_UNHEALTHY = int(Health.UNHEALTHY)


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


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What each node's GPUs offer whatever the pod asks: (N,) per node, (N, G) per GPU slot.

    A function of the node's row and the policy only, not of the pod or the time; the
    extender works it out once per row write and shares it among every demand shape.
    """

    base_reason: IntArray
    """The first reason that holds for any pod (no telemetry, no GPU, driver, all unhealthy)."""
    healthy: BoolArray
    """A GPU is in the slot and it is not unhealthy."""
    excluded_until: FloatArray
    """Thermal hysteresis, as in ``NodeBatch``."""
    capacity: IntArray
    """Blocks each GPU has in all."""
    open_free: IntArray
    """Free blocks a shared pod could take; -1 where a pod holds the GPU as a whole."""
    lendable: IntArray
    """Blocks a best-effort pod may borrow besides ``open_free``: idle blocks of the GPU's
    pods not borrowed yet (``memory.idleRelease``); 0 where none."""
    idle: BoolArray
    """A GPU is in the slot and free as a whole."""
    terms: FloatArray
    """(len(GPU_TERMS), N, G): the per-GPU terms of the registry, per slot."""
    host: fragmentation.HostRoom
    """Free host CPU and memory per node."""

    @property
    def size(self) -> int:
        """Number of nodes."""
        return int(self.base_reason.shape[0])

    @property
    def room(self) -> IntArray:
        """Free blocks per slot as fragmentation and best fit see them: 0 where held whole."""
        return np.maximum(self.open_free, 0)


_PER_GPU = tuple((t.name, t.per_gpu) for t in REGISTRY if t.per_gpu is not None)
GPU_TERMS = tuple(name for name, _ in _PER_GPU)
"""The GPU terms ``GpuFacts`` holds: every term of ``TERMS`` but memoryFit and topology."""
_FIT = TERMS.index("memoryFit")
_TERM_AT = tuple(TERMS.index(t) for t in GPU_TERMS)


def gpu_facts(batch: NodeBatch, policy: Policy) -> GpuFacts:
    """The pod-independent part of each node's GPU verdict."""
    spec = policy.spec
    total_mib = batch.readings["memory_total_mib"]
    capacity = memory.capacity_blocks(total_mib, spec.memory)
    free = memory.free_blocks(
        total_mib,
        batch.unaccounted_used_mib,
        batch.allocated_blocks,
        spec.memory,
        batch.borrowed_blocks,
    )
    lendable = np.zeros_like(free)
    if spec.lends_idle_blocks:
        borrow = memory.room_blocks(
            total_mib,
            batch.unaccounted_used_mib,
            batch.allocated_blocks,
            spec.memory,
            batch.lent_blocks,
        )
        lendable = np.where(batch.whole_taken, 0, np.maximum(np.maximum(borrow, 0) - free, 0))
    healthy = batch.present & (batch.health != _UNHEALTHY)
    idle = memory.is_idle(
        batch.unaccounted_used_mib, batch.allocated_blocks, batch.whole_taken, spec.memory
    )
    # The first check that applies gives the reason: written last-first, so earlier ones win.
    checks = (
        (~batch.known, Reason.TELEMETRY_MISSING),
        (~batch.present.any(axis=1), Reason.NO_GPU),
        (~batch.driver_ok, Reason.DRIVER_NOT_OK),
        (~healthy.any(axis=1), Reason.ALL_UNHEALTHY),
    )
    reason = np.full(batch.size, _OK, dtype=np.int64)
    for applies, why in reversed(checks):
        reason[applies] = int(why)
    terms = np.stack([term(batch, spec) for _, term in _PER_GPU])  # (len(GPU_TERMS), N, G)
    return GpuFacts(
        base_reason=reason,
        healthy=healthy,
        excluded_until=batch.excluded_until,
        capacity=capacity,
        open_free=np.where(batch.whole_taken, -1, free),
        lendable=lendable,
        idle=idle & batch.present,
        terms=terms,
        host=fragmentation.HostRoom(batch.host_cpu_free, batch.host_memory_free),
    )


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    """The part of a decision that depends on each node's own GPUs only.

    It holds until the node's row changes or ``valid_until`` passes, so it can be kept per
    node and reused across requests; staleness and topology are applied afterwards by
    ``finish`` because they depend on the time and on other nodes.
    """

    reason: IntArray
    """Reason per node, staleness not yet applied."""
    gpu_sum: FloatArray
    """Σ weight · term over the GPU terms (not divided by the total weight)."""
    gpus: IntArray
    """(N, k) GPU slots bind would choose; -1 where the node does not fit."""
    terms: FloatArray
    """(N, len(TERMS) − 1): raw GPU-term values at the chosen GPUs."""
    valid_until: FloatArray
    """When a GPU of the node leaves its cool-down (the verdict may change then)."""


def demand_weights(demand: PodDemand, policy: Policy) -> tuple[float, ...]:
    """Term weights for a pod: its class's weights, with topology only for group members."""
    weights = policy.class_weights(demand.qos)
    if demand.group is None:
        weights = (*weights[:_TOPOLOGY], 0.0, *weights[_TOPOLOGY + 1 :])
    return weights


def gpu_verdict(
    facts: GpuFacts,
    demand: PodDemand,
    policy: Policy,
    now: float,
    mix: fragmentation.DemandMix = fragmentation.EMPTY_MIX,
) -> GpuVerdict:
    """Filter each node on its GPUs and score the GPUs bind would choose.

    A node fits when it has at least ``demand.gpu_count`` usable GPU slots: present, not
    unhealthy, not hot or cooling down, and with room (``mem_blocks`` free on that one GPU, or
    the whole GPU idle). A failing node gets the first reason that applies: those of
    ``gpu_facts``, then the checks below in order. Too few cool GPUs is reported before too
    few free ones: evicting pods from a hot GPU does not help, so preemption must see "hot"
    there. The GPUs chosen are the best-scoring usable ones (ties go to the lowest index):

        gpu_sum = Σ_t w_t · term_t  over thermal, power, memoryFit, powerSaving, health

    With ``spec.fragmentation`` on and a learned shape ``mix``, memoryFit of packing classes
    and of whole-GPU requests is the fragmentation score instead of best fit.
    """
    weights = demand_weights(demand, policy)
    need = demand.gpu_count
    fits_ever = facts.capacity >= demand.mem_blocks
    cool = now >= facts.excluded_until
    candidate = facts.healthy & fits_ever
    candidate_cool = candidate & cool
    if demand.needs_whole_gpu:
        fits_now = facts.idle
        too_small = Reason.TOO_FEW_GPUS if demand.whole_gpus else Reason.REQUEST_EXCEEDS_GPU
        busy_reason = Reason.NO_FREE_GPUS
    else:
        fits_now = facts.open_free >= demand.mem_blocks
        if demand.qos is QosClass.BEST_EFFORT and facts.lendable.any():
            # Idle blocks of other pods, lent; a GPU's own room first, since lent blocks are
            # taken back: a node with enough GPUs of that offers only those.
            own = fits_now
            fits_now = facts.open_free + facts.lendable >= demand.mem_blocks
            enough = (own & candidate_cool).sum(axis=1) >= need
            fits_now = np.where(enough[:, None], own, fits_now)
        too_small = Reason.REQUEST_EXCEEDS_GPU
        busy_reason = Reason.NO_FREE_BLOCKS
    usable = candidate_cool & fits_now
    n_cool = candidate_cool.sum(axis=1)
    hot = np.isposinf(facts.excluded_until)
    checks = (
        (candidate.sum(axis=1) < need, too_small),
        ((n_cool < need) & (candidate & hot).any(axis=1), Reason.GPU_HOT),
        (n_cool < need, Reason.GPU_COOLING_DOWN),
        (usable.sum(axis=1) < need, busy_reason),
    )
    reason = facts.base_reason.copy()
    undecided = reason == _OK
    for applies, why in reversed(checks):
        reason[applies & undecided] = int(why)

    fit = _fit(facts, demand, policy, mix, usable)
    ranked = np.zeros(fit.shape)
    for t, term in enumerate(TERMS[:_TOPOLOGY]):  # Σ_t w_t · term_t, in TERMS order
        if weights[t]:
            ranked += weights[t] * (fit if t == _FIT else facts.terms[GPU_TERMS.index(term)])
    ranked = np.where(usable, ranked, -np.inf)
    k = max(need, 1)
    chosen = np.empty((facts.size, len(TERMS) - 1))
    if k == 1:
        best = np.argmax(ranked, axis=1)
        choice = best[:, None]
        nodes = np.arange(facts.size)
        chosen[:, _TERM_AT] = facts.terms[:, nodes, best].T
        chosen[:, _FIT] = fit[nodes, best]
    else:
        slots = facts.capacity.shape[1]
        choice = np.argsort(-ranked, axis=1, kind="stable")[:, : min(k, slots)]
        per_gpu = np.take_along_axis(facts.terms, choice[None], axis=2)  # (len(GPU_TERMS), N, k)
        chosen[:, _TERM_AT] = per_gpu.mean(axis=2).T
        chosen[:, _FIT] = np.take_along_axis(fit, choice, axis=1).mean(axis=1)
    fits = reason == _OK
    gpu_weights = np.asarray(weights[:_TOPOLOGY])
    return GpuVerdict(
        reason=reason,
        gpu_sum=np.where(fits, chosen @ gpu_weights, 0.0),
        gpus=np.where(fits[:, None], choice, -1),
        terms=chosen,
        valid_until=np.where(facts.excluded_until > now, facts.excluded_until, np.inf).min(axis=1),
    )


def _frag_applies(demand: PodDemand, policy: Policy, mix: fragmentation.DemandMix) -> bool:
    """Whether a placement of this pod is scored by the fragmentation it leaves."""
    args = policy.spec.fragmentation
    if not args.enabled or mix.empty:
        return False
    return demand.qos.packs or demand.needs_whole_gpu or not demand.wants_gpu


def _fit(
    facts: GpuFacts,
    demand: PodDemand,
    policy: Policy,
    mix: fragmentation.DemandMix,
    usable: BoolArray,
) -> FloatArray:
    """The memoryFit term per GPU: fragmentation score where it applies, else best fit."""
    request = 0 if demand.needs_whole_gpu else demand.mem_blocks
    if _frag_applies(demand, policy, mix):
        args = policy.spec.fragmentation
        fit = fragmentation.score(
            facts.room, facts.idle, facts.capacity, usable, demand, mix, args, facts.host
        )
    else:
        fit = memory.fit_score(facts.room, facts.capacity, request, demand.qos.packs)
    # A best-effort pod that would have to borrow lent blocks fits worst.
    return np.where(facts.room >= request, fit, 0.0)


def host_verdict(
    facts: GpuFacts, demand: PodDemand, policy: Policy, mix: fragmentation.DemandMix
) -> FloatArray:
    """Score (0..1) per node for a pod that asks for no GPU; every node passes.

    With fragmentation scoring on, the pod scores by the GPU it would strand or fragment by
    taking host CPU and memory (0.5 where it changes nothing, as on a node without GPUs);
    otherwise 0 everywhere.
    """
    if not _frag_applies(demand, policy, mix):
        return np.zeros(facts.size)
    return fragmentation.host_score(
        facts.room,
        facts.idle,
        facts.capacity,
        facts.host,
        demand,
        mix,
        policy.spec.fragmentation,
    )


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
