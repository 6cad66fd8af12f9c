"""Filter, prioritize and preempt as functions of bytes: decode → translate → policy → encode.

No HTTP here, so the verbs can be called by tests and benchmarks directly. Every failure
becomes an answer the scheduler understands; nothing raises out of these functions. Bind, which
also reads the cluster, is ``bind``'s, with the helpers here (the pod's demand, the GPUs it
gets on a node); ``explain`` answers /debug/explain.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_extender.api.context import AppContext
from scheduler_extender.domain import Assignment, PodDemand
from scheduler_extender.errors import RequestError
from scheduler_extender.k8s import translate, wire
from scheduler_extender.policy.base import REASON_RESOLVABLE, REASON_TEXT, Reason
from scheduler_extender.policy.combine import evaluate
from scheduler_extender.policy.rules import TERMS

log = logging.getLogger("scheduler_extender")

# Evicting pods can only help a node that fails for want of free room right now.
_PREEMPTION_HELPS = frozenset(
    {Reason.OK, Reason.NO_FREE_BLOCKS, Reason.NO_FREE_GPUS, Reason.ROOM_ONLY_ON_UNHEALTHY_GPU}
)


def log_refused(verb: str, exc: Exception, level: int = logging.INFO) -> None:
    """Log a refused request once, with the verb in front once (wire errors name it already)."""
    message = str(exc)
    log.log(level, "%s", message if message.startswith(f"{verb}: ") else f"{verb}: {message}")


def read_demand(ctx: AppContext, pod: dict[str, Any]) -> PodDemand:
    """What the pod asks for, kept so that bind (which gets only the pod's name) knows it."""
    demand = pod_demand(ctx, pod)
    ctx.state.remember_demand(demand)
    return demand


def pod_demand(ctx: AppContext, pod: dict[str, Any]) -> PodDemand:
    """What the pod asks for: extended resources, or the ResourceClaims of our DRA driver."""
    spec = ctx.state.policy.spec
    demand = translate.pod_demand(pod, spec.qos, spec.whole_gpu_resources)
    dra = ctx.sync.dra if ctx.sync is not None else None
    if demand.wants_gpu or dra is None:
        return demand
    wants = dra.wants_of(pod)
    if not wants:
        # Allocated already (kube-scheduler writes the allocation before it asks to bind): the
        # claims say which GPUs the pod holds.
        return dataclasses.replace(demand, through_claims=True) if dra.claims_of(pod) else demand
    block = spec.memory.block_mib
    shared = [w for w in wants if w.memory_mib is not None and w.count == 1]
    if len(shared) == 1 == len(wants):
        # Part of one GPU's memory, in whole blocks (as the slice's requestPolicy rounds it).
        blocks = -(-(shared[0].memory_mib or 0) // block)
        return dataclasses.replace(demand, mem_blocks=max(blocks, 1), through_claims=True)
    return dataclasses.replace(demand, whole_gpus=sum(w.count for w in wants), through_claims=True)


def filter_verb(ctx: AppContext, body: bytes) -> bytes:
    """``POST /filter``: the nodes that can take the pod, and why the others cannot.

    In the ``best`` mode (``--filter-answer``) only the best node is answered, and the pod's
    GPUs are reserved there; the reasons of the others are given only when no node fits, so
    that FailedScheduling events and preemption see them. A pod without GPUs gets every node
    that scores highest (all that fit when fragmentation scoring is off), for kube-scheduler to
    choose from.
    """
    try:
        args = wire.parse_extender_args(body, "filter")
        demand = read_demand(ctx, args.pod)
        state = ctx.state
        if state.reserved(demand.uid):
            state.release(demand.uid)  # filtered again: the cycle that reserved did not bind
        names = args.candidates()
        decision = state.decide(names, demand, args.labels())
        ctx.metrics.count_verdicts("filter", decision.reason, decision.passed)
        passed = decision.passed
        if ctx.settings.filter_answer == "best" and decision.ranked:
            best = decision.best(ctx.rng, single=demand.wants_gpu)
            if best.size:
                if demand.wants_gpu:
                    _reserve(ctx, demand, names[best[0]], decision.gpus[best[0]])
                passed = np.zeros(len(names), dtype=np.bool_)
                passed[best] = True
                return wire.encode_filter_result(args, passed.tolist())
        failing = np.flatnonzero(~passed)
        codes = decision.reason[failing]
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for name, text, ok in zip(
            [names[i] for i in failing.tolist()],
            REASON_TEXT[codes].tolist(),
            REASON_RESOLVABLE[codes].tolist(),
            strict=True,
        ):
            (failed if ok else unresolvable)[name] = text
        return wire.encode_filter_result(args, passed.tolist(), failed, unresolvable)
    except RequestError as exc:
        ctx.metrics.request_errors.labels("filter", "malformed").inc()
        log_refused("filter", exc)
        return wire.encode_filter_result(None, None, error=str(exc))
    except Exception as exc:  # a bug must not become a 500 the scheduler cannot read
        ctx.metrics.request_errors.labels("filter", "internal").inc()
        log.exception("filter: internal error")
        return wire.encode_filter_result(
            None, None, error=f"edgegpu: internal error ({type(exc).__name__})"
        )


def prioritize_verb(ctx: AppContext, body: bytes) -> bytes:
    """``POST /prioritize``: a 0..10 score for every node sent, and only those.

    In the ``all`` mode the pod's GPUs are reserved on the node it scores best on, the
    scheduler's likely choice (filter reserved them already in the ``best`` mode).
    """
    try:
        args = wire.parse_extender_args(body, "prioritize")
        demand = read_demand(ctx, args.pod)
        names = args.candidates()
        decision = ctx.state.decide(names, demand, args.labels())
        answer = wire.encode_priorities(names, decision.points.tolist())
        if ctx.settings.filter_answer == "all" and decision.passed.any():
            points = np.where(decision.passed, decision.points, -1)
            _reserve(ctx, demand, names[int(np.argmax(points))])
        return answer
    except RequestError as exc:
        # The scheduler ignores prioritize errors (a V(5) log line): answer [] and count it.
        ctx.metrics.request_errors.labels("prioritize", "malformed").inc()
        log_refused("prioritize", exc, logging.WARNING)
    except Exception:
        ctx.metrics.request_errors.labels("prioritize", "internal").inc()
        log.exception("prioritize: internal error")
    return b"[]"


def _reserve(
    ctx: AppContext, demand: PodDemand, node: str, gpus: npt.NDArray[np.int64] | None = None
) -> None:
    """Reserve the pod's GPUs on ``node``, the scheduler's choice to come.

    ``gpus``: the slots a decision of this moment chose there. Only where binds come (a
    cluster), and not for a pod that holds GPUs already (bound, or read back from its
    annotations). Bind takes the reservation over, or moves it to the node the scheduler
    chose instead.
    """
    if ctx.binder is None or not demand.wants_gpu:
        return
    state = ctx.state
    if state.allocations.get(demand.uid) is not None and not state.reserved(demand.uid):
        return
    assignment, _ = choose_assignment(ctx, demand, node, gpus)
    if assignment is not None:
        state.reserve(assignment)


def preempt_verb(ctx: AppContext, body: bytes) -> bytes:
    """``POST /preempt``: keep the candidate nodes where evicting the victims can help.

    A node is dropped when it is hot, unhealthy, stale or too small for the pod, or when the
    victims' known GPU assignments would not free enough room on one GPU. Victim order is kept
    (the scheduler expects decreasing priority).
    """
    try:
        args = wire.parse_preemption_args(body)
    except RequestError as exc:
        ctx.metrics.request_errors.labels("preempt", "malformed").inc()
        log_refused("preempt", exc, logging.WARNING)
        return wire.encode_preemption_result({})
    try:
        demand = read_demand(ctx, args.pod)
        if not demand.wants_gpu or not args.victims:
            return wire.encode_preemption_result(args.victims)
        names = list(args.victims)
        state = ctx.state
        state.expire()
        batch = state.batch(names)
        context = state.context(demand)
        ev = evaluate(batch, demand, state.policy, context)
        kept: dict[str, wire.Victims] = {}
        for i, node in enumerate(names):
            victims = args.victims[node]
            reason = Reason(int(ev.reason[i]))
            if not ev.passed[i] and reason not in _PREEMPTION_HELPS:
                continue
            if not victims.uids:
                kept[node] = victims  # a placeholder node (no victims): pass it through
                continue
            known = [state.allocations.get(uid) for uid in victims.uids]
            if ev.passed[i] or not all(a is not None and a.node == node for a in known):
                kept[node] = victims
                continue
            # Every victim is ours: would freeing their GPUs make room?
            allocated = batch.allocated_blocks[i : i + 1].copy()
            whole = batch.whole_taken[i : i + 1].copy()
            for a in known:
                assert a is not None
                for g in a.gpu_indices:
                    if a.whole:
                        whole[0, g] = False
                    else:
                        allocated[0, g] = max(allocated[0, g] - a.mem_blocks, 0)
            # Without lent blocks: the victims may be the pods that lend them.
            none = np.zeros_like(allocated)
            after = evaluate(
                dataclasses.replace(
                    batch.row(i),
                    allocated_blocks=allocated,
                    whole_taken=whole,
                    lent_blocks=none,
                    borrowed_blocks=none,
                ),
                demand,
                state.policy,
                context,
            )
            if after.passed[0]:
                kept[node] = victims
        return wire.encode_preemption_result(kept)
    except RequestError as exc:
        ctx.metrics.request_errors.labels("preempt", "malformed").inc()
        log_refused("preempt", exc, logging.WARNING)
    except Exception:
        ctx.metrics.request_errors.labels("preempt", "internal").inc()
        log.exception("preempt: internal error")
    # When in doubt, leave the scheduler's own choice alone.
    return wire.encode_preemption_result(args.victims)


def choose_assignment(
    ctx: AppContext, demand: PodDemand, node: str, gpus: npt.NDArray[np.int64] | None = None
) -> tuple[Assignment | None, str]:
    """The GPUs bind gives the pod on a node, or why there are none.

    ``gpus``: the slots a decision of this moment chose there (worked out here otherwise).
    """
    state = ctx.state
    current = state.allocations.get(demand.uid)
    if current is not None and current.node == node:
        return current, ""
    if gpus is None:
        ev = state.evaluate([node], demand)
        if not ev.passed[0]:
            return None, f"node {node} cannot take the pod: {Reason(int(ev.reason[0])).text}"
        gpus = ev.gpus[0]
    slots = tuple(int(g) for g in gpus if g >= 0)
    if not slots and demand.wants_gpu:
        return None, f"node {node}: no gpu telemetry to choose a gpu from"
    return (
        Assignment(
            pod_uid=demand.uid,
            namespace=demand.namespace,
            name=demand.name,
            node=node,
            gpu_indices=slots,
            gpu_uuids=state.gpu_uuids(node, slots),
            mem_blocks=demand.mem_blocks,
            whole=demand.needs_whole_gpu,
            qos=demand.qos,
            group=demand.group,
            assigned_at=state.clock.wall(),
        ),
        "",
    )


def explain(ctx: AppContext, body: bytes) -> dict[str, Any]:
    """``POST /debug/explain``: every node's verdict, reason and score terms, raw and weighted."""
    args = wire.parse_extender_args(body, "explain")
    demand = pod_demand(ctx, args.pod)
    names = args.candidates()
    ev = ctx.state.evaluate(names, demand, args.labels())
    total_weight = sum(ev.weights) or 1.0
    nodes = []
    for i, node in enumerate(names):
        reason = Reason(int(ev.reason[i]))
        verdict = "passed" if ev.passed[i] else ("failed" if reason.resolvable else "unresolvable")
        terms = {
            term: {
                "value": round(float(ev.terms[i, t]), 4),
                "weight": ev.weights[t],
                "weighted": round(float(ev.terms[i, t]) * ev.weights[t] / total_weight, 4),
            }
            for t, term in enumerate(TERMS)
        }
        nodes.append(
            {
                "node": node,
                "verdict": verdict,
                "reason": reason.text or None,
                "score": int(ev.points[i]),
                "score_exact": round(float(ev.score[i]), 4),
                "gpus": [int(g) for g in ev.gpus[i] if g >= 0],
                "terms": terms,
            }
        )
    return {
        "pod": {
            "namespace": demand.namespace,
            "name": demand.name,
            "qos": demand.qos.wire,
            "mem_blocks": demand.mem_blocks,
            "whole_gpus": demand.whole_gpus,
            "through_claims": demand.through_claims,
            "group": demand.group,
        },
        "formula": (
            "score = round(10 · Σ weight·value / Σ weight); 'weighted' = weight·value / Σ weight"
        ),
        "nodes": nodes,
    }
