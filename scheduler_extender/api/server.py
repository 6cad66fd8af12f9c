"""How the extender serves HTTP: uvicorn options and the raw ASGI helpers of the hot routes.

Standard library only; shared with the benchmarks' floor. The TLS context is ``tls``'s, and
reading request bodies ``bodies``'s.
"""

from __future__ import annotations

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


def _http_protocol(head_timeout_s: float | None) -> Any:
    """The HTTP protocol: httptools with a cap and a deadline on the request head.

    Without httptools, h11, which caps the head but gives it no deadline.
    """
    if importlib.util.find_spec("httptools") is None:
        return "h11"
    from scheduler_extender.api.protocol import BoundedHttpTools

    if head_timeout_s is None:
        return BoundedHttpTools
    return BoundedHttpTools.with_head_timeout(head_timeout_s)


def uvicorn_options(
    log_level: str = "warning", head_timeout_s: float | None = None
) -> dict[str, Any]:
    """How the extender runs under uvicorn (the benchmarks' floor too).

    uvloop and httptools when present, no access log: the scheduler waits on every call we
    answer, and an access log line costs as much as a small filter. Idle keep-alive
    connections stay open 75 s (uvicorn's default is 5 s; Go's client keeps them 90 s), so a
    quiet minute between scheduling bursts does not cost a reconnect. A request's head must
    arrive within ``head_timeout_s`` (None: ``protocol.HEAD_TIMEOUT_S``) of the connection
    opening, or of its first byte on a kept-alive connection.
    """
    return {
        "log_level": log_level,
        # uvicorn's records go through the process's own handler (one format for every line).
        "log_config": None,
        "access_log": False,
        "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        "http": _http_protocol(head_timeout_s),
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


def is_json(scope: Scope) -> bool:
    """Whether the request says its body is JSON: one Content-Type, ``application/json``.

    Parameters (``; charset=utf-8``) are allowed. A browser may send a cross-site POST without
    asking first only as ``text/plain``, a form type, or with no Content-Type at all; all of
    those are refused, so a web page cannot reach the verbs or the push through a visitor's
    browser. kube-scheduler's extender client and the agent both send ``application/json``.
    """
    types: list[bytes] = [value for name, value in scope["headers"] if name == b"content-type"]
    return len(types) == 1 and types[0].partition(b";")[0].strip().lower() == b"application/json"


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


def internal_error(exc: Exception) -> bytes:
    """The JSON body of a 500 answer: the kind of error, never a traceback."""
    return b'{"error":"internal error (%s)"}' % type(exc).__name__.encode()


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; the limit now.

    Every connection holds a file until it is done (a TLS handshake has a minute): containerd
    gives containers a soft limit of 1,024, which a few idle peers could use up and keep the
    scheduler out.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft
