"""The hot routes as a pure ASGI fast path: the scheduler verbs and telemetry ingest.

kube-scheduler waits on every call, and the framework's routing, request objects and
response classes cost more than our whole decision at 5,000 nodes (and several times the cost
of storing one telemetry push); so ``POST /filter``, ``/prioritize``, ``/preempt``, ``/bind``
and ``/v1/telemetry`` are answered here, in front of FastAPI, and everything else falls through
to it. Scheduler verbs always answer 200 with errors in the body, as the extender protocol
requires. The OpenAPI document still describes these routes (``fast_openapi``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI

from scheduler_extender.api import ingest, verbs
from scheduler_extender.api.context import AppContext
from scheduler_extender.httpproto import CLIENT_CERT_KEY
from scheduler_extender.k8s import wire
from scheduler_extender.serving import (
    TELEMETRY_PATH,
    Receive,
    Scope,
    Send,
    declared_length,
    internal_error,
    read_body,
    read_push,
    send_json,
)
from scheduler_extender.telemetry.schema import TelemetryReport

Handler = Callable[[AppContext, bytes], Awaitable[bytes] | bytes]

log = logging.getLogger("scheduler_extender")

VERBS: dict[str, Handler] = {
    "filter": verbs.filter_verb,
    "prioritize": verbs.prioritize_verb,
    "preempt": verbs.preempt_verb,
    "bind": verbs.bind_verb,
}


_POST_ONLY = b'{"error":"method not allowed: POST only"}'
_NO_CLIENT_CERT = b'{"error":"the scheduler verbs need a client certificate (--client-ca-file)"}'


def _too_large(verb: str, ctx: AppContext, message: str) -> bytes:
    ctx.metrics.request_errors.labels(verb, "malformed").inc()
    message = f"edgegpu: {verb}: {message}"
    if verb == "prioritize":
        return b"[]"
    if verb == "preempt":
        return wire.encode_preemption_result({})
    if verb == "bind":
        return wire.encode_binding_result(message)
    return wire.encode_filter_result(None, None, error=message)


class FastRoutes:
    """Answers the hot routes; ``handle`` says False for anything else."""

    def __init__(self, ctx: AppContext, prefix: str = "") -> None:
        self.ctx = ctx
        self.routes: dict[str, tuple[str, Handler | None]] = {
            f"{prefix}/{verb}": (verb, handler) for verb, handler in VERBS.items()
        }
        self.routes[TELEMETRY_PATH] = ("telemetry", None)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer a hot route and return True; False when the request is not one."""
        route = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if route is None:
            return False
        if scope["method"] != "POST":
            await send_json(send, 405, _POST_ONLY, [(b"allow", b"POST")])
            return True
        verb, handler = route
        ctx = self.ctx
        if (
            handler is not None
            and ctx.settings.client_ca_file is not None
            and not scope.get(CLIENT_CERT_KEY)
        ):
            ctx.metrics.request_errors.labels(verb, "forbidden").inc()
            await send_json(send, 403, _NO_CLIENT_CERT)
            return True
        start = time.perf_counter()
        status = 200
        try:
            if handler is None:
                push = await read_push(scope, receive, ctx.settings.max_telemetry_bytes)
                status, out = await ingest.push(ctx, *push)
            else:
                limit = ctx.settings.max_request_bytes
                body = await read_body(receive, limit, declared_length(scope))
                if body is None:
                    out = _too_large(verb, ctx, f"body is over the limit of {limit} bytes")
                else:
                    result = handler(ctx, body)
                    out = await result if isinstance(result, Awaitable) else result
        except TimeoutError:
            status, out = 408, b'{"error":"the request body did not arrive in time"}'
        except Exception as exc:  # the verbs answer their own errors; this is the last guard
            log.exception("internal error on %s", scope["path"])
            status, out = 500, internal_error(exc)
        await send_json(send, status, out)
        ctx.metrics.observe_latency(verb, time.perf_counter() - start)
        return True


class ExtenderAPI(FastAPI):
    """FastAPI with the hot routes answered before its middleware stack is entered.

    The scheduler verbs and telemetry pushes need none of the framework's middleware (error
    pages, body limits, routing); going through it cost about a fifth of a push.
    """

    fast: FastRoutes | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection."""
        if self.fast is None or not await self.fast.handle(scope, receive, send):
            await super().__call__(scope, receive, send)


_ARGS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "ExtenderArgs: Pod plus NodeNames (nodeCacheCapable) or Nodes (a NodeList).",
    "properties": {
        "Pod": {"type": "object"},
        "Nodes": {"type": ["object", "null"]},
        "NodeNames": {"type": ["array", "null"], "items": {"type": "string"}},
    },
}
_DOCS = {
    "filter": ("Filter nodes for a pod", _ARGS_SCHEMA, "ExtenderFilterResult"),
    "prioritize": ("Score nodes 0..10", _ARGS_SCHEMA, "HostPriorityList: [{Host, Score}]"),
    "preempt": (
        "Drop preemption candidates where evicting cannot help",
        {"type": "object", "description": "ExtenderPreemptionArgs"},
        "ExtenderPreemptionResult (always NodeNameToMetaVictims)",
    ),
    "bind": (
        "Assign GPUs and bind the pod",
        {
            "type": "object",
            "description": "ExtenderBindingArgs: PodName, PodNamespace, PodUID, Node",
        },
        "ExtenderBindingResult: {Error}",
    ),
}


def fast_openapi(prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """OpenAPI path items for the fast routes, and the component schemas they refer to.

    The fast routes are not FastAPI routes, so FastAPI does not describe them.
    """
    paths: dict[str, Any] = {
        f"{prefix}/{verb}": {
            "post": {
                "tags": ["scheduler"],
                "summary": summary,
                "operationId": f"{verb}_verb",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": schema}},
                },
                "responses": {
                    "200": {
                        "description": f"{answer}; always 200, errors in the body",
                        "content": {"application/json": {"schema": {}}},
                    }
                },
            }
        }
        for verb, (summary, schema, answer) in _DOCS.items()
    }
    report = TelemetryReport.model_json_schema(ref_template="#/components/schemas/{model}")
    components = report.pop("$defs", {})
    components["TelemetryReport"] = report
    paths[TELEMETRY_PATH] = {
        "post": {
            "tags": ["telemetry"],
            "summary": "Push one node's GPU telemetry",
            "operationId": "telemetry_push",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/TelemetryReport"}}
                },
            },
            "responses": {
                "200": {"description": "{accepted, performance_gpus, max_temp_c[, reason]}"},
                "401": {"description": "no or bad bearer token"},
                "403": {"description": "the token may not report for this node"},
                "413": {"description": "report over the size cap"},
                "422": {"description": "invalid report, every problem located"},
            },
        }
    }
    return paths, components
