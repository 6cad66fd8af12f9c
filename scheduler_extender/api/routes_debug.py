"""Debug and ops endpoints for curl: nodes, explain, policy, health, readiness, metrics."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from scheduler_extender.api import ingest, verbs
from scheduler_extender.api.bodies import Disconnected, HeldBody, Late, NoRoom, TooLarge
from scheduler_extender.api.context import AppContext, get_ctx
from scheduler_extender.api.ingest import is_loopback
from scheduler_extender.api.server import bearer, is_json
from scheduler_extender.errors import RequestError
from scheduler_extender.policy.rules import memory
from scheduler_extender.state.cluster import ClusterState
from scheduler_extender.telemetry.fields import GPU_FIELDS
from scheduler_extender.telemetry.report import GpuProcess


def _debug_allowed(request: Request) -> None:
    """404 unless ``--debug-endpoints`` lets this client read /debug/*."""
    mode = get_ctx(request).settings.debug_endpoints
    client = request.client.host if request.client else None
    if mode == "off" or (mode == "loopback" and not is_loopback(client)):
        raise HTTPException(status_code=404, detail="Not Found")


router = APIRouter()
debug = APIRouter(
    dependencies=[Depends(_debug_allowed)],
    responses={404: {"description": "no such node, or /debug/* is off for this client"}},
)


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _process_view(state: ClusterState, process: GpuProcess) -> dict[str, Any]:
    """A GPU process as /debug shows it: its pod by name, when the pod holds an assignment.

    Never a pod's uid: with one, a bind naming that pod could be forged.
    """
    holder = state.allocations.get(process.pod_uid) if process.pod_uid else None
    return {
        "pid": process.pid,
        "pod": None if holder is None else f"{holder.namespace}/{holder.name}",
        "container": process.container,
        "used_mib": process.used_mib,
    }


_SUMMARY = tuple(f.name for f in GPU_FIELDS if f.debug == "summary")
"""The readings every node view shows, as the field table says."""
_DETAIL = tuple(f.name for f in GPU_FIELDS if f.debug == "detail")
"""The readings only the view of one node shows."""


def _node_view(state: ClusterState, node: str, full: bool) -> dict[str, Any]:
    record = state.store.get(node)
    row = state.table.row(node)
    now = state.clock.monotonic()
    wall_offset = state.clock.wall() - now
    spec = state.policy.spec
    assignments = state.allocations.on_node(node)
    view: dict[str, Any] = {"node": node}
    cpu_free, memory_free = state.host.free(node)
    # Free host room (Node allocatable less bound pods' requests); null without a Node object.
    view["host_free"] = {
        "cpu_milli": None if math.isnan(cpu_free) else cpu_free,
        "memory_mib": None if math.isnan(memory_free) else memory_free,
    }
    if record is None or row is None:
        view.update(reported=False, gpus=[])
    else:
        report = record.report
        age = now - record.received_at
        view.update(
            reported=True,
            age_s=round(age, 3),
            stale=age > spec.stale_telemetry.stale_after_s(report.interval_s),
            # Never the boot id or sequence number: with them a push could be forged that
            # outranks the agent's own.
            agent={"version": report.agent.version, "backend": report.agent.backend},
            rack=state.table.rack_name(int(state.table.column("rack")[row])),
            rdma=bool(state.table.column("rdma")[row]),
            node_health=msgspec.structs.asdict(report.node_health),
        )
        batch = state.table.gather(np.array([row]), now, spec.thermal_throttling)
        free = memory.free_blocks(
            batch.readings["memory_total_mib"],
            batch.unaccounted_used_mib,
            batch.allocated_blocks,
            spec.memory,
            batch.borrowed_blocks,
        )[0]
        gpus = []
        for gpu in report.gpus:
            i = gpu.index
            until = float(batch.excluded_until[0, i])
            entry: dict[str, Any] = {
                "index": i,
                "uuid": gpu.uuid,
                "model": gpu.model,
                "vendor": gpu.vendor,
                "driver_version": gpu.driver_version,
                "vbios_version": gpu.vbios_version,
                "inforom_version": gpu.inforom_version,
                "firmware_version": gpu.firmware_version,
                **{name: getattr(gpu, name) for name in _SUMMARY},
                "free_blocks": int(free[i]),
                "allocated_blocks": int(batch.allocated_blocks[0, i]),
                "lent_blocks": int(batch.lent_blocks[0, i]),
                "held_whole": bool(batch.whole_taken[0, i]),
                "hot": until == float("inf"),
                "cool_down_until": _iso(until + wall_offset)
                if now < until < float("inf")
                else None,
                "health": gpu.health,
                "health_reasons": list(gpu.health_reasons),
            }
            if full:
                entry.update(
                    {name: getattr(gpu, name) for name in _DETAIL},
                    throttle_reasons=list(gpu.throttle_reasons),
                    ecc_uncorrected=gpu.ecc_uncorrected,
                    xid_last=gpu.xid_last,
                    processes=[_process_view(state, p) for p in gpu.processes],
                )
            gpus.append(entry)
        view["gpus"] = gpus
        if full:
            view["labels"] = dict(report.labels)
            view["sampled_at"] = report.sampled_at.isoformat()
            view["received_at"] = _iso(record.received_wall)
    view["reservations"] = [
        {
            "pod": f"{a.namespace}/{a.name}",
            "gpus": list(a.gpu_indices),
            "mem_blocks": a.mem_blocks,
            "whole": a.whole,
            "qos": a.qos.wire,
            "assigned_at": _iso(a.assigned_at),
        }
        for a in assignments
    ]
    return view


def _gpu_reason(gpu: dict[str, Any], blocks: int, whole: bool, chosen: bool) -> str:
    """One GPU's verdict for a pod, in words.

    The first that holds of unhealthy, hot, cooling down, no room; else what bind would do.
    """
    if gpu["health"] == "unhealthy":
        return "unhealthy: " + (", ".join(gpu["health_reasons"]) or "no reason given")
    if gpu["hot"]:
        temperature = gpu.get("temperature_c")
        return "too hot" + (f" ({temperature:.0f} °C)" if temperature is not None else "")
    if gpu["cool_down_until"]:
        return f"cooling down until {gpu['cool_down_until']}"
    if whole and (gpu["held_whole"] or gpu["allocated_blocks"] or gpu["lent_blocks"]):
        return "not free as a whole (pods hold its blocks)"
    if not whole and gpu["held_whole"]:
        return "held whole by a pod"
    if not whole and gpu["free_blocks"] < blocks:
        return f"{gpu['free_blocks']} free blocks, {blocks} asked"
    return "chosen: bind gives this one" if chosen else "fits"


def gpu_reasons(state: ClusterState, answer: dict[str, Any]) -> dict[str, Any]:
    """``/debug/explain``'s answer with each GPU's reason (``gpu_reasons``) added.

    To each node that reported, for a pod that asks for GPUs.
    """
    pod = answer["pod"]
    blocks, whole_gpus = pod["mem_blocks"], pod["whole_gpus"]
    if not (blocks or whole_gpus):
        return answer
    whole = whole_gpus > 0 or pod["qos"] == "realtime"
    for entry in answer["nodes"]:
        gpus = _node_view(state, entry["node"], full=False)["gpus"]
        entry["gpu_reasons"] = [
            {"index": g["index"], "uuid": g["uuid"],
             "reason": _gpu_reason(g, blocks, whole, g["index"] in entry["gpus"])}
            for g in gpus
        ]  # fmt: skip
    return answer


@debug.get("/debug/nodes", tags=["debug"], summary="One row per node")
async def debug_nodes(request: Request) -> JSONResponse:
    """Freshness, rack, and per GPU temperature, power, free blocks, cool-down and health."""
    state = get_ctx(request).state
    names = sorted(set(state.store.nodes()) | set(state.table.names()))
    return JSONResponse({"nodes": [_node_view(state, n, full=False) for n in names]})


@debug.get("/debug/nodes/{name}", tags=["debug"], summary="One node in full")
async def debug_node(name: str, request: Request) -> JSONResponse:
    """Everything known about one node, its last report and its GPU reservations."""
    state = get_ctx(request).state
    if name not in state.table and state.store.get(name) is None:
        raise HTTPException(404, f"no node {name!r}: it never reported and holds no reservation")
    return JSONResponse(_node_view(state, name, full=True))


@debug.post(
    "/debug/explain",
    tags=["debug"],
    summary="Why each node passes or fails, and every score term",
    responses={
        400: {"description": "not an ExtenderArgs, or a body over the size cap"},
        408: {"description": "the body did not arrive in time"},
        415: {"description": "Content-Type is not application/json"},
        503: {"description": "too many request bodies in flight"},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    },
)
async def debug_explain(request: Request) -> Response:
    """Body: an ExtenderArgs as the scheduler would send it."""
    ctx: AppContext = get_ctx(request)
    if not is_json(request.scope):
        return JSONResponse({"error": "the body must be application/json"}, status_code=415)
    limit = ctx.settings.max_request_bytes
    try:
        async with HeldBody(request.scope, request.receive, limit, ctx.request_bodies, 0.0) as b:
            return JSONResponse(gpu_reasons(ctx.state, verbs.explain(ctx, b)))
    except RequestError as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    except TooLarge:
        return JSONResponse({"error": f"body is over the limit of {limit} bytes"}, 400)
    except NoRoom:
        return JSONResponse({"error": "too many request bodies in flight"}, 503)
    except Late:
        return JSONResponse({"error": "the request body did not arrive in time"}, status_code=408)
    except Disconnected:
        return Response(status_code=400)  # nobody reads it


@debug.get("/debug/policy", tags=["debug"], summary="The policy in force")
async def debug_policy(request: Request) -> JSONResponse:
    """The GPUSchedulingPolicy with every default filled in, and where it came from."""
    ctx = get_ctx(request)
    return JSONResponse({"source": ctx.policy_source, "policy": ctx.state.policy.describe()})


_STATUS_PAGE = (Path(__file__).parent / "static" / "status.html").read_bytes()


@debug.get("/", include_in_schema=False)
async def status_page() -> Response:
    """A live status page: every node and GPU, and the fault loop.

    Self-contained HTML that polls ``/debug/nodes`` and ``/debug/remediation``; no external assets.
    """
    return Response(_STATUS_PAGE, media_type="text/html; charset=utf-8")


@debug.get("/debug/remediation", tags=["debug"], summary="The GPU fault loop's nodes")
async def debug_remediation(request: Request) -> JSONResponse:
    """Every node not healthy in the fault loop: state, reason, history and next step.

    The leader's view (a replica that does not lead shows none); ``enabled`` and ``dryRun``
    as the policy says.
    """
    ctx = get_ctx(request)
    args = ctx.state.policy.spec.remediation
    nodes = ctx.remediator.view() if ctx.remediator is not None else []
    return JSONResponse(
        {"enabled": args.enabled, "dryRun": args.dry_run, "leader": ctx.leader, "nodes": nodes}
    )


@debug.get("/debug/maintenance", tags=["debug"], summary="The GPU maintenance in progress")
async def debug_maintenance(request: Request) -> JSONResponse:
    """The GPUMaintenance this leader runs now, node by node, as it last wrote its status.

    A replica that does not lead shows none (``kubectl get gpumaintenances`` shows them all).
    """
    ctx = get_ctx(request)
    running = ctx.remediator.maintainer.view() if ctx.remediator is not None else None
    return JSONResponse({"leader": ctx.leader, "maintenance": running})


@router.get(
    "/v1/nodes/{node}/assignments",
    tags=["telemetry"],
    summary="The GPU assignments on a node",
    responses={
        401: {"description": "no bearer token, or one the API server does not know"},
        403: {"description": "a token for another node, or not loopback without agent auth"},
        503: {"description": "this replica's pod cache is not synced yet"},
    },
)
async def node_assignments(node: str, request: Request) -> Response:
    """Which pod holds which GPU and how many blocks on ``node``.

    For that node's agent (its device plugin), authenticated as a telemetry push is.
    """
    ctx = get_ctx(request)
    client = request.client.host if request.client is not None else None
    status, body = await ingest.assignments(ctx, node, client, bearer(request.scope["headers"]))
    return Response(body, status, media_type="application/json")


@router.get(
    "/v1/nodes/{node}/claims",
    tags=["telemetry"],
    summary="The ResourceClaims allocated a GPU of the node",
    responses={
        401: {"description": "no bearer token, or one the API server does not know"},
        403: {"description": "a token for another node, or not loopback without agent auth"},
        404: {"description": "this extender runs without DRA"},
        503: {"description": "this replica's claim cache is not synced yet"},
    },
)
async def node_claims(node: str, request: Request) -> Response:
    """Each claim's devices on ``node``: GPU uuid, memory, request, share id.

    For that node's agent (its DRA plugin prepares them), authenticated as a telemetry push is.
    """
    ctx = get_ctx(request)
    client = request.client.host if request.client is not None else None
    status, body = await ingest.claims(ctx, node, client, bearer(request.scope["headers"]))
    return Response(body, status, media_type="application/json")


@router.get("/healthz", tags=["ops"])
async def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz", tags=["ops"])
async def readyz(request: Request) -> JSONResponse:
    """Readiness: the policy is loaded and the caches are synced."""
    ctx = get_ctx(request)
    body: dict[str, Any] = {
        "ready": ctx.ready,
        "policy": ctx.state.policy.metadata.name,
        "policy_source": ctx.policy_source,
        "nodes": len(ctx.state.store),
        "leader": ctx.leader,
    }
    if ctx.sync is not None:
        body["caches"] = {r.name: r.synced.is_set() for r in ctx.sync.reflectors}
        body["policy_errors"] = ctx.sync.policy_errors
    return JSONResponse(body, status_code=200 if ctx.ready else 503)


@router.get("/metrics", tags=["ops"], response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    return Response(
        generate_latest(get_ctx(request).metrics.registry), media_type=CONTENT_TYPE_LATEST
    )
