"""``create_app``: the FastAPI application, with every dependency passed in."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry
from swagger_ui_bundle import swagger_ui_path

from scheduler_extender import __version__
from scheduler_extender.api import fast, routes_debug
from scheduler_extender.api.context import AppContext
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.k8s.auth import AgentAuth, StaticTokenAuth, TokenReviewAuth
from scheduler_extender.k8s.binder import Binder, KubeBinder
from scheduler_extender.k8s.client import KubeApi
from scheduler_extender.k8s.dra import DraView
from scheduler_extender.k8s.leader import LeaseElector
from scheduler_extender.k8s.sync import ClusterSync
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.policy.document import DEFAULT_POLICY, Policy
from scheduler_extender.remediation.runner import Remediator
from scheduler_extender.state.cluster import ClusterState
from scheduler_extender.telemetry.clock import Clock, SystemClock

log = logging.getLogger("scheduler_extender")


_REVIEWS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tokenreview")
"""TokenReviews run here, never on the default executor that bind's pod reads use: a flood
of made-up tokens waits its turn here instead of delaying binds."""


async def _run_in(pool: ThreadPoolExecutor, fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


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
    kube: KubeApi | None = None,
) -> FastAPI:
    """Build the extender app. Nothing is created at import time; tests build fresh apps.

    With ``kube`` (an API server), the app's lifespan starts the Node/Pod/policy watches and,
    when enabled, leader election; bind goes to the API server and agents authenticate with
    TokenReview. Without it (embedded mode) bind only reports its choice and pushes come from
    loopback or carry a static token.
    """
    settings = settings or ExtenderSettings()
    state = state or ClusterState(clock or SystemClock(), policy)
    registry = registry or CollectorRegistry()
    if binder is None and kube is not None:
        binder = KubeBinder(kube)
    if auth is None and settings.static_token_file is not None:
        auth = StaticTokenAuth(settings.static_token_file)
    ctx = AppContext(
        settings=settings,
        state=state,
        metrics=ExtenderMetrics(registry, state),
        binder=binder,
        auth=auth,
        policy_source=policy_source,
    )
    if ctx.auth is None and kube is not None:
        audiences = [settings.token_audience]
        ctx.auth = TokenReviewAuth(
            lambda token: kube.token_review(token, audiences),
            lambda ns, name: ctx.sync.pod_lookup(ns, name) if ctx.sync else None,
            namespace=settings.agent_namespace,
            service_account=settings.agent_service_account,
            audience=settings.token_audience,
            run=functools.partial(_run_in, _REVIEWS),
        )

    @asynccontextmanager
    async def _cluster(kube: KubeApi) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()

        def on_policy(new: Policy, source: str) -> None:
            ctx.policy_source = source

        ctx.sync = ClusterSync(
            kube,
            state,
            loop,
            policy_name=settings.policy_name,
            base_policy=policy,
            on_policy=on_policy,
            on_restart=lambda resource, why: ctx.metrics.watch_restarts.labels(resource, why).inc(),
            dra=DraView(state.clock.monotonic) if settings.dra else None,
        )
        sync_now = ctx.sync
        ctx.metrics.policy_refused.set_function(lambda: float(bool(sync_now.policy_errors)))
        ctx.sync.start()
        identity = settings.identity or f"{socket.gethostname()}-{os.getpid()}"
        if settings.leader_elect:
            ctx.elector = LeaseElector(
                kube,
                namespace=settings.namespace,
                name=settings.lease_name,
                identity=identity,
                on_change=lambda leader: ctx.metrics.leader.set(1 if leader else 0),
            )
            ctx.elector.start()
        elector, sync = ctx.elector, ctx.sync
        ctx.remediator = Remediator(
            state,
            kube,
            ctx.metrics,
            lambda for_s: elector is None or elector.holds(for_s),
            nodes=lambda: sync.nodes,
            pods=lambda: sync.pods_by_uid,
            # A replica running its start-up policy beside a refused one acts on nothing.
            synced=lambda: sync.synced and not sync.policy_refused,
            identity=identity,
            namespace=settings.namespace,
            dra=ctx.sync.dra,
        )
        acting = asyncio.create_task(ctx.remediator.run())
        slices = ctx.remediator.slices
        publishing = asyncio.create_task(slices.run()) if slices is not None else None
        try:
            yield
        finally:
            acting.cancel()
            if publishing is not None:
                publishing.cancel()
            if ctx.elector is not None:
                await asyncio.to_thread(ctx.elector.stop)
            await asyncio.to_thread(ctx.sync.stop)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if kube is None:
            yield
        else:
            async with _cluster(kube):
                yield

    app = fast.ExtenderAPI(
        title="edgegpu scheduler extender",
        version=__version__,
        description="GPU-aware kube-scheduler extender: filter, prioritize, preempt, bind.",
        redirect_slashes=False,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.ctx = ctx
    # Swagger UI from a package, not a CDN: the page works on an air-gapped edge site. URLs are
    # relative so that it also works behind a proxy path (the API server's service proxy).
    app.mount("/docs/static", StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="openapi.json",
            title=f"{app.title} - Swagger UI",
            swagger_js_url="docs/static/swagger-ui-bundle.js",
            swagger_css_url="docs/static/swagger-ui.css",
            swagger_favicon_url="docs/static/favicon-32x32.png",
        )

    app.include_router(routes_debug.router)
    app.include_router(routes_debug.debug)
    app.fast = fast.FastRoutes(ctx, prefix=settings.path_prefix)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            paths, components = fast.fast_openapi(settings.path_prefix)
            schema["paths"] = {**paths, **schema["paths"]}
            for section, entries in components.items():
                schema.setdefault("components", {}).setdefault(section, {}).update(entries)
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
