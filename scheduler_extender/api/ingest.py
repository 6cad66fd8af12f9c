"""``POST /v1/telemetry``: authenticate, validate, store one agent report (DESIGN.md §3).

Answered on the fast path beside the scheduler verbs: at 5,000 nodes pushing every few
seconds, framework overhead per push would cost a core. Without agent authentication only
loopback clients may push (and a warning is logged once).
"""

from __future__ import annotations

import functools
import ipaddress
from typing import Any

import orjson

from scheduler_extender.api.context import AppContext
from scheduler_extender.k8s.auth import AuthError, Identity
from scheduler_extender.telemetry.decode import ReportError, decode_report

_MAX_PROBLEMS = 20


@functools.lru_cache(maxsize=1024)
def is_loopback(host: str | None) -> bool:
    """Whether a client address is on this machine."""
    if host is None:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _error(status: int, message: str, **extra: Any) -> tuple[int, bytes]:
    return status, orjson.dumps({"error": message, **extra})


async def push(
    ctx: AppContext,
    body: bytes | None,
    client: str | None,
    token: str | None,
    take_turn: bool = True,
) -> tuple[int, bytes]:
    """One push → (status, JSON body). ``body`` None means it was over the size cap.

    ``take_turn``: wait for a turn after the scheduler's verbs (``PushTurns``) before storing;
    a caller that yields to them by itself says False.
    """
    metrics = ctx.metrics.telemetry
    identity: Identity | None = None
    if ctx.auth is None:
        if not is_loopback(client):
            metrics.labels("unauthorized").inc()
            return _error(
                403, "no agent authentication is configured: only loopback clients may push"
            )
        ctx.warn_once(
            "no-auth", "telemetry: no agent authentication configured; loopback pushes only"
        )
    else:
        if token is None:
            metrics.labels("unauthorized").inc()
            return _error(401, "a bearer token is required (the agent's ServiceAccount token)")
        try:
            identity = await ctx.auth.authenticate(token)
        except AuthError as exc:
            metrics.labels("unauthorized" if exc.status == 401 else "forbidden").inc()
            return _error(exc.status, str(exc))
    if body is None:
        metrics.labels("too_large").inc()
        return _error(413, f"report is over the limit of {ctx.settings.max_telemetry_bytes} bytes")
    try:
        report = decode_report(body, _MAX_PROBLEMS)
    except ReportError as exc:
        metrics.labels("invalid").inc()
        return _error(422, str(exc), problems=exc.problems)
    if ctx.auth is not None and identity is not None:
        try:
            ctx.auth.authorize(identity, report.node)
        except AuthError as exc:
            metrics.labels("forbidden").inc()
            return _error(exc.status, str(exc))
    if take_turn:
        await ctx.push_turns.take()  # the scheduler's verbs that came meanwhile go first
    result = ctx.state.ingest(report)
    (ctx.metrics.pushes_accepted if result.accepted else ctx.metrics.pushes_ignored).inc()
    payload: dict[str, Any] = {
        "accepted": result.accepted,
        # GPUs holding high-QoS pods: the agent keeps them out of power saving.
        "performance_gpus": ctx.state.performance_gpus(report.node),
    }
    if result.reason:
        payload["reason"] = result.reason
    return 200, orjson.dumps(payload)
