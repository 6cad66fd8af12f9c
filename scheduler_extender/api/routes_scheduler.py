"""``POST /filter``, ``/prioritize``, ``/preempt``, ``/bind``: always 200, errors in the body."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response

from scheduler_extender.api import verbs
from scheduler_extender.api.context import AppContext, BodyTooLarge, get_ctx, read_body
from scheduler_extender.k8s import wire

_JSON = "application/json"

_ARGS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "ExtenderArgs: Pod plus NodeNames (nodeCacheCapable) or Nodes (NodeList).",
    "properties": {
        "Pod": {"type": "object"},
        "Nodes": {"type": ["object", "null"]},
        "NodeNames": {"type": ["array", "null"], "items": {"type": "string"}},
    },
}


def _doc(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {_JSON: {"schema": schema}}}}


def _too_large(verb: str, ctx: AppContext, exc: BodyTooLarge) -> bytes:
    ctx.metrics.request_errors.labels(verb, "malformed").inc()
    message = f"edgegpu: {verb}: {exc}"
    if verb == "prioritize":
        return b"[]"
    if verb == "preempt":
        return wire.encode_preemption_result({})
    if verb == "bind":
        return wire.encode_binding_result(message)
    return wire.encode_filter_result(None, None, error=message)


def build_router(prefix: str) -> APIRouter:
    """The scheduler verbs under the path of the scheduler's ``urlPrefix``."""
    router = APIRouter(prefix=prefix, tags=["scheduler"])

    async def run(
        verb: str, request: Request, handle: Callable[[AppContext, bytes], Awaitable[bytes] | bytes]
    ) -> Response:
        ctx = get_ctx(request)
        start = time.perf_counter()
        try:
            body = await read_body(request, ctx.settings.max_request_bytes)
        except BodyTooLarge as exc:
            out = _too_large(verb, ctx, exc)
        else:
            result = handle(ctx, body)
            out = await result if isinstance(result, Awaitable) else result
        ctx.metrics.latency.labels(verb).observe(time.perf_counter() - start)
        return Response(out, media_type=_JSON)

    @router.post("/filter", openapi_extra=_doc(_ARGS_SCHEMA), summary="Filter nodes for a pod")
    async def filter_nodes(request: Request) -> Response:
        return await run("filter", request, verbs.filter_verb)

    @router.post("/prioritize", openapi_extra=_doc(_ARGS_SCHEMA), summary="Score nodes 0..10")
    async def prioritize_nodes(request: Request) -> Response:
        return await run("prioritize", request, verbs.prioritize_verb)

    @router.post(
        "/preempt",
        openapi_extra=_doc({"type": "object", "description": "ExtenderPreemptionArgs"}),
        summary="Drop preemption candidates where evicting cannot help",
    )
    async def preempt(request: Request) -> Response:
        return await run("preempt", request, verbs.preempt_verb)

    @router.post(
        "/bind",
        openapi_extra=_doc({"type": "object", "description": "ExtenderBindingArgs"}),
        summary="Assign GPUs and bind the pod",
    )
    async def bind(request: Request) -> Response:
        return await run("bind", request, verbs.bind_verb)

    return router
