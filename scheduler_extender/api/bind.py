"""``POST /bind``: check the pod against the cluster, choose its GPUs, record them, bind.

A function of bytes like the other verbs (``verbs``), whose helpers it shares; it awaits the
API server where the watch has not seen the pod yet, and the binder.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from scheduler_extender.api.context import AppContext
from scheduler_extender.api.verbs import choose_assignment, log_refused, read_demand
from scheduler_extender.domain import PodDemand
from scheduler_extender.errors import BindError, RequestError
from scheduler_extender.k8s import wire
from scheduler_extender.k8s.client import KubeError

log = logging.getLogger("scheduler_extender")


DEFAULT_SCHEDULER = "default-scheduler"
"""The API server's value for a pod whose spec names no scheduler."""


async def _cluster_pod(ctx: AppContext, args: wire.BindingArgs) -> dict[str, Any] | None:
    """The pod a bind names, as the cluster has it: the watch cache, else the API server.

    None when the cluster has no pod of that namespace, name and uid (deleted, created again
    under the same name, or never there).
    """
    assert ctx.sync is not None
    pod = ctx.sync.pods.get((args.pod_namespace, args.pod_name))
    if pod is None or pod["metadata"].get("uid") != args.pod_uid:
        try:
            pod = await asyncio.to_thread(ctx.sync.api.get_pod, args.pod_namespace, args.pod_name)
        except KubeError as exc:
            log.info("bind: pod %s/%s: %s", args.pod_namespace, args.pod_name, exc)
            return None
    return pod if pod["metadata"].get("uid") == args.pod_uid else None


async def _bind_demand(ctx: AppContext, args: wire.BindingArgs) -> PodDemand | tuple[str, str]:
    """What the pod asks for, or (metric result, error) refusing the bind.

    With a cluster, only a pod the cluster has under the uid sent, and whose
    ``spec.schedulerName`` is one of ``scheduler_names``, is bound; what it asks for is read
    from the cluster's copy, never from a request body. The bind may reach a replica (or a
    restarted process) that never saw the pod's filter: the pod comes from the watch cache,
    or from the API server when the watch has not seen it yet. Without a cluster (embedded
    mode) there is no pod to check, and no binder writes to one: the pod's filter says what it
    asks.
    """
    where = f"{args.pod_namespace}/{args.pod_name}"
    if ctx.sync is None:
        demand = ctx.state.demand_of(args.pod_uid)
        if demand is None:
            return "unknown_pod", (
                f"edgegpu: pod {where} was never filtered by this extender; configure "
                "filterVerb together with bindVerb"
            )
        return demand
    pod = await _cluster_pod(ctx, args)
    if pod is None:
        return "unknown_pod", f"edgegpu: pod {where} (uid {args.pod_uid}) is not in the cluster"
    scheduler = (pod.get("spec") or {}).get("schedulerName") or DEFAULT_SCHEDULER
    served = ctx.settings.scheduler_names
    if scheduler not in served:
        return "foreign_scheduler", (
            f"edgegpu: pod {where} is for scheduler {scheduler!r}, and this extender binds for "
            f"{', '.join(served)} only (--scheduler-names)"
        )
    try:
        return read_demand(ctx, pod)
    except RequestError as exc:
        log_refused("bind", exc)
        return "unknown_pod", f"edgegpu: pod {where}: {exc}"


async def bind_verb(ctx: AppContext, body: bytes) -> bytes:
    """``POST /bind``: choose the GPUs, record them, then have the binder create the Binding."""
    try:
        args = wire.parse_binding_args(body)
    except RequestError as exc:
        ctx.metrics.binds.labels("malformed").inc()
        return wire.encode_binding_result(str(exc))
    demand = await _bind_demand(ctx, args)
    if isinstance(demand, tuple):
        result, error = demand
        ctx.metrics.binds.labels(result).inc()
        return wire.encode_binding_result(error)
    claims = demand.through_claims
    if claims or not demand.wants_gpu:
        # kube-scheduler allocated a claim pod's GPUs and wrote them into its claims before it
        # asked to bind: bound as a pod without GPUs, it holds the ones its claims say. What a
        # filter reserved for it is let go, never written on the pod.
        if ctx.state.reserved(demand.uid):
            ctx.state.release(demand.uid)
        demand = dataclasses.replace(demand, whole_gpus=0, mem_blocks=0)
    try:
        assignment, why = choose_assignment(ctx, demand, args.node)
        if assignment is None:
            ctx.metrics.binds.labels("no_fit").inc()
            return wire.encode_binding_result(f"edgegpu: {why}")
        if claims:  # a retry may find the GPUs its claims hold: they are not the Binding's
            assignment = dataclasses.replace(assignment, gpu_indices=(), gpu_uuids=())
        gpus = ", ".join(
            f"{i} ({u})" if u else str(i)
            for i, u in zip(assignment.gpu_indices, assignment.gpu_uuids, strict=True)
        )
        if ctx.binder is None:
            ctx.metrics.binds.labels("no_binder").inc()
            would = f"assign gpu {gpus} on" if gpus else "bind to"
            return wire.encode_binding_result(
                f"edgegpu: no binder configured (embedded mode, no cluster): would {would} "
                f"node {args.node}"
            )
        # A retried bind finds the assignment already recorded (perhaps read back from the
        # pod, and so authoritative): keep it as it is. A pod without GPUs has none to record.
        reserved = ctx.state.reserved(assignment.pod_uid)
        added = demand.wants_gpu and (
            ctx.state.allocations.get(assignment.pod_uid) != assignment or reserved
        )
        if added:
            ctx.state.assign(assignment)
        try:
            await ctx.binder.bind(assignment)
        except BindError as exc:
            if added or reserved:
                ctx.state.release(assignment.pod_uid)
            ctx.metrics.binds.labels("failed").inc()
            return wire.encode_binding_result(f"edgegpu: bind failed: {exc}")
        ctx.state.host_pod(demand.uid, args.node, demand.cpu_milli, demand.host_memory_mib)
        ctx.metrics.binds.labels("bound").inc()
        log.info("bound %s/%s to %s gpu %s", args.pod_namespace, args.pod_name, args.node, gpus)
        return wire.encode_binding_result("")
    except Exception as exc:
        if not claims or ctx.state.reserved(demand.uid):
            ctx.state.release(demand.uid)
        ctx.metrics.binds.labels("failed").inc()
        log.exception("bind: internal error")
        return wire.encode_binding_result(f"edgegpu: internal error ({type(exc).__name__})")
