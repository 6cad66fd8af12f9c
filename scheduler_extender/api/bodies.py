"""Reading request bodies on the raw ASGI routes: size caps, deadlines and a shared budget.

A body is refused before it is read when it declares more than its cap or the process has no
room for it, and while it is read when it grows past its cap or arrives too slowly. Standard
library only.
"""

from __future__ import annotations

import asyncio
import collections
import io

from scheduler_extender.api.server import Receive, Scope


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length, when it sent a valid one."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit():
            return int(value)
    return None


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
