"""The telemetry relay: a second process that takes the agents' HTTP off the scheduler's process.

kube-scheduler waits on every verb; agents do not mind a few milliseconds. At 5,000 nodes
pushing every second, the HTTP work of the pushes alone (parsing requests, writing answers,
two thirds of what a push costs) took half a core from the process that answers the
scheduler. With ``--ingest-port``, the extender opens that port itself and hands it to this
process, which serves ``POST /v1/telemetry`` at a lower CPU priority and passes each push (the
peer's address, the bearer token, the body) over a Unix socket to the scheduler's process. It
also decodes the body with the extender's own structs (``scheduler_extender.report``) and sends
the report's digest along, so that the scheduler's process stores the push without decoding it
(decoding was a third of what storing a push cost there); a body that is not a valid report
goes without, and the extender decodes it to say what is wrong. The scheduler's process
authenticates and stores the push as one on its own port, and the answer comes back the same
way. Pushes that arrive in the same turn of the event loop travel in one frame, and so do
their answers.

Nothing is decided here, so nothing here can disagree with the extender. The listening socket
stays open in the extender while a relay is restarted, so agents see a slower answer, never
a refused connection. Imports the standard library, msgspec, httptools, uvloop and
``scheduler_extender.report`` only (no web framework, no ASGI server, no numpy): the process
stays small, and a push costs it about half the CPU it did under uvicorn.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import logging
import os
import signal
import socket
import ssl
import struct
import sys
from collections import deque
from collections.abc import Callable, Iterable
from http import HTTPStatus
from ssl import SSLContext
from typing import Generic, TypeVar, cast

import httptools
import msgspec

from scheduler_extender.report import Digest, digest_body
from scheduler_extender.serving import TELEMETRY_PATH, bearer, cpu_list, tune_gc

log = logging.getLogger("scheduler_extender.relay")

_LENGTH = struct.Struct("!I")
MAX_FRAME = 256 << 20
"""No frame is longer (a turn's pushes are split into frames of about ``FLUSH_BYTES``)."""
FLUSH_BYTES = 4 << 20

STOP_GRACE_S = 4.0
"""At a stop, how long answers still owed are waited for (the extender kills us after 5 s)."""


class Push(msgspec.Struct, array_like=True, frozen=True):
    """One push as the agent sent it. ``body`` None: it was over the size cap.

    ``digest``: the body's report as the extender stores it, None when the body is not a valid
    report (the extender then decodes it itself, to say what is wrong).
    """

    id: int
    client: str | None
    token: str | None
    body: bytes | None
    digest: Digest | None = None


class Answer(msgspec.Struct, array_like=True, frozen=True):
    """The extender's answer to one push: HTTP status and JSON body."""

    id: int
    status: int
    body: bytes


_encoder = msgspec.msgpack.Encoder()
decode_pushes = msgspec.msgpack.Decoder(list[Push]).decode
decode_answers = msgspec.msgpack.Decoder(list[Answer]).decode

T = TypeVar("T", Push, Answer)


class FrameError(Exception):
    """The other process sent something that is not a frame of ours."""


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """The next frame's payload; IncompleteReadError when the other side has gone."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > MAX_FRAME:
        raise FrameError(f"frame of {length} bytes is over the limit of {MAX_FRAME}")
    return await reader.readexactly(length)


class Outbox(Generic[T]):
    """Collects items and writes them as one frame per turn of the event loop."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._items: list[T] = []
        self._bytes = 0
        self._scheduled = False

    def put(self, item: T, size: int) -> None:
        """Send ``item`` (about ``size`` bytes) with the others of this turn."""
        self._items.append(item)
        self._bytes += size
        if self._bytes >= FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write what is waiting now."""
        self._scheduled = False
        if not self._items or self._writer.is_closing():
            self._items.clear()
            self._bytes = 0
            return
        payload = _encoder.encode(self._items)
        self._items = []
        self._bytes = 0
        self._writer.write(_LENGTH.pack(len(payload)) + payload)


_GONE = (503, b'{"error":"the extender is restarting; push again"}')


Reply = Callable[[int, bytes], None]
"""Called once with the extender's (status, body) for a push."""


class ExtenderLink:
    """The relay's end of the socket to the extender: forwards pushes, hands back answers."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._waiting: dict[int, Reply] = {}
        self._next_id = 0
        self._outbox: Outbox[Push] | None = None
        self._reading: asyncio.Task[None] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.on_close: Callable[[], None] = lambda: None
        """Called once the extender has gone (the relay then shuts down)."""

    @property
    def open(self) -> bool:
        """Whether pushes can reach the extender."""
        return self._outbox is not None

    async def connect(self) -> None:
        """Start talking to the extender over the inherited socket."""
        reader, self._writer = await asyncio.open_unix_connection(sock=self._sock)
        self._outbox = Outbox(self._writer)
        self._reading = asyncio.create_task(self._read_answers(reader))

    async def close(self) -> None:
        """Close our end (pushes still owed an answer get a 503)."""
        if self._writer is not None:
            self._writer.close()
        if self._reading is not None:
            await self._reading

    def submit(
        self, body: bytes | None, client: str | None, token: str | None, reply: Reply
    ) -> None:
        """Pass one push on; ``reply`` gets the extender's answer (503 if it has gone)."""
        if self._outbox is None:
            reply(*_GONE)
            return
        self._next_id += 1
        self._waiting[self._next_id] = reply
        made = digest_body(body) if body is not None else None
        self._outbox.put(Push(self._next_id, client, token, body, made), 2 * len(body or b""))

    async def _read_answers(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                for answer in decode_answers(await read_frame(reader)):
                    reply = self._waiting.pop(answer.id, None)
                    if reply is not None:
                        reply(answer.status, answer.body)
        except (asyncio.IncompleteReadError, ConnectionError):
            log.warning("telemetry relay: the extender closed the link")
        except (FrameError, msgspec.DecodeError) as exc:
            log.error("telemetry relay: bad frame from the extender: %s", exc)
        finally:
            self._outbox = None
            waiting, self._waiting = self._waiting, {}
            for reply in waiting.values():
                reply(*_GONE)
            self.on_close()


# -- HTTP ---------------------------------------------------------------------------------------
# The relay speaks just enough HTTP/1.1 for agents (and curl): keep-alive, pipelining,
# Content-Length or chunked bodies, Expect: 100-continue, TLS. It is written on httptools (the
# parser uvicorn uses) as protocol callbacks: no task, no ASGI messages per push, which took
# about half of the relay's CPU under uvicorn.

IDLE_S = 75.0
"""An idle connection is closed after this long (Go's client keeps them 90 s)."""

MAX_HEAD = 64 * 1024
"""Request line and headers larger than this are refused (431) and the connection closed."""

PIPELINE = 16
"""Requests a connection may have waiting for answers before we stop reading from it."""

_TELEMETRY = TELEMETRY_PATH.encode()
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@functools.lru_cache(maxsize=64)
def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


def response(status: int, body: bytes, close: bool = False) -> bytes:
    """A JSON response, framed by its length."""
    head = b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
    if close:
        head += b"connection: close\r\n"
    return _status_line(status) + head + b"\r\n" + body


class _Slot:
    """One answer in a connection's pipeline, in request order; ``data`` None until known."""

    __slots__ = ("close", "data")

    def __init__(self, data: bytes | None = None, close: bool = False) -> None:
        self.data = data
        self.close = close


class _HeadTooLarge(Exception):
    """Raised in a parser callback to stop parsing a request whose head is over ``MAX_HEAD``."""


class PushConnection(asyncio.Protocol):
    """One agent connection: parses requests, passes pushes on, writes answers in order."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.client: str | None = None
        self.last = 0.0  # loop time of the last bytes read
        self._slots: deque[_Slot] = deque()
        self._reading = True
        self._write_paused = False
        self._broken = False  # a bad request was answered: read no more, close once written
        self._begin()

    def _begin(self) -> None:
        self._url = b""
        self._head = 0
        self._token: str | None = None
        self._declared: int | None = None
        self._expect = False
        self._kind = ""
        self._body: list[bytes] = []
        self._size = 0
        self._over = False
        self._answered = False

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.client = peer[0] if isinstance(peer, tuple) and peer else None
        self.last = self.relay.now()
        self.relay.connections.add(self)
        self._update_reading()

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self.relay.connections.discard(self)
        self._slots.clear()
        self.relay.gone()

    def pause_writing(self) -> None:  # noqa: D102
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:  # noqa: D102
        self._write_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:  # noqa: D102
        self.last = self.relay.now()
        if self._broken:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # refused when its headers were complete
        except httptools.HttpParserError:
            if self._head > MAX_HEAD:
                self._refuse(431, b'{"error":"request headers over %d bytes"}' % MAX_HEAD)
            else:
                self._refuse(400, b'{"error":"malformed HTTP request"}')

    # -- httptools callbacks
    def on_message_begin(self) -> None:  # noqa: D102
        self._begin()

    def on_url(self, url: bytes) -> None:  # noqa: D102
        self._url += url
        self._grow_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:  # noqa: D102
        self._grow_head(len(name) + len(value))
        name = name.lower()
        if name == b"authorization":
            self._token = bearer([(name, value)])
        elif name == b"content-length" and value.isdigit():
            self._declared = int(value)
        elif name == b"expect" and value.lower() == b"100-continue":
            self._expect = True

    def _grow_head(self, size: int) -> None:
        self._head += size
        if self._head > MAX_HEAD:
            raise _HeadTooLarge

    def on_headers_complete(self) -> None:  # noqa: D102
        if self.parser.should_upgrade():
            self._refuse(400, b'{"error":"protocol upgrades are not served here"}')
            return
        path = self._url.partition(b"?")[0]
        method = self.parser.get_method()
        if path == _TELEMETRY:
            self._kind = "push" if method == b"POST" else "405"
        elif path == b"/healthz":
            self._kind = "health" if method == b"GET" else "405"
        else:
            self._kind = "404"
        max_bytes = self.relay.max_bytes
        if self._kind == "push" and self._declared is not None and self._declared > max_bytes:
            self._over = True
            if self._expect:
                # Do not ask for a body we would not take: answer now, and close after.
                self._answered = True
                self._pass_on(None, close=True)
                return
        if self._expect and self._kind == "push":
            self._slots.append(_Slot(_CONTINUE))
            self._flush()

    def on_body(self, body: bytes) -> None:  # noqa: D102
        if self._kind != "push" or self._over:
            return
        self._size += len(body)
        if self._size > self.relay.max_bytes:
            self._over = True
            self._body.clear()
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:  # noqa: D102
        if self._answered or self._broken:
            return
        close = not self.parser.should_keep_alive()
        if self._kind == "push":
            self._pass_on(None if self._over else b"".join(self._body), close)
            return
        if self._kind == "health":
            status, out = (200, b'{"status":"ok"}') if self.relay.link.open else _GONE
        elif self._kind == "405":
            status, out = 405, b'{"error":"method not allowed"}'
        else:
            status, out = 404, b'{"error":"this port takes telemetry pushes only"}'
        self._slots.append(_Slot(response(status, out, close), close))
        self._flush()

    # -- answers
    def _pass_on(self, body: bytes | None, close: bool) -> None:
        slot = _Slot(None, close)
        self._slots.append(slot)
        self._update_reading()

        def reply(status: int, out: bytes) -> None:
            slot.data = response(status, out, slot.close)
            self._flush()

        self.relay.link.submit(body, self.client, self._token, reply)

    def _refuse(self, status: int, out: bytes) -> None:
        self._broken = True
        self._slots.append(_Slot(response(status, out, True), True))
        self._update_reading()
        self._flush()

    def _flush(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        slots = self._slots
        while slots and slots[0].data is not None:
            slot = slots.popleft()
            transport.write(slot.data)  # type: ignore[arg-type]
            if slot.close:
                slots.clear()
                transport.close()
                return
        self._update_reading()
        if self.relay.stopping and not slots:
            transport.close()

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        want = not (
            self._broken
            or self._write_paused
            or self.relay.stopping
            or len(self._slots) >= PIPELINE
        )
        if want != self._reading:
            self._reading = want
            (transport.resume_reading if want else transport.pause_reading)()

    @property
    def idle(self) -> bool:
        """Whether no answer is owed on this connection."""
        return not self._slots

    def close(self) -> None:
        """Close the connection (what was written still goes out)."""
        if self.transport is not None:
            self.transport.close()


class Relay:
    """The relay's HTTP server: connections, the idle sweep and a graceful stop."""

    def __init__(self, link: ExtenderLink, max_bytes: int, idle_s: float = IDLE_S) -> None:
        self.link = link
        self.max_bytes = max_bytes
        self.idle_s = idle_s
        self.connections: set[PushConnection] = set()
        self.stopping = False
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._all_gone: asyncio.Future[None] | None = None

    def now(self) -> float:
        """The event loop's clock."""
        assert self._loop is not None
        return self._loop.time()

    async def start(self, sock: socket.socket, ssl: SSLContext | None = None) -> None:
        """Serve on a listening socket (inherited from the extender)."""
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(
            lambda: PushConnection(self), sock=sock, ssl=ssl, backlog=4096
        )
        self._sweeper = self._loop.call_later(self.idle_s / 4, self._sweep)

    def _sweep(self) -> None:
        now = self.now()
        for conn in list(self.connections):
            if conn.idle and now - conn.last > self.idle_s:
                conn.close()
        assert self._loop is not None
        self._sweeper = self._loop.call_later(self.idle_s / 4, self._sweep)

    def gone(self) -> None:
        """A connection has closed."""
        if self._all_gone is not None and not self.connections and not self._all_gone.done():
            self._all_gone.set_result(None)

    async def stop(self, grace_s: float) -> None:
        """Take no new requests, write the answers still owed (within ``grace_s``), close."""
        self.stopping = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        self._all_gone = asyncio.get_running_loop().create_future()
        for conn in list(self.connections):
            conn._update_reading()
            if conn.idle:
                conn.close()
        self.gone()
        try:
            await asyncio.wait_for(asyncio.shield(self._all_gone), grace_s)
        except TimeoutError:
            log.warning("telemetry relay: %d connections still owed answers", len(self.connections))
        for conn in list(self.connections):
            conn.close()


def command(
    listen_fd: int, link_fd: int, max_bytes: int, log_level: str, nice: int,
    certfile: str | None = None, keyfile: str | None = None, cpus: Iterable[int] | None = None,
) -> list[str]:  # fmt: skip
    """The command line that starts a relay on these inherited sockets."""
    cmd = [
        sys.executable, "-m", "scheduler_extender.relay", "--listen-fd", str(listen_fd),
        "--link-fd", str(link_fd), "--max-bytes", str(max_bytes), "--log-level", log_level,
        "--nice", str(nice),
    ]  # fmt: skip
    if certfile is not None and keyfile is not None:
        cmd += ["--ssl-certfile", certfile, "--ssl-keyfile", keyfile]
    if cpus is not None:
        cmd += ["--cpus", cpu_list(cpus)]
    return cmd


def _cpus(text: str) -> frozenset[int]:
    """``--cpus``: CPU numbers, comma-separated."""
    try:
        cpus = frozenset(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of CPU numbers: {text!r}") from None
    if not cpus or min(cpus) < 0:
        raise argparse.ArgumentTypeError(f"not a list of CPU numbers: {text!r}")
    return cpus


def main(argv: list[str] | None = None) -> int:
    """Serve pushes on the inherited listening socket until the extender goes away."""
    p = argparse.ArgumentParser(prog="edgegpu-telemetry-relay")
    p.add_argument("--listen-fd", type=int, required=True)
    p.add_argument("--link-fd", type=int, required=True)
    p.add_argument("--max-bytes", type=int, required=True)
    p.add_argument("--log-level", default="warning")
    p.add_argument("--nice", type=int, default=0)
    p.add_argument("--cpus", type=_cpus, help="run on these CPUs (the extender's --split-cpus)")
    p.add_argument("--ssl-certfile")
    p.add_argument("--ssl-keyfile")
    args = p.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.cpus is not None:
        try:
            os.sched_setaffinity(0, args.cpus)
        except OSError as exc:  # a CPU gone offline since the extender looked: run anywhere
            log.warning(
                "telemetry relay: cannot run on CPU %s (%s); staying on CPU %s",
                cpu_list(args.cpus), exc.strerror or exc, cpu_list(os.sched_getaffinity(0)),
            )  # fmt: skip
    tls: SSLContext | None = None
    if args.ssl_certfile and args.ssl_keyfile:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    link = ExtenderLink(socket.socket(fileno=args.link_fd))
    listener = socket.socket(fileno=args.listen_fd)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def finish() -> None:
            if not done.done():
                done.set_result(None)

        link.on_close = finish
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, finish)
        await link.connect()
        relay = Relay(link, args.max_bytes)
        await relay.start(listener, tls)
        await done
        await relay.stop(STOP_GRACE_S)

    tune_gc()
    if importlib.util.find_spec("uvloop"):
        import uvloop

        uvloop.run(serve())
    else:
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
