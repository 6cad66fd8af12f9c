"""The extender replicas the agent reaches, and how their answers are read off the wire.

Replicas are the URLs given, or, with ``resolve_all``, every address their host names resolve
to (a headless Service's DNS name lists every extender pod). An answer is read up to a size
cap. Imports httpx and the standard library.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

log = logging.getLogger("node_agent.push")

MAX_ANSWER_BYTES = 1_048_576
"""The most of an extender's answer the agent reads (a push answer or the node's assignments);
past it the answer is dropped unread and the push counts as failed."""

RESOLVE_TIMEOUT_S = 3.0
"""How long the lookup of an extender's host name may take (``resolve_all``); past it the round
goes on with the name's last addresses, or counts its URL as failed when it has none."""


class AnswerTooLarge(Exception):
    """An answer past the size cap (``MAX_ANSWER_BYTES``), or compressed (none is asked for)."""


@dataclass(slots=True)
class Replica:
    """One extender replica as the agent reaches it, and its backoff."""

    base: str
    """The extender URL as configured, or ``URL@address`` for one resolved replica."""
    url: str
    host: str | None = None
    """Host header to send when ``url`` names an address instead of the configured host."""
    server_name: str | None = None
    """The name the certificate must hold, sent as SNI: ``--tls-server-name``, else the
    configured host name when ``url`` names an address; None = the host ``url`` names."""
    failures: int = 0
    next_at: float = 0.0
    last_error: str = ""
    max_temp_c: float | None = None
    """The extender's maxTemp, from its last answer that said a valid one."""


class Replicas:
    """The replicas to reach this round; their backoff is kept per address."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        server_name: str | None = None,
        resolve_all: bool = False,
        resolver: Callable[[str, int], Awaitable[Sequence[str]]] | None = None,
        resolve_timeout_s: float = RESOLVE_TIMEOUT_S,
    ) -> None:
        """The replicas of ``urls``.

        ``server_name``: the name every extender's certificate is checked against, whatever
        host its URL names (None: that host). ``resolver``: a host name and port → its
        addresses (``resolve_all``; the system's resolver by default).
        """
        self._urls = list(urls)
        self._targets = [
            Replica(u, u.rstrip("/") + "/v1/telemetry", server_name=server_name) for u in urls
        ]
        self._resolve_all = resolve_all
        self._resolved: dict[str, Replica] = {}
        self._server_name = server_name
        self._resolver = resolver or _addresses
        self._resolve_timeout_s = resolve_timeout_s
        self._lookups: dict[tuple[str, int], asyncio.Future[Sequence[str]]] = {}
        """Lookups still running, by host and port: a round that finds one waits for it again
        rather than start another."""
        self._unresolved: dict[str, str] = {}
        """By URL: why its host did not resolve in the last round (said once)."""

    async def current(self) -> tuple[list[Replica], list[str]]:
        """Every replica, and the URLs whose host gave no address this round."""
        return await self._resolved_now() if self._resolve_all else (self._targets, [])

    async def _resolved_now(self) -> tuple[list[Replica], list[str]]:
        """Every replica, and the URLs whose host gave no address this round.

        A replica is each address a URL's host resolves to (a headless Service lists them all).

        Backoff is kept per address; an address that stops resolving is dropped, a new one
        starts fresh. A name that does not resolve at all, or not within
        ``resolve_timeout_s``, keeps its last addresses.
        """
        targets: list[Replica] = []
        unresolved: list[str] = []
        for base in self._urls:
            parts = urlsplit(base)
            host = parts.hostname or ""
            port = parts.port or (443 if parts.scheme == "https" else 80)
            mine = {k: t for k, t in self._resolved.items() if k.startswith(base + "@")}
            try:
                addresses = sorted(set(await self._resolve(host, port)))
            except (OSError, TimeoutError) as exc:
                why = (
                    f"no answer within {self._resolve_timeout_s:g} s"
                    if isinstance(exc, TimeoutError)
                    else str(exc)
                )
                if self._unresolved.get(base) != why:
                    log.warning("cannot resolve %s: %s%s", host, why,
                                "; pushing to its last addresses" if mine else "")  # fmt: skip
                    self._unresolved[base] = why
                targets += mine.values()
                if not mine:
                    unresolved.append(base)
                continue
            if self._unresolved.pop(base, None) is not None:
                log.info("%s resolves again", host)
            for stale in set(mine) - {f"{base}@{a}" for a in addresses}:
                del self._resolved[stale]
            for address in addresses:
                key = f"{base}@{address}"
                if key not in self._resolved:
                    shown = f"[{address}]" if ":" in address else address
                    url = urlunsplit((parts.scheme, f"{shown}:{port}", parts.path, "", ""))
                    self._resolved[key] = Replica(
                        key,
                        url.rstrip("/") + "/v1/telemetry",
                        parts.netloc,
                        self._server_name or host,
                    )
                targets.append(self._resolved[key])
        return targets, unresolved

    async def _resolve(self, host: str, port: int) -> Sequence[str]:
        """``host``'s addresses, waited for ``resolve_timeout_s`` at most.

        Raises OSError, or TimeoutError when the lookup takes longer; that lookup goes on and
        the next round waits for it rather than start another.
        """
        lookup = self._lookups.get((host, port))
        if lookup is None:
            lookup = asyncio.ensure_future(self._resolver(host, port))
            lookup.add_done_callback(_retrieved)
            self._lookups[(host, port)] = lookup
        try:
            return await asyncio.wait_for(asyncio.shield(lookup), self._resolve_timeout_s)
        finally:
            if lookup.done():
                self._lookups.pop((host, port), None)


async def read_capped(response: httpx.Response, cap: int) -> bytes:
    """A streamed response's body, read no further than ``cap`` bytes.

    Raises ``AnswerTooLarge`` past it, or for a compressed body (the agent asks for none, and a
    small compressed answer can inflate past any limit).
    """
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise AnswerTooLarge(f"answer compressed ({encoding[:32]}) though none was asked for")
    length = response.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and (len(length) > 18 or int(length) > cap):
        raise AnswerTooLarge(f"answer of {length[:20]} bytes, over the limit of {cap}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise AnswerTooLarge(f"answer over the limit of {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def head(raw: bytes, limit: int) -> str:
    """The first ``limit`` bytes of an answer as text, for a log line."""
    return raw[:limit].decode("utf-8", errors="replace")


def waits_for_ca(target: Replica, ca_missing: str | None) -> bool:
    """Whether ``target`` is https while the extender's CA cannot be read."""
    return ca_missing is not None and target.url.startswith("https://")


def tls_name(target: Replica) -> dict[str, str]:
    """The name the replica's certificate must hold, where it is not the host its URL names."""
    return {"sni_hostname": target.server_name} if target.server_name else {}


async def _addresses(host: str, port: int) -> list[str]:
    """The addresses the system's resolver gives ``host``. Raises OSError."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _retrieved(lookup: asyncio.Future[Sequence[str]]) -> None:
    """Marks a lookup's error as seen: one that ends after every round gave up on it is not."""
    if not lookup.cancelled():
        lookup.exception()
