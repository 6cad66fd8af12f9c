"""Telemetry push to every extender replica, with bounded exponential backoff and jitter.

Replicas are the URLs given, or, with ``resolve_all``, every address their host names resolve
to (a headless Service's DNS name lists every extender pod). Each round sends the latest
report; a replica in backoff is skipped, so when a link comes back it gets the newest state,
never a backlog. An answer is read up to a size cap, and each of its fields is checked on its
own (``read_answer``). An https push is made only with the extender's CA in hand (``ExtenderCa``).
Imports httpx and the standard library.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import httpx

from node_agent.deviceplugin.plugin import LOOKUP_TIMEOUT_S, Assigned
from node_agent.uplink.answer import GPU_UUID_PATTERN, Ask, PushAnswer, read_answer

log = logging.getLogger("node_agent.push")

PushResult = Literal["ok", "ignored", "rejected", "failed", "backoff"]
Read = tuple[PushAnswer, tuple[str, ...]]
"""One answer as read, and its fields ignored as invalid."""
ASSIGNMENTS_TIMEOUT_S = 0.75 * LOOKUP_TIMEOUT_S
"""How long one replica may take to list the node's assignments: the others' answers still
count within the device plugin's wait."""
MAX_ANSWER_BYTES = 1_048_576
"""The most of an extender's answer the agent reads (a push answer or the node's assignments);
past it the answer is dropped unread and the push counts as failed."""
ANSWER_TIMEOUT_S = 10.0
"""How long one push may take in all, answer included (httpx's timeouts bound each read, not
an answer dripped in slowly)."""
RESOLVE_TIMEOUT_S = 3.0
"""How long the lookup of an extender's host name may take (``resolve_all``); past it the round
goes on with the name's last addresses, or counts its URL as failed when it has none."""


class AnswerTooLarge(Exception):
    """An answer past the size cap (``MAX_ANSWER_BYTES``), or compressed (none is asked for)."""


@dataclass(slots=True)
class _Target:
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


@dataclass(frozen=True, slots=True)
class PushOutcome:
    """What one round of pushes did, per URL, and what the extenders asked of us."""

    results: dict[str, PushResult]
    performance_gpus: frozenset[int] = field(default_factory=frozenset)
    """GPUs the extender says hold high-QoS pods (restore full clocks)."""
    max_temp_c: float | None = None
    """The lowest ``maxTemp`` the extenders answered with (what counts as hot)."""
    asks: dict[str, Ask] = field(default_factory=dict)
    """What the extenders asked this round: ``self_test`` / ``reboot`` → the ask."""
    policy: dict[str, float | bool] | None = None
    """The policy in force as an extender answered it (``max_temp_c``, ``cool_down_s``,
    ``power_saving``, ``power_saving_threshold_pct``, ``memory_block_mib``; each only when
    valid)."""
    lend: dict[str, int] = field(default_factory=dict)
    """Idle blocks lent per GPU uuid: the least any answering extender said (none: none)."""
    ignored: tuple[str, ...] = ()
    """The answer fields ignored as invalid this round, once per answer that had them."""


class ExtenderCa:
    """The CA that signed the extender's certificate, from a file that may appear late.

    ``context`` checks every certificate against this CA alone, and the host name too: until
    the file can be read it trusts no certificate, and no https push is made (``ready``). Once
    read, the CA is kept while the agent runs.
    """

    def __init__(self, ca_file: Path) -> None:
        self.ca_file = ca_file
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # host name and chain checked
        # The checks ssl.create_default_context makes, without the CAs it loads.
        self.context.verify_flags = ssl.create_default_context().verify_flags
        self.loaded = False
        self._said = ""

    def ready(self) -> str | None:
        """None once the CA is loaded; else why https pushes are off. Reads the file again.

        The first failure is logged, and each new one; the recovery once.
        """
        if self.loaded:
            return None
        try:
            # The whole file is read into a scratch context first: a file the context takes
            # only part of must not leave it half loaded.
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=self.ca_file)
            self.context.load_verify_locations(cafile=self.ca_file)
        except (OSError, ssl.SSLError, ValueError) as exc:
            why = f"ca_file {self.ca_file} cannot be read ({_reason(exc)})"
            if why != self._said:
                log.error("%s: no push to an https extender until it can be (it is read "
                          "again at every push); local protection goes on", why)  # fmt: skip
                self._said = why
            return why
        self.loaded = True
        if self._said:
            log.warning("ca_file %s read: pushing to https extenders", self.ca_file)
        return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class Pusher:
    """Pushes report bodies to a list of extender URLs."""

    def __init__(
        self,
        urls: Sequence[str],
        client: httpx.AsyncClient,
        *,
        clock: Callable[[], float],
        token_file: Path | None = None,
        base_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        rng: random.Random | None = None,
        resolve_all: bool = False,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
        ca: ExtenderCa | None = None,
        server_name: str | None = None,
        resolver: Callable[[str, int], Awaitable[Sequence[str]]] | None = None,
        resolve_timeout_s: float = RESOLVE_TIMEOUT_S,
    ) -> None:
        """Pushes to ``urls`` through ``client``.

        ``ca``: the CA an https push waits for (None: the client's own trust).
        ``server_name``: the name every extender's certificate is checked against, whatever
        host its URL names (None: that host). ``resolver``: a host name and port → its
        addresses (``resolve_all``; the system's resolver by default).
        """
        self._urls = list(urls)
        self._targets = [
            _Target(u, u.rstrip("/") + "/v1/telemetry", server_name=server_name) for u in urls
        ]
        self._resolve_all = resolve_all
        self._resolved: dict[str, _Target] = {}
        self._ca = ca
        self._server_name = server_name
        self._resolver = resolver or _addresses
        self._resolve_timeout_s = resolve_timeout_s
        self._lookups: dict[tuple[str, int], asyncio.Future[Sequence[str]]] = {}
        """Lookups still running, by host and port: a round that finds one waits for it again
        rather than start another."""
        self._unresolved: dict[str, str] = {}
        """By URL: why its host did not resolve in the last round (said once)."""
        self._client = client
        self._clock = clock
        self._token_file = token_file
        self._base = base_backoff_s
        self._max = max_backoff_s
        self._rng = rng or random.Random()
        self._max_answer_bytes = max_answer_bytes
        self._answer_timeout_s = answer_timeout_s

    def backoff_s(self, failures: int) -> float:
        """Delay after ``failures`` failures in a row.

        delay = min(max, base · 2^(n−1)), jittered down to 50-100 % so replicas do not retry
        in step.
        """
        bound = min(self._max, self._base * 2.0 ** max(failures - 1, 0))
        return float(bound * self._rng.uniform(0.5, 1.0))

    def _headers(self) -> dict[str, str]:
        # No compressed answers: their size is known only once inflated.
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        if self._token_file is not None:
            try:
                # Projected tokens rotate: read the file on every push.
                token = self._token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                log.warning("cannot read token file %s: %s", self._token_file, exc.strerror)
            else:
                headers["authorization"] = f"Bearer {token}"
        return headers

    async def _replicas(self) -> tuple[list[_Target], list[str]]:
        """Every replica, and the URLs whose host gave no address this round.

        A replica is each address a URL's host resolves to (a headless Service lists them all).

        Backoff is kept per address; an address that stops resolving is dropped, a new one
        starts fresh. A name that does not resolve at all, or not within
        ``resolve_timeout_s``, keeps its last addresses.
        """
        targets: list[_Target] = []
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
                    self._resolved[key] = _Target(
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

    async def _one(
        self, target: _Target, body: bytes, headers: dict[str, str], ca_missing: str | None
    ) -> tuple[PushResult, Read | None]:
        if _waits_for_ca(target, ca_missing):
            return "failed", None  # said by the CA once; no backoff, so it starts at once
        now = self._clock()
        if now < target.next_at:
            return "backoff", None
        if target.host is not None:
            headers = {**headers, "host": target.host}
        try:
            async with asyncio.timeout(self._answer_timeout_s):
                async with self._client.stream(
                    "POST", target.url, content=body, headers=headers, extensions=_tls_name(target)
                ) as response:
                    status = response.status_code
                    raw = await _read_capped(response, self._max_answer_bytes)
        except (httpx.HTTPError, AnswerTooLarge) as exc:
            return self._failed(target, now, f"{type(exc).__name__}: {exc}"), None
        except TimeoutError:
            return self._failed(target, now, f"no answer within {self._answer_timeout_s:g} s"), None
        if status >= 500 or status in (401, 403, 429):
            return self._failed(target, now, f"HTTP {status}: {_text(raw, 200)}"), None
        if status >= 400:
            # Our report is wrong: say so loudly, and back off so the log is not flooded.
            self._failed(target, now, f"HTTP {status}: {_text(raw, 500)}")
            return "rejected", None
        if target.failures:
            log.info("push to %s works again after %d failures", target.url, target.failures)
        target.failures, target.next_at, target.last_error = 0, 0.0, ""
        answer, ignored = read = read_answer(raw)
        if ignored:
            log.debug("answer of %s: ignored %s", target.url, ", ".join(ignored))
        if answer.max_temp_c is not None:
            target.max_temp_c = answer.max_temp_c
        return ("ok" if answer.accepted else "ignored"), read

    def _failed(self, target: _Target, now: float, error: str) -> PushResult:
        target.failures += 1
        target.next_at = now + self.backoff_s(target.failures)
        if target.failures == 1 or error != target.last_error:
            log.warning("push to %s failed (%d in a row): %s", target.url, target.failures, error)
        target.last_error = error
        return "failed"

    def assignments(self, node: str) -> Callable[[], Awaitable[list[Assigned] | None]]:
        """The device plugin's lookup of the node's GPU assignments.

        Every extender replica is asked at once, and their answers are merged: a replica that
        did not bind a pod learns of it by its watch, and may not list it yet when kubelet
        admits it. None when no replica answers within ``ASSIGNMENTS_TIMEOUT_S``.
        """

        async def lookup() -> list[Assigned] | None:
            headers = self._headers()
            targets = (await self._replicas())[0] if self._resolve_all else self._targets
            ca_missing = self._ca.ready() if self._ca is not None else None
            targets = [t for t in targets if not _waits_for_ca(t, ca_missing)]
            answers = await asyncio.gather(*(self._assignments(t, node, headers) for t in targets))
            found = [rows for rows in answers if rows is not None]
            if not found:
                return None
            merged: dict[str, Assigned] = {}
            for rows in found:
                for row in rows:
                    merged.setdefault(row.uid, row)
            return list(merged.values())

        return lookup

    async def _assignments(
        self, t: _Target, node: str, headers: dict[str, str]
    ) -> list[Assigned] | None:
        """One replica's answer to ``/v1/nodes/{node}/assignments``; None when it gives none."""
        url = t.url.removesuffix("/v1/telemetry") + f"/v1/nodes/{node}/assignments"
        extra = {"host": t.host} if t.host is not None else {}
        try:
            async with asyncio.timeout(ASSIGNMENTS_TIMEOUT_S):
                async with self._client.stream(
                    "GET", url, headers={**headers, **extra}, extensions=_tls_name(t)
                ) as resp:
                    status = resp.status_code
                    raw = await _read_capped(resp, self._max_answer_bytes)
        except (httpx.HTTPError, TimeoutError, AnswerTooLarge) as exc:
            log.warning("assignments from %s: %s", url, f"{type(exc).__name__}: {exc}")
            return None
        if status != 200:
            log.warning("assignments from %s: HTTP %d %s", url, status, _text(raw, 200))
            return None
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            log.warning("assignments from %s: not JSON: %s", url, str(exc)[:200])
            return None
        rows = doc.get("assignments") if isinstance(doc, dict) else None
        if not isinstance(rows, list):
            log.warning("assignments from %s: no list of assignments", url)
            return None
        out: list[Assigned] = []
        bad = 0
        for row in rows:
            try:
                found = _assigned(row)
            except ValueError:
                bad += 1
                continue
            if found is not None:
                out.append(found)
        if bad:
            # A pod left out has no GPU to be given: its allocation fails rather than guess.
            log.warning("assignments from %s: %d rows not understood, left out", url, bad)
        return out

    async def push(self, body: bytes) -> PushOutcome:
        """Send one report body to every URL that is not backing off, concurrently."""
        headers = self._headers()
        targets, unresolved = await self._replicas() if self._resolve_all else (self._targets, [])
        ca_missing = self._ca.ready() if self._ca is not None else None
        done = await asyncio.gather(*(self._one(t, body, headers, ca_missing) for t in targets))
        reads = [read for _, read in done if read is not None]
        answers = [answer for answer, _ in reads]
        boost: frozenset[int] = frozenset().union(*(a.performance_gpus for a in answers))
        told = [t.max_temp_c for t in targets if t.max_temp_c is not None]
        asks: dict[str, Ask] = {}
        policy = None
        lends: list[dict[str, int]] = []
        for answer in answers:
            asks.update(answer.asks)
            policy = policy or (answer.policy.said() if answer.policy is not None else None)
            lends.append(answer.lend_blocks)
        # A replica behind on a pod's use may still lend what another already took back.
        lend = {u: min(d.get(u, 0) for d in lends) for u in lends[0]} if lends else {}
        results: dict[str, PushResult] = {base: "failed" for base in unresolved}
        results.update({t.base: r for t, (r, _) in zip(targets, done, strict=True)})
        return PushOutcome(
            results,
            boost,
            min(told) if told else None,
            asks,
            policy,
            {u: n for u, n in lend.items() if n > 0},
            tuple(f for _, ignored in reads for f in ignored),
        )


async def _read_capped(response: httpx.Response, cap: int) -> bytes:
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


def _text(raw: bytes, limit: int) -> str:
    return raw[:limit].decode("utf-8", errors="replace")


def _number(value: object, bounds: tuple[float, float]) -> float | None:
    """``value`` as a float if it is a finite JSON number within ``bounds``, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past a float's range
        return None
    low, high = bounds
    return number if math.isfinite(number) and low <= number <= high else None


_UUID = re.compile(GPU_UUID_PATTERN)
MAX_BLOCKS_PER_POD = 65_536
"""The most blocks one assignment row may say a pod or a container asks."""


def _assigned(row: object) -> Assigned | None:
    """One row of the node's assignments; None for a pod given no GPU.

    Raises ValueError for a row that is not one as the extender writes them.
    """
    if not isinstance(row, dict):
        raise ValueError("not an object")
    uuids = row.get("gpu_uuids")
    if isinstance(uuids, list) and not uuids:
        return None
    uid, namespace, name = row.get("uid", ""), row.get("namespace", ""), row.get("name", "")
    blocks, phase, containers = row.get("blocks", 0), row.get("phase"), row.get("containers") or []
    assigned_at = _number(row.get("assigned_at"), (0.0, math.inf))
    if not (
        isinstance(uuids, list)
        and isinstance(uuids[0], str)
        and _UUID.fullmatch(uuids[0])
        and all(isinstance(s, str) and 0 < len(s) <= 253 for s in (uid, namespace, name))
        and _is_count(blocks)
        and assigned_at is not None
        and (phase is None or (isinstance(phase, str) and len(phase) <= 64))
        and isinstance(containers, list)
        and all(_is_count(b) for b in containers)
    ):
        raise ValueError("a field is missing, of the wrong type or out of range")
    return Assigned(uid, namespace, name, uuids[0], blocks, assigned_at, phase, tuple(containers))


def _is_count(value: object) -> bool:
    return (
        isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_BLOCKS_PER_POD
    )


class FlappingLinkTransport(httpx.AsyncBaseTransport):
    """A transport whose link is down for ``down_s`` out of every ``period_s`` (simulation).

    Used by the ``flapping-link`` scenario and the tests: the failure happens at the HTTP
    boundary, exactly where a dropped edge link would show.
    """

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        clock: Callable[[], float],
        period_s: float = 60.0,
        down_s: float = 20.0,
    ) -> None:
        self._inner = inner
        self._clock = clock
        self._start = clock()
        self._period = period_s
        self._down = down_s

    def link_up(self) -> bool:
        """Whether the simulated link is up now."""
        return (self._clock() - self._start) % self._period >= self._down

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Fail with ConnectError while the link is down."""
        if not self.link_up():
            raise httpx.ConnectError("simulated edge link is down", request=request)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self._inner.aclose()


def _waits_for_ca(target: _Target, ca_missing: str | None) -> bool:
    """Whether ``target`` is https while the extender's CA cannot be read."""
    return ca_missing is not None and target.url.startswith("https://")


def _tls_name(target: _Target) -> dict[str, str]:
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
