"""The hot routes as a pure ASGI fast path: the scheduler verbs and telemetry ingest.

kube-scheduler waits on every call, and the framework's routing, request objects and
response classes cost more than our whole decision at 5,000 nodes (and several times the cost
of storing one telemetry push); so ``POST /filter``, ``/prioritize``, ``/preempt``, ``/bind``
and ``/v1/telemetry`` are answered here, in front of FastAPI, and everything else falls through
to it. Scheduler verbs answer 200 with errors in the body to whatever kube-scheduler sends, as
the extender protocol requires; only what it never sends (no client certificate of the
scheduler where one is required, a body that is not JSON, or one that stops arriving) gets
another status. The OpenAPI document still describes these routes (``fast_openapi``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI

from scheduler_extender.api import bind, ingest, verbs
from scheduler_extender.api.bodies import Disconnected, HeldBody, Late, NoRoom, TooLarge
from scheduler_extender.api.context import AppContext
from scheduler_extender.api.protocol import CLIENT_CERT_KEY, PeerCertificate
from scheduler_extender.api.server import (
    TELEMETRY_PATH,
    Receive,
    Scope,
    Send,
    bearer,
    client_host,
    internal_error,
    is_json,
    send_json,
)
from scheduler_extender.k8s import wire
from scheduler_extender.logs import escape
from scheduler_extender.telemetry.schema import TelemetryReport

Handler = Callable[[AppContext, bytes], Awaitable[bytes] | bytes]
Headers = list[tuple[bytes, bytes]]

log = logging.getLogger("scheduler_extender")

VERBS: dict[str, Handler] = {
    "filter": verbs.filter_verb,
    "prioritize": verbs.prioritize_verb,
    "preempt": verbs.preempt_verb,
    "bind": bind.bind_verb,
}

VERB_WAIT_S = 1.0
"""How long a scheduler request waits for room among the bodies in flight before it is answered
with an error in its body (well inside the shipped scheduler config's 2 s httpTimeout)."""

RETRY_AFTER_S = 1
"""What a push refused for want of room is told to wait (the agent's own backoff starts there)."""

PUSH_BODY_TIMEOUT_S = 10.0
"""The longest a push may take to send its body (a scheduler verb's is ``BODY_TIMEOUT_S``): a
report is sent in one write, and a push that trickles holds part of the push budget meanwhile."""

SHOWN_NAME_CHARS = 64
"""The most of a certificate's name a refusal repeats."""

_POST_ONLY = b'{"error":"method not allowed: POST only"}'
_NO_CLIENT_CERT = b'{"error":"the scheduler verbs need a client certificate (--client-ca-file)"}'
_NOT_JSON = b'{"error":"the body must be sent as Content-Type: application/json"}'
_LATE = b'{"error":"the request body did not arrive in time"}'
_BUSY = b'{"error":"the extender holds as many telemetry bodies as it may: retry later"}'
_CLOSE: Headers = [(b"connection", b"close")]
"""On answers sent before the body was read: the connection cannot carry another request."""


def _not_the_scheduler(peer: PeerCertificate, allowed: list[str]) -> bytes:
    """The 403 body for a verified client certificate that names none of ``allowed``."""
    found = "has no CN"
    if peer.common_name is not None:
        shown = peer.common_name[:SHOWN_NAME_CHARS]
        more = "..." if len(peer.common_name) > SHOWN_NAME_CHARS else ""
        found = f"is for CN '{escape(shown)}'{more}"
    message = (
        f"the scheduler verbs need a client certificate for one of {', '.join(allowed)} "
        f"(--client-cert-names: its CN or a DNS name); this one {found}"
    )
    return orjson.dumps({"error": message})


def _refusal(verb: str, ctx: AppContext, kind: str, message: str) -> bytes:
    """A scheduler verb's answer to a request it did not decide on (still a 200: the protocol)."""
    ctx.metrics.request_errors.labels(verb, kind).inc()
    message = f"edgegpu: {verb}: {message}"
    ctx.warn_once(f"refused-{kind}", f"{message} (said once; counted by kind in metrics)")
    if verb == "prioritize":
        return b"[]"
    if verb == "preempt":
        return wire.encode_preemption_result({})
    if verb == "bind":
        return wire.encode_binding_result(message)
    return wire.encode_filter_result(None, None, error=message)


class FastRoutes:
    """Answers the hot routes; ``handle`` says False for anything else.

    Bodies are bounded twice: each by its cap (``max_request_bytes``, ``max_telemetry_bytes``),
    refused as soon as it is over; and all of them together by a budget per kind
    (``max_inflight_request_bytes``, ``max_inflight_telemetry_bytes``), reserved before a
    body is read and held until it is answered. A scheduler request that finds no room waits
    up to ``VERB_WAIT_S`` and is then answered 200 with the error in its body, as the protocol
    wants (filter and bind errors make kube-scheduler retry the pod; prioritize answers ``[]``;
    preempt keeps no candidate). A push that finds no room is answered 503 with Retry-After at
    once: the agent backs off and its next report replaces this one anyway.
    """

    def __init__(self, ctx: AppContext, prefix: str = "") -> None:
        self.ctx = ctx
        self.routes: dict[str, tuple[str, Handler | None]] = {
            f"{prefix}/{verb}": (verb, handler) for verb, handler in VERBS.items()
        }
        self.routes[TELEMETRY_PATH] = ("telemetry", None)
        self._scheduler_names = frozenset(ctx.settings.client_cert_names)
        """Names one of which a client certificate must carry to call the verbs."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer a hot route and return True; False when the request is not one."""
        route = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if route is None:
            return False
        if scope["method"] != "POST":
            await send_json(send, 405, _POST_ONLY, [(b"allow", b"POST")])
            return True
        verb, handler = route
        start = time.perf_counter()
        try:
            if handler is None:
                status, out, extra = await self._push(scope, receive)
            else:
                status, out, extra = await self._verb(verb, handler, scope, receive)
        except Disconnected:
            return True  # nobody is left to answer
        except Exception as exc:  # the verbs answer their own errors; this is the last guard
            log.exception("internal error on %s", scope["path"])
            status, out, extra = 500, internal_error(exc), []
        await send_json(send, status, out, extra)
        self.ctx.metrics.observe_latency(verb, time.perf_counter() - start)
        return True

    async def _verb(
        self, verb: str, handler: Handler, scope: Scope, receive: Receive
    ) -> tuple[int, bytes, Headers]:
        ctx = self.ctx
        if ctx.settings.client_ca_file is not None:
            peer: PeerCertificate | None = scope.get(CLIENT_CERT_KEY)
            if peer is None:
                ctx.metrics.request_errors.labels(verb, "forbidden").inc()
                return 403, _NO_CLIENT_CERT, _CLOSE
            if self._scheduler_names.isdisjoint(peer.names):
                ctx.metrics.request_errors.labels(verb, "forbidden").inc()
                return 403, _not_the_scheduler(peer, ctx.settings.client_cert_names), _CLOSE
        if not is_json(scope):
            ctx.metrics.request_errors.labels(verb, "unsupported_media_type").inc()
            return 415, _NOT_JSON, _CLOSE
        limit = ctx.settings.max_request_bytes
        try:
            async with HeldBody(scope, receive, limit, ctx.request_bodies, VERB_WAIT_S) as body:
                result = handler(ctx, body)
                out = await result if isinstance(result, Awaitable) else result
                return 200, out, []
        except TooLarge:
            message = (
                f"the body is over the limit of {limit} bytes (--max-request-bytes; with "
                "nodeCacheCapable: false the scheduler sends whole Node objects: raise it, "
                "with --max-inflight-request-bytes)"
            )
            return 200, _refusal(verb, ctx, "too_large", message), _CLOSE
        except NoRoom:
            message = (
                f"the extender is busy: requests in flight hold the {ctx.request_bodies.capacity} "
                "bytes of bodies it may hold at once (--max-inflight-request-bytes)"
            )
            return 200, _refusal(verb, ctx, "busy", message), _CLOSE
        except Late:
            ctx.metrics.request_errors.labels(verb, "timeout").inc()
            return 408, _LATE, _CLOSE

    async def _push(self, scope: Scope, receive: Receive) -> tuple[int, bytes, Headers]:
        ctx = self.ctx
        if not is_json(scope):
            ctx.metrics.telemetry.labels("unsupported_media_type").inc()
            return 415, _NOT_JSON, _CLOSE
        # Who pushes is known before the body is read: a stranger holds none of the budget.
        identity = await ingest.authenticate_push(ctx, client_host(scope), bearer(scope["headers"]))
        if isinstance(identity, tuple):
            return *identity, _CLOSE
        limit = ctx.settings.max_telemetry_bytes
        try:
            held = HeldBody(scope, receive, limit, ctx.push_bodies, 0.0, PUSH_BODY_TIMEOUT_S)
            async with held as body:
                status, out = ingest.push(ctx, identity, body)
                return status, out, []
        except TooLarge:
            return *ingest.too_large(ctx), _CLOSE
        except NoRoom:
            ctx.metrics.telemetry.labels("busy").inc()
            return 503, _BUSY, [(b"retry-after", b"%d" % RETRY_AFTER_S), *_CLOSE]
        except Late:
            ctx.metrics.telemetry.labels("late").inc()
            return 408, _LATE, _CLOSE


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
            "description": "ExtenderBindingArgs: PodName, PodNamespace, PodUID, Node. PodUID "
            "must be the pod's (kube-scheduler always sends it), and the pod's "
            "spec.schedulerName one of --scheduler-names; else Error says why.",
        },
        "ExtenderBindingResult: {Error}",
    ),
}
_REFUSED_BEFORE_READING = {
    "408": {"description": "the body did not arrive in time"},
    "415": {"description": "Content-Type is not application/json"},
}


def fast_openapi(prefix: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """OpenAPI path items for the fast routes, and the components they refer to, by section.

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
                        "description": f"{answer}; always 200 for what kube-scheduler sends, "
                        "errors in the body",
                        "content": {"application/json": {"schema": {}}},
                    },
                    "403": {
                        "description": "no verified client certificate (--client-ca-file) "
                        "for one of --client-cert-names"
                    },
                    **_REFUSED_BEFORE_READING,
                },
            }
        }
        for verb, (summary, schema, answer) in _DOCS.items()
    }
    report = TelemetryReport.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas = report.pop("$defs", {})
    schemas["TelemetryReport"] = report
    paths[TELEMETRY_PATH] = {
        "post": {
            "tags": ["telemetry"],
            "summary": "Push one node's GPU telemetry",
            "operationId": "telemetry_push",
            "security": [{"agentToken": []}],
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
                **_REFUSED_BEFORE_READING,
                "503": {
                    "description": "too many bodies in flight: retry after the time given",
                    "headers": {"Retry-After": {"schema": {"type": "integer"}}},
                },
            },
        }
    }
    components = {
        "schemas": schemas,
        "securitySchemes": {
            "agentToken": {
                "type": "http",
                "scheme": "bearer",
                "description": "The agent's projected ServiceAccount token (a static token in "
                "the embedded mode; none needed from loopback without agent authentication)",
            }
        },
    }
    return paths, components
