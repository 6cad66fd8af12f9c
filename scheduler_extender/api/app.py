"""``create_app``: the FastAPI application, with every dependency passed in."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry

from scheduler_extender import __version__
from scheduler_extender.api import fast, routes_debug
from scheduler_extender.api.context import AppContext
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.k8s.auth import AgentAuth
from scheduler_extender.k8s.binder import Binder
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.policy.document import DEFAULT_POLICY, Policy
from scheduler_extender.state.cluster import ClusterState
from scheduler_extender.telemetry.clock import Clock, SystemClock

log = logging.getLogger("scheduler_extender")


def create_app(
    settings: ExtenderSettings | None = None,
    *,
    policy: Policy = DEFAULT_POLICY,
    policy_source: str = "defaults",
    clock: Clock | None = None,
    registry: CollectorRegistry | None = None,
    binder: Binder | None = None,
    auth: AgentAuth | None = None,
    state: ClusterState | None = None,
) -> FastAPI:
    """Build the extender app. Nothing is created at import time; tests build fresh apps."""
    settings = settings or ExtenderSettings()
    state = state or ClusterState(clock or SystemClock(), policy)
    registry = registry or CollectorRegistry()
    ctx = AppContext(
        settings=settings,
        state=state,
        metrics=ExtenderMetrics(registry, state),
        binder=binder,
        auth=auth,
        policy_source=policy_source,
    )
    app = FastAPI(
        title="edgegpu scheduler extender",
        version=__version__,
        description="GPU-aware kube-scheduler extender: filter, prioritize, preempt, bind.",
        redirect_slashes=False,
    )
    app.state.ctx = ctx
    app.include_router(routes_debug.router)
    app.add_middleware(fast.FastRoutes, ctx=ctx, prefix=settings.path_prefix)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            schema["paths"] = {
                **fast.fast_openapi(settings.path_prefix),
                **schema["paths"],
            }
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": "invalid request", "problems": exc.errors()}, status_code=422)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        return JSONResponse({"error": f"internal error ({type(exc).__name__})"}, status_code=500)

    return app
