"""How the extender serves HTTP: uvicorn options, TLS, and the raw ASGI helpers of the hot routes.

The TLS context follows its certificate files as they change. Standard library only; shared
with the benchmarks' floor.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import hashlib
import importlib.util
import io
import logging
import ssl
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

TELEMETRY_PATH = "/v1/telemetry"
"""Where agents push (DESIGN.md §3), on the scheduler's port."""

_CONTENT_TYPE = (b"content-type", b"application/json")

log = logging.getLogger("scheduler_extender")


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


TLS_RELOAD_INTERVAL_S = 60.0
"""How often the certificate, key and client CA files are read for a change (kubelet brings a
changed Secret into a Pod within a minute or two, and cert-manager renews long before expiry)."""


def certificate_not_after(path: Path) -> float | None:
    """When the first certificate of a PEM file expires, in Unix seconds; None if unknown.

    The standard library decodes a certificate file only with a private helper of ``_ssl``
    (the one ``ssl``'s own tests use); where it is missing or fails, None.
    """
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return None
    try:
        return float(ssl.cert_time_to_seconds(decode(str(path))["notAfter"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ServingTls:
    """The HTTPS server's TLS context, rebuilt from its files when they change.

    uvicorn loads the certificate, key and client CA once. The context it is given here
    (``context``) hands every new handshake the context last built from the files, through its
    SNI callback (called for each handshake, with or without a server name), so a renewed
    certificate or CA is served without a restart; connections already open keep theirs. A new
    context is built whole before it is used: files that do not load (a key that is not the
    certificate's, a half-written file) leave the one in use as it was, and a CA taken out of
    the file is trusted no more (contexts are replaced, never added to).

    ``reload_if_changed`` compares the files' contents (kubelet updates a mounted Secret by
    swapping a symlink, which leaves the paths and may leave their times as they were);
    ``start`` calls it every ``interval_s`` in a thread. ``on_expiry`` is told the serving
    certificate's notAfter (Unix seconds) at start and after each reload.
    """

    def __init__(
        self,
        cert_file: Path,
        key_file: Path,
        client_ca_file: Path | None = None,
        *,
        on_expiry: Callable[[float], None] | None = None,
        interval_s: float = TLS_RELOAD_INTERVAL_S,
    ) -> None:
        self._cert_file = cert_file
        self._key_file = key_file
        self._client_ca_file = client_ca_file
        self._on_expiry = on_expiry
        self._interval_s = interval_s
        self._seen = self._fingerprint()
        """What the files held when last read (or why they could not be read)."""
        self.context = self._build()
        """The context uvicorn serves with; its handshakes move to ``_current``."""
        self.context.sni_callback = self._choose
        self._current = self.context
        self._report_expiry()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def uvicorn_options(self) -> dict[str, Any]:
        """What to give uvicorn so that it serves with ``context``."""
        return {"ssl_context_factory": self._factory}

    def _factory(self, _config: Any, _default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        return self.context

    def _files(self) -> list[Path]:
        files = [self._cert_file, self._key_file]
        return files if self._client_ca_file is None else [*files, self._client_ca_file]

    def _fingerprint(self) -> bytes:
        digest = hashlib.sha256()
        for path in self._files():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        return digest.digest()

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # No session resumption: a resumed session skips the certificate check, so a client of
        # a CA taken out of ca.crt could go on resuming what it had before the reload. TLS 1.3
        # resumes with tickets only (none are issued); TLS 1.2 would resume from the server's
        # session cache, which Python cannot turn off. Every client here speaks TLS 1.3.
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.options |= ssl.OP_NO_TICKET
        context.num_tickets = 0
        context.load_cert_chain(self._cert_file, self._key_file)
        if self._client_ca_file is not None:
            # Optional at the TLS layer (agents push with a token and no certificate); a
            # certificate that is presented must be the CA's, and the verbs check its names.
            context.verify_mode = ssl.CERT_OPTIONAL
            context.load_verify_locations(self._client_ca_file)
        return context

    def _choose(
        self, connection: ssl.SSLObject, _server_name: str | None, context: ssl.SSLContext
    ) -> None:
        current = self._current
        if current is not context:
            connection.context = current

    def _report_expiry(self) -> float | None:
        not_after = certificate_not_after(self._cert_file)
        if not_after is None:
            log.warning("TLS: cannot read when %s expires: no expiry exported", self._cert_file)
        elif self._on_expiry is not None:
            self._on_expiry(not_after)
        return not_after

    def reload_if_changed(self) -> bool:
        """Serve a context built from the files if they changed; True when one now is."""
        try:
            seen = self._fingerprint()
        except OSError as exc:
            seen = f"unreadable: {exc}".encode()
            if seen != self._seen:
                self._seen = seen
                log.warning("TLS: cannot read the certificate files (%s): still serving the "
                            "certificate loaded before", exc)  # fmt: skip
            return False
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            context = self._build()
        except OSError as exc:  # ssl.SSLError among them
            log.warning("TLS: cannot load the changed certificate files (%s): still serving the "
                        "certificate loaded before", exc)  # fmt: skip
            return False
        self._current = context
        not_after = self._report_expiry()
        until = "" if not_after is None else f", valid until {_utc(not_after)}"
        log.info("TLS: reloaded %s for new connections%s", self._cert_file, until)
        return True

    def start(self) -> None:
        """Look for changed files every ``interval_s``, in a thread, until ``stop``."""
        self._thread = threading.Thread(target=self._watch, name="tls-reload", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop looking (and wait for the thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.reload_if_changed()
            except Exception:  # the watch outlives whatever one look ran into
                log.exception("TLS: looking for changed certificate files failed")


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def is_json(scope: Scope) -> bool:
    """Whether the request says its body is JSON: one Content-Type, ``application/json``.

    Parameters (``; charset=utf-8``) are allowed. A browser may send a cross-site POST without
    asking first only as ``text/plain``, a form type, or with no Content-Type at all; all of
    those are refused, so a web page cannot reach the verbs or the push through a visitor's
    browser. kube-scheduler's extender client and the agent both send ``application/json``.
    """
    types: list[bytes] = [value for name, value in scope["headers"] if name == b"content-type"]
    return len(types) == 1 and types[0].partition(b";")[0].strip().lower() == b"application/json"


BODY_TIMEOUT_S = 30.0
"""The longest a request may take to send its body (a client that declares more than it sends
would otherwise hold the request open for ever)."""


class BodyRefused(Exception):
    """A request body that was not read, or not all of it."""


class TooLarge(BodyRefused):
    """The body is over its cap (declared so, or found so while reading)."""


class NoRoom(BodyRefused):
    """Other requests in flight hold the whole budget: the body was not read."""


class Late(BodyRefused):
    """The body had not all arrived within its deadline (``BODY_TIMEOUT_S`` unless told)."""


class Disconnected(BodyRefused):
    """The client went away before its body had all arrived: there is no one to answer."""


async def read_body(
    receive: Receive, limit: int, declared: int | None, timeout_s: float | None = None
) -> bytes:
    """The body: ``TooLarge`` when it is over ``limit`` (before reading when declared so).

    Read into one growing buffer, and refused as soon as it passes ``limit``: a chunked body
    that never ends costs ``limit`` bytes at most. ``Late`` when it has not all arrived within
    ``timeout_s`` (None: ``BODY_TIMEOUT_S``); ``Disconnected`` when the client left first.
    """
    if declared is not None and declared > limit:
        raise TooLarge
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S if timeout_s is None else timeout_s):
            return await _read_all(receive, limit)
    except TimeoutError:
        raise Late from None


async def _read_all(receive: Receive, limit: int) -> bytes:
    message = await receive()
    if message["type"] == "http.disconnect":
        raise Disconnected
    first: bytes = message.get("body", b"")
    if len(first) > limit:
        raise TooLarge
    if not message.get("more_body"):
        return first  # the usual case: the whole body in one message, no copy
    # BytesIO grows one buffer in place and hands it over without a copy (getvalue).
    buffer = io.BytesIO()
    buffer.write(first)
    size = len(first)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge
        buffer.write(chunk)
        if not message.get("more_body"):
            return buffer.getvalue()


class HeldBody:
    """``async with HeldBody(...) as body``: the body, counted in ``budget`` until answered.

    Room for its declared length (``limit`` when it declares none) is reserved before a byte
    is read, waiting up to ``wait_s``; the body must then arrive within ``timeout_s`` (None:
    ``BODY_TIMEOUT_S``). Entering raises a ``BodyRefused``: ``TooLarge``, ``NoRoom``, ``Late``
    or ``Disconnected``. (A class, not a generator: the hot routes enter one per request.)
    """

    __slots__ = ("_budget", "_limit", "_need", "_receive", "_scope", "_timeout_s", "_wait_s")

    def __init__(
        self,
        scope: Scope,
        receive: Receive,
        limit: int,
        budget: BodyBudget,
        wait_s: float,
        timeout_s: float | None = None,
    ) -> None:
        self._scope = scope
        self._receive = receive
        self._limit = limit
        self._budget = budget
        self._wait_s = wait_s
        self._timeout_s = timeout_s
        self._need = 0

    async def __aenter__(self) -> bytes:
        declared = declared_length(self._scope)
        if declared is not None and declared > self._limit:
            raise TooLarge
        need = self._limit if declared is None else declared
        if not await self._budget.acquire(need, self._wait_s):
            raise NoRoom
        self._need = need
        try:
            return await read_body(self._receive, self._limit, declared, self._timeout_s)
        except BaseException:
            self._budget.release(need)
            raise

    async def __aexit__(self, *_: object) -> None:
        self._budget.release(self._need)


class BodyBudget:
    """Bytes of request bodies the process may hold at once, across every connection.

    A request reserves its declared Content-Length (the size cap when it sends none) before its
    body is read, and gives it back once it is answered, parsing and deciding included. So the
    memory the requests in flight take is bounded by the budget (times what parsing makes of a
    body), however many connections send at once. Waiters are served in arrival order; one
    that does not fit within its wait is refused, and what to answer then is the caller's
    choice.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def acquire(self, size: int, wait_s: float) -> bool:
        """Reserve ``size`` bytes, waiting up to ``wait_s`` for room; False when refused."""
        if size > self.capacity:
            return False
        if not self._waiting and self.used + size <= self.capacity:
            self.used += size
            return True
        if wait_s <= 0:
            return False
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, granted)
        self._waiting.append(entry)
        kept = False
        try:
            await asyncio.wait((granted,), timeout=wait_s)
            kept = granted.done()
            return kept
        finally:
            if not granted.done():
                granted.cancel()
                self._waiting.remove(entry)
                self._grant()  # those behind it may fit now
            elif not kept:
                self.release(size)  # granted, but the caller was cancelled meanwhile

    def release(self, size: int) -> None:
        """Give back a reservation, and let the waiters that now fit in."""
        self.used -= size
        self._grant()

    def _grant(self) -> None:
        while self._waiting and self.used + self._waiting[0][0] <= self.capacity:
            size, granted = self._waiting.popleft()
            self.used += size
            granted.set_result(None)


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
