"""An extender wired to the fake API server through the real kubernetes client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from scheduler_extender.api.app import create_app
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.k8s.client import KubeApi, load_api_client
from tests.fakes.fake_kube import FakeKube


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube(bookmark_interval_s=0.2) as fake:
        yield fake


@pytest.fixture
def kubeconfig(kube: FakeKube, tmp_path: Path) -> Path:
    return kube.kubeconfig(tmp_path / "kubeconfig")


def make_api(kubeconfig: Path) -> KubeApi:
    return KubeApi(load_api_client(kubeconfig))


async def eventually(check: Callable[[], Any], timeout_s: float = 8.0) -> Any:
    """Poll until ``check`` returns something truthy (watches are asynchronous)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


@asynccontextmanager
async def running_extender(
    kubeconfig: Path, **settings: Any
) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    settings.setdefault("identity", "replica-a")
    settings.setdefault("debug_endpoints", "on")  # the test client is not on loopback
    app = create_app(ExtenderSettings(kubeconfig=kubeconfig, **settings), kube=make_api(kubeconfig))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("10.0.0.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://extender") as client:
            yield app, client
