"""The pusher's replicas: every address a name resolves to, with the lookup bounded in time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import httpx
import pytest

from node_agent.uplink.pusher import Pusher


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Resolver:
    """Names to addresses; a name in ``hung`` answers only once it is released."""

    def __init__(self, names: dict[str, list[str]], hung: set[str]) -> None:
        self.names, self.hung = names, hung
        self.asked: list[str] = []
        self.released = asyncio.Event()

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append(host)
        if host in self.hung:
            await self.released.wait()
        return self.names[host]


def answering(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"accepted": True})


async def test_a_lookup_that_never_answers_fails_that_url_each_round_said_once_and_asked_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    resolver = Resolver({"hung.svc": ["127.0.0.3"], "fine.svc": ["127.0.0.2"]}, {"hung.svc"})
    async with httpx.AsyncClient(transport=httpx.MockTransport(answering)) as client:
        pusher = Pusher(["http://hung.svc:8888", "http://fine.svc:8888"], client, clock=Clock(),
                        resolve_all=True, resolver=resolver, resolve_timeout_s=0.05)  # fmt: skip
        for _ in range(3):
            out = await pusher.push(b"{}")
            assert out.results == {"http://hung.svc:8888": "failed",
                                   "http://fine.svc:8888@127.0.0.2": "ok"}  # fmt: skip
        said = [r for r in caplog.records if "hung.svc" in r.getMessage()]
        assert len(said) == 1 and said[0].levelname == "WARNING"
        assert resolver.asked.count("hung.svc") == 1  # each round waits on the same lookup
        resolver.released.set()
        out = await pusher.push(b"{}")
    assert out.results == {"http://hung.svc:8888@127.0.0.3": "ok",
                           "http://fine.svc:8888@127.0.0.2": "ok"}  # fmt: skip
    assert "hung.svc resolves again" in caplog.text


async def test_a_name_that_stops_answering_keeps_its_last_addresses() -> None:
    resolver = Resolver({"extender.svc": ["127.0.0.2", "127.0.0.3"]}, set())
    async with httpx.AsyncClient(transport=httpx.MockTransport(answering)) as client:
        pusher = Pusher(["http://extender.svc:8888"], client, clock=Clock(), resolve_all=True,
                        resolver=resolver, resolve_timeout_s=0.05)  # fmt: skip
        first = await pusher.push(b"{}")
        resolver.hung.add("extender.svc")
        then = await pusher.push(b"{}")
        resolver.released.set()
        again = await pusher.push(b"{}")
    assert first.results == then.results == again.results == {
        "http://extender.svc:8888@127.0.0.2": "ok", "http://extender.svc:8888@127.0.0.3": "ok"
    }  # fmt: skip


async def test_a_name_that_does_not_resolve_fails_its_url_rather_than_leave_it_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def nowhere(host: str, port: int) -> Sequence[str]:
        raise OSError(-2, "Name or service not known")

    caplog.set_level(logging.WARNING)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answering)) as client:
        pusher = Pusher(["http://gone.svc:8888"], client, clock=Clock(), resolve_all=True,
                        resolver=nowhere)  # fmt: skip
        for _ in range(2):
            assert (await pusher.push(b"{}")).results == {"http://gone.svc:8888": "failed"}
        assert await pusher.assignments("n1")() is None
    assert sum("gone.svc" in r.getMessage() for r in caplog.records) == 1
