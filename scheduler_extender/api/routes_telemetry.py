"""``POST /v1/telemetry``: agents push their reports here (DESIGN.md §3)."""

from __future__ import annotations

import ipaddress
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from scheduler_extender.api.context import BodyTooLarge, get_ctx, read_body
from scheduler_extender.telemetry.schema import TelemetryReport

router = APIRouter(tags=["telemetry"])

_MAX_ERRORS = 20


def _is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@router.post(
    "/v1/telemetry",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": TelemetryReport.model_json_schema()}},
        }
    },
    summary="Push one node's GPU telemetry",
)
async def push(request: Request) -> JSONResponse:
    """Validate and store one report; an old ``seq`` of the same boot is ignored (200)."""
    ctx = get_ctx(request)
    start = time.perf_counter()
    try:
        client = request.client.host if request.client else None
        if not _is_loopback(client):
            ctx.metrics.telemetry.labels("unauthorized").inc()
            return JSONResponse(
                {"error": "no agent authentication is configured: only loopback clients may push"},
                status_code=403,
            )
        ctx.warn_once(
            "no-auth",
            "telemetry: no agent authentication configured; accepting pushes from loopback only",
        )
        try:
            body = await read_body(request, ctx.settings.max_telemetry_bytes)
        except BodyTooLarge as exc:
            ctx.metrics.telemetry.labels("too_large").inc()
            return JSONResponse({"error": str(exc)}, status_code=413)
        try:
            report = TelemetryReport.model_validate_json(body)
        except ValidationError as exc:
            ctx.metrics.telemetry.labels("invalid").inc()
            errors = exc.errors(include_url=False, include_input=False, include_context=False)
            return JSONResponse(
                {
                    "error": f"invalid telemetry report ({len(errors)} problems)",
                    "problems": [
                        {"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"]}
                        for e in errors[:_MAX_ERRORS]
                    ],
                },
                status_code=422,
            )
        result = ctx.state.ingest(report)
        ctx.metrics.telemetry.labels("accepted" if result.accepted else "ignored").inc()
        payload: dict[str, object] = {
            "accepted": result.accepted,
            # GPUs holding high-QoS pods: the agent keeps them out of power saving.
            "performance_gpus": ctx.state.performance_gpus(report.node),
        }
        if result.reason:
            payload["reason"] = result.reason
        return JSONResponse(payload)
    finally:
        ctx.metrics.latency.labels("telemetry").observe(time.perf_counter() - start)
