"""Fixtures: a fake clock, a fresh app per test, and an HTTP client on the ASGI app."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from scheduler_extender.api.app import create_app
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.telemetry.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def app(clock: FakeClock) -> FastAPI:
    return create_app(clock=clock)


def loopback_client(app: FastAPI) -> httpx.AsyncClient:
    """An HTTP client on the ASGI app, seen from loopback."""
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    return httpx.AsyncClient(transport=transport, base_url="http://extender")


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with loopback_client(app) as c:
        yield c


@pytest.fixture
async def all_client(clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    """An extender whose filter answers every node that fits (``--filter-answer all``)."""
    async with loopback_client(create_app(ExtenderSettings(filter_answer="all"), clock=clock)) as c:
        yield c
