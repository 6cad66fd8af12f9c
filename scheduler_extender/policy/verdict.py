"""What each node's own GPUs say for a pod: which fit, which bind would choose, their score.

``gpu_facts`` is the part of every node's GPU verdict that no pod changes, ``gpu_verdict`` the
part one pod's demand decides; ``host_verdict`` scores a pod that asks for no GPU. ``combine``
adds staleness and topology, which depend on the time and on other nodes. Pure: imports numpy,
``domain`` and the rule modules only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler_extender.domain import Health, PodDemand, QosClass
from scheduler_extender.policy.base import Reason
from scheduler_extender.policy.batch import NodeBatch
from scheduler_extender.policy.document import Policy
from scheduler_extender.policy.rules import REGISTRY, TERMS, fragmentation, memory

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_TOPOLOGY = TERMS.index("topology")
# Plain ints: numpy converts an IntEnum member slowly, and every request compares against these.
_OK = int(Reason.OK)
_UNHEALTHY = int(Health.UNHEALTHY)


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
    ``gpu_facts``, then the checks below in order (room that only an unhealthy GPU has is
    named before "no room"). Too few cool GPUs is reported before too
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
    n_usable = usable.sum(axis=1)
    n_cool = candidate_cool.sum(axis=1)
    hot = np.isposinf(facts.excluded_until)
    # Room there would be, but on an unhealthy GPU: say so, not "no room" (an XID GPU sits idle).
    # (Room on a hot GPU stays "no room": preemption can free a cool one.)
    short = n_usable < need
    sick_room = ~facts.healthy & (facts.capacity > 0) & fits_ever & cool & fits_now
    checks = (
        (candidate.sum(axis=1) < need, too_small),
        ((n_cool < need) & (candidate & hot).any(axis=1), Reason.GPU_HOT),
        (n_cool < need, Reason.GPU_COOLING_DOWN),
        # (Whole GPUs keep "no free whole gpus", resolvable: preemption can free a healthy one.)
        (
            short & (n_usable + sick_room.sum(axis=1) >= need) & (not demand.needs_whole_gpu),
            Reason.ROOM_ONLY_ON_UNHEALTHY_GPU,
        ),
        (short, busy_reason),
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
