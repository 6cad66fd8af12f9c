"""The telemetry relay: a second process that takes the agents' HTTP off the scheduler's process.

kube-scheduler waits on every verb; agents do not mind a few milliseconds. At 5,000 nodes
pushing every second, the HTTP work of the pushes alone (parsing requests, writing answers,
two thirds of what a push costs) took half a core from the process that answers the
scheduler. With ``--ingest-port``, the extender opens that port itself and hands it to this
process, which serves ``POST /v1/telemetry`` at a lower CPU priority and passes each push (the
peer's address, the bearer token, the body) over a Unix socket to the scheduler's process. That
process authenticates and stores it exactly as a push on its own port, and the answer comes
back the same way. Pushes that arrive in the same turn of the event loop travel in one frame,
and so do their answers.

Nothing is decided here, so nothing here can disagree with the extender. The listening socket
stays open in the extender while a relay is restarted, so agents see a slower answer, never
a refused connection. Imports the standard library, msgspec and uvicorn only (no web
framework, no numpy): the process stays small.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec

from scheduler_extender.serving import (
    TELEMETRY_PATH,
    Receive,
    Scope,
    Send,
    read_push,
    send_json,
    tune_gc,
    uvicorn_options,
)

log = logging.getLogger("scheduler_extender.relay")

_LENGTH = struct.Struct("!I")
MAX_FRAME = 256 << 20
"""No frame is longer (a turn's pushes are split into frames of about ``FLUSH_BYTES``)."""
FLUSH_BYTES = 4 << 20


class Push(msgspec.Struct, array_like=True, frozen=True):
    """One push as the agent sent it. ``body`` None: it was over the size cap."""

    id: int
    client: str | None
    token: str | None
    body: bytes | None


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


class ExtenderLink:
    """The relay's end of the socket to the extender: forwards pushes, hands back answers."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._waiting: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self._next_id = 0
        self._outbox: Outbox[Push] | None = None
        self._reading: asyncio.Task[None] | None = None
        self.on_close: Callable[[], None] = lambda: None
        """Called once the extender has gone (the relay then shuts down)."""

    @property
    def open(self) -> bool:
        """Whether pushes can reach the extender."""
        return self._outbox is not None

    async def connect(self) -> None:
        """Start talking to the extender over the inherited socket."""
        reader, writer = await asyncio.open_unix_connection(sock=self._sock)
        self._outbox = Outbox(writer)
        self._reading = asyncio.create_task(self._read_answers(reader))

    async def forward(
        self, body: bytes | None, client: str | None, token: str | None
    ) -> tuple[int, bytes]:
        """The extender's (status, body) for one push."""
        if self._outbox is None:
            return _GONE
        self._next_id += 1
        push_id = self._next_id
        answer: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._waiting[push_id] = answer
        self._outbox.put(Push(push_id, client, token, body), len(body or b""))
        try:
            return await answer
        finally:
            self._waiting.pop(push_id, None)  # already gone unless the push was cancelled

    async def _read_answers(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                for answer in decode_answers(await read_frame(reader)):
                    waiting = self._waiting.pop(answer.id, None)
                    if waiting is not None and not waiting.done():
                        waiting.set_result((answer.status, answer.body))
        except (asyncio.IncompleteReadError, ConnectionError):
            log.warning("telemetry relay: the extender closed the link")
        except (FrameError, msgspec.DecodeError) as exc:
            log.error("telemetry relay: bad frame from the extender: %s", exc)
        finally:
            self._outbox = None
            for waiting in self._waiting.values():
                if not waiting.done():
                    waiting.set_result(_GONE)
            self._waiting.clear()
            self.on_close()


class RelayApp:
    """The relay's ASGI app: ``POST /v1/telemetry`` forwarded, ``GET /healthz``, nothing else."""

    def __init__(self, link: ExtenderLink, max_bytes: int) -> None:
        self.link = link
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection or lifespan."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == TELEMETRY_PATH and method == "POST":
            status, out = await self.link.forward(*await read_push(scope, receive, self.max_bytes))
        elif path == "/healthz" and method == "GET":
            status, out = (200, b'{"status":"ok"}') if self.link.open else _GONE
        elif path in (TELEMETRY_PATH, "/healthz"):
            status, out = 405, b'{"error":"method not allowed"}'
        else:
            status, out = 404, b'{"error":"this port takes telemetry pushes only"}'
        await send_json(send, status, out)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.link.connect()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


def command(
    listen_fd: int, link_fd: int, max_bytes: int, log_level: str, nice: int,
    certfile: str | None = None, keyfile: str | None = None,
) -> list[str]:  # fmt: skip
    """The command line that starts a relay on these inherited sockets."""
    cmd = [
        sys.executable, "-m", "scheduler_extender.relay", "--listen-fd", str(listen_fd),
        "--link-fd", str(link_fd), "--max-bytes", str(max_bytes), "--log-level", log_level,
        "--nice", str(nice),
    ]  # fmt: skip
    if certfile is not None and keyfile is not None:
        cmd += ["--ssl-certfile", certfile, "--ssl-keyfile", keyfile]
    return cmd


def main(argv: list[str] | None = None) -> int:
    """Serve pushes on the inherited listening socket until the extender goes away."""
    p = argparse.ArgumentParser(prog="edgegpu-telemetry-relay")
    p.add_argument("--listen-fd", type=int, required=True)
    p.add_argument("--link-fd", type=int, required=True)
    p.add_argument("--max-bytes", type=int, required=True)
    p.add_argument("--log-level", default="warning")
    p.add_argument("--nice", type=int, default=0)
    p.add_argument("--ssl-certfile")
    p.add_argument("--ssl-keyfile")
    args = p.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    import uvicorn

    link = ExtenderLink(socket.socket(fileno=args.link_fd))
    tls: dict[str, Any] = {}
    if args.ssl_certfile and args.ssl_keyfile:
        tls = {"ssl_certfile": args.ssl_certfile, "ssl_keyfile": args.ssl_keyfile}
    config = uvicorn.Config(
        RelayApp(link, args.max_bytes), lifespan="on", **uvicorn_options(args.log_level), **tls
    )
    server = uvicorn.Server(config)

    def stop() -> None:
        server.should_exit = True

    link.on_close = stop
    tune_gc()
    server.run(sockets=[socket.socket(fileno=args.listen_fd)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
