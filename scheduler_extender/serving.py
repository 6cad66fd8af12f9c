"""How the extender serves HTTP: uvicorn options and the raw ASGI helpers of the hot routes.

Standard library only; shared with the benchmarks' floor.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

TELEMETRY_PATH = "/v1/telemetry"
"""Where agents push (DESIGN.md §3), on the scheduler's port."""

_CONTENT_TYPE = (b"content-type", b"application/json")


def _http_protocol() -> Any:
    """The HTTP protocol: httptools with a cap on the request head, else h11 (which caps it)."""
    if importlib.util.find_spec("httptools") is None:
        return "h11"
    from scheduler_extender.httpproto import BoundedHttpTools

    return BoundedHttpTools


def uvicorn_options(log_level: str = "warning") -> dict[str, Any]:
    """How the extender runs under uvicorn (the benchmarks' floor too).

    uvloop and httptools when present, no access log: the scheduler waits on every call we
    answer, and an access log line costs as much as a small filter. Idle keep-alive
    connections stay open 75 s (uvicorn's default is 5 s; Go's client keeps them 90 s), so a
    quiet minute between scheduling bursts does not cost a reconnect.
    """
    return {
        "log_level": log_level,
        "access_log": False,
        "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        "http": _http_protocol(),
        "server_header": False,
        "date_header": False,
        "timeout_keep_alive": 75,
        # The client address is the peer's, never an X-Forwarded-For header: loopback-only
        # pushes (embedded mode) must not be reachable by naming 127.0.0.1 in a header.
        "proxy_headers": False,
    }


def json_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    """Response headers for a JSON body of known length.

    With a Content-Length, uvicorn writes the body as it is; without one it frames it in
    chunked encoding (one more copy of the body, and a slower read for the client).
    """
    return [_CONTENT_TYPE, (b"content-length", b"%d" % len(body))]


async def send_json(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer an ASGI request with a JSON body (and ``extra`` headers)."""
    headers = json_headers(body) + (extra or [])
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length, when it sent a valid one."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit():
            return int(value)
    return None


BODY_TIMEOUT_S = 30.0
"""The longest a request may take to send its body (a client that declares more than it sends
would otherwise hold the request open for ever)."""


async def read_body(receive: Receive, limit: int, declared: int | None) -> bytes | None:
    """The body, or None when it is over ``limit`` (refused before reading when declared).

    TimeoutError when it has not all arrived within ``BODY_TIMEOUT_S``.
    """
    if declared is not None and declared > limit:
        return None
    async with asyncio.timeout(BODY_TIMEOUT_S):
        return await _read_all(receive, limit)


async def _read_all(receive: Receive, limit: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The bearer token of a request, if any."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def client_host(scope: Scope) -> str | None:
    """The peer's address (never a forwarded header)."""
    client = scope.get("client")
    return client[0] if client else None


async def read_push(
    scope: Scope, receive: Receive, limit: int
) -> tuple[bytes | None, str | None, str | None]:
    """A telemetry push as the extender takes it: (body, peer address, bearer token).

    The body is None when it is over ``limit``.
    """
    body = await read_body(receive, limit, declared_length(scope))
    return body, client_host(scope), bearer(scope["headers"])


def internal_error(exc: Exception) -> bytes:
    """The JSON body of a 500 answer: the kind of error, never a traceback."""
    return b'{"error":"internal error (%s)"}' % type(exc).__name__.encode()
