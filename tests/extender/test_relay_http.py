"""The relay's HTTP side, in-process: real sockets on 127.0.0.1, the test plays the extender.

The relay parses agents' requests itself (httptools, protocol callbacks), so what an HTTP
server owes its clients is checked here byte by byte: answers in request order on a
pipelined connection, 100-continue, chunked bodies, size caps, bad requests, idle and
graceful closes.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest

from scheduler_extender import relay as wire
from scheduler_extender.api.relay import listen


@dataclass
class Extender:
    """The extender's end of the link, played by the test."""

    reader: asyncio.StreamReader
    outbox: wire.Outbox[wire.Answer]
    writer: asyncio.StreamWriter

    async def pushes(self, count: int) -> list[wire.Push]:
        got: list[wire.Push] = []
        while len(got) < count:
            got += wire.decode_pushes(await asyncio.wait_for(wire.read_frame(self.reader), 10))
        return got

    def answer(self, push: wire.Push, status: int = 200, body: bytes | None = None) -> None:
        out = body if body is not None else b'{"echo":%d}' % len(push.body or b"")
        self.outbox.put(wire.Answer(push.id, status, out), len(out))


@dataclass
class Rig:
    relay: wire.Relay
    port: int
    ext: Extender
    opened: list[asyncio.StreamWriter]

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A client connection to the relay (closed with the rig)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.opened.append(writer)
        return reader, writer


@asynccontextmanager
async def serving(max_bytes: int = 1024, idle_s: float = 75.0) -> AsyncIterator[Rig]:
    ours, theirs = socket.socketpair()
    link = wire.ExtenderLink(theirs)
    await link.connect()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    relay = wire.Relay(link, max_bytes, idle_s)
    listener = listen("127.0.0.1", 0)
    await relay.start(listener)
    rig = Rig(relay, listener.getsockname()[1], Extender(reader, wire.Outbox(writer), writer), [])
    try:
        yield rig
    finally:
        await relay.stop(1.0)
        for client in rig.opened:
            client.close()
        writer.close()
        await link.close()
        listener.close()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


def request(body: bytes, path: str = "/v1/telemetry", extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


async def test_pipelined_requests_are_answered_in_order_whatever_order_the_extender_answers():
    async with serving() as rig:
        ext = rig.ext
        reader, writer = await rig.connect()
        writer.write(request(b"a") + request(b"bbb") + request(b"cc", path="/elsewhere"))
        first, second = await ext.pushes(2)
        assert (first.body, second.body) == (b"a", b"bbb")
        ext.answer(second)  # the extender answers the second first
        await asyncio.sleep(0.05)
        ext.answer(first)
        answers = [await read_response(reader) for _ in range(3)]
        assert [(s, b) for s, _, b in answers] == [
            (200, b'{"echo":1}'),
            (200, b'{"echo":3}'),
            (404, b'{"error":"this port takes telemetry pushes only"}'),
        ]
        assert answers[0][1]["content-type"] == "application/json"
        writer.close()


async def test_the_peer_address_and_bearer_token_go_with_the_push():
    async with serving() as rig:
        port, ext = rig.port, rig.ext
        async with httpx.AsyncClient() as c:
            sent = asyncio.create_task(
                c.post(f"http://127.0.0.1:{port}/v1/telemetry?x=1", content=b"{}",
                       headers={"Authorization": "bearer tok-1"})
            )  # fmt: skip
            (push,) = await ext.pushes(1)
            assert (push.client, push.token, push.body) == ("127.0.0.1", "tok-1", b"{}")
            ext.answer(push, 401, b'{"error":"no"}')
            answer = await sent
        assert answer.status_code == 401
        assert answer.json() == {"error": "no"}


async def test_expect_100_continue_gets_its_interim_answer_and_chunked_bodies_arrive_whole():
    async with serving() as rig:
        ext = rig.ext
        reader, writer = await rig.connect()
        writer.write(
            b"POST /v1/telemetry HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n"
            b"expect: 100-continue\r\n\r\n"
        )
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == (
            b"HTTP/1.1 100 Continue\r\n\r\n"
        )
        writer.write(b"body")
        (push,) = await ext.pushes(1)
        ext.answer(push)
        assert (await read_response(reader))[2] == b'{"echo":4}'
        writer.write(
            b"POST /v1/telemetry HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
        (push,) = await ext.pushes(1)
        assert push.body == b"abcde"
        ext.answer(push)
        assert (await read_response(reader))[0] == 200
        writer.close()


async def test_bodies_over_the_cap_reach_the_extender_as_none_and_are_not_asked_for():
    async with serving(max_bytes=8) as rig:
        ext = rig.ext
        reader, writer = await rig.connect()
        # Sent whole: read and dropped, the connection stays usable.
        writer.write(request(b"x" * 9) + request(b"ok"))
        big, small = await ext.pushes(2)
        assert (big.body, small.body) == (None, b"ok")
        ext.answer(big, 413, b'{"error":"over"}')
        ext.answer(small)
        assert [(await read_response(reader))[0] for _ in range(2)] == [413, 200]
        # Declared too large with Expect: answered at once, no 100, and the connection closes.
        writer.write(
            b"POST /v1/telemetry HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n"
            b"expect: 100-continue\r\n\r\n"
        )
        (refused,) = await ext.pushes(1)
        assert refused.body is None
        ext.answer(refused, 413, b'{"error":"over"}')
        status, headers, _ = await read_response(reader)
        assert (status, headers["connection"]) == (413, "close")
        assert await asyncio.wait_for(reader.read(), 10) == b""


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n", 400),
        (b"POST /v1/telemetry HTTP/1.1\r\nx-big: " + b"a" * (wire.MAX_HEAD + 1) + b"\r\n\r\n", 431),
    ],
)
async def test_bad_requests_get_a_clear_answer_and_a_close(raw: bytes, status: int):
    async with serving() as rig:
        reader, writer = await rig.connect()
        writer.write(raw)
        got, headers, body = await read_response(reader)
        assert (got, headers["connection"]) == (status, "close")
        assert b"error" in body
        assert await asyncio.wait_for(reader.read(), 10) == b""


async def test_health_methods_and_http_1_0_close():
    async with serving() as rig:
        reader, writer = await rig.connect()
        writer.write(b"GET /v1/telemetry HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await read_response(reader))[0] == 405
        writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
        status, headers, body = await read_response(reader)
        assert (status, body, headers["connection"]) == (200, b'{"status":"ok"}', "close")
        assert await asyncio.wait_for(reader.read(), 10) == b""


async def test_idle_connections_are_closed_and_busy_ones_kept():
    async with serving(idle_s=0.2) as rig:
        relay, ext = rig.relay, rig.ext
        idle_reader, _ = await rig.connect()
        busy_reader, busy = await rig.connect()
        busy.write(request(b"{}"))
        (push,) = await ext.pushes(1)
        assert await asyncio.wait_for(idle_reader.read(), 10) == b""  # closed by the sweep
        await asyncio.sleep(0.3)
        ext.answer(push)  # owed an answer: it was kept
        assert (await read_response(busy_reader))[0] == 200
        assert len(relay.connections) == 1


async def test_a_stop_writes_the_answers_owed_then_closes():
    async with serving() as rig:
        relay, ext = rig.relay, rig.ext
        reader, writer = await rig.connect()
        writer.write(request(b"{}"))
        (push,) = await ext.pushes(1)
        stopping = asyncio.create_task(relay.stop(5.0))
        await asyncio.sleep(0.05)
        assert not stopping.done()
        ext.answer(push)
        assert (await read_response(reader))[0] == 200
        await asyncio.wait_for(stopping, 10)
        assert await asyncio.wait_for(reader.read(), 10) == b""


async def test_when_the_extender_goes_pushes_owed_get_503():
    async with serving() as rig:
        ext = rig.ext
        reader, writer = await rig.connect()
        writer.write(request(b"{}"))
        await ext.pushes(1)
        ext.writer.close()
        status, _, body = await read_response(reader)
        assert status == 503
        assert b"restarting" in body


HEAD = (
    b'{"schema":"edgegpu.io/telemetry/v1","node":"x","agent":{"version":"","backend":"b",'
    b'"boot_id":"b","seq":%s},"sampled_at":"2026-01-01T00:00:00Z","interval_s":1,"gpus":[]'
)


@pytest.mark.parametrize(
    "hostile",
    [
        pytest.param(HEAD % b"18446744073709551616" + b"}", id="seq 2^64"),
        pytest.param(HEAD % b"1" + b',"x":' + b"[" * 5000 + b"]" * 5000 + b"}", id="nested 5000"),
    ],
)
async def test_a_hostile_push_is_passed_on_without_a_digest_and_the_next_push_goes_through(
    hostile: bytes,
):
    async with serving(max_bytes=1 << 16) as rig:
        ext = rig.ext
        reader, writer = await rig.connect()
        writer.write(request(hostile))
        (push,) = await ext.pushes(1)
        assert push.digest is None and push.body == hostile  # the extender says what is wrong
        ext.answer(push, 422, b'{"error":"invalid"}')
        assert (await read_response(reader))[0] == 422
        other_reader, other = await rig.connect()
        other.write(request(HEAD % b"2" + b"}"))
        (genuine,) = await ext.pushes(1)
        assert genuine.digest is not None
        ext.answer(genuine)
        assert (await read_response(other_reader))[0] == 200
