"""Telemetry push to every extender replica, with bounded exponential backoff and jitter.

Replicas are the URLs given, or, with ``resolve_all``, every address their host names resolve
to (a headless Service's DNS name lists every extender pod). Each round sends the latest
report; a replica in backoff is skipped, so when a link comes back it gets the newest state,
never a backlog. Imports httpx and the standard library.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import httpx

from node_agent.deviceplugin.plugin import LOOKUP_TIMEOUT_S, Assigned

log = logging.getLogger("node_agent.push")

PushResult = Literal["ok", "ignored", "rejected", "failed", "backoff"]
ASSIGNMENTS_TIMEOUT_S = 0.75 * LOOKUP_TIMEOUT_S
"""How long one replica may take to list the node's assignments: the others' answers still
count within the device plugin's wait."""


@dataclass(frozen=True, slots=True)
class Ask:
    """One request of the extender's fault loop (``self_test`` or ``reboot``)."""

    id: str
    boot: str | None = None
    """The boot the decision was made for (the host's boot id, else the agent's); None when
    the answer does not say (an older extender, or a self-test)."""


def _ask(doc: object) -> Ask | None:
    """An answer's request: a plain id, or ``{"id": …, "boot": …}`` (``boot`` optional)."""
    if isinstance(doc, str):
        return Ask(doc[:64]) if doc else None
    if not isinstance(doc, dict):
        return None
    request, boot = doc.get("id"), doc.get("boot")
    if not isinstance(request, str) or not request:
        return None
    return Ask(request[:64], boot[:64] if isinstance(boot, str) and boot else None)


@dataclass(slots=True)
class _Target:
    base: str
    """The extender URL as configured, or ``URL@address`` for one resolved replica."""
    url: str
    host: str | None = None
    """Host header to send when ``url`` names an address instead of the configured host."""
    server_name: str | None = None
    """The configured host name, for TLS (SNI and the certificate check) when ``url`` names an
    address."""
    failures: int = 0
    next_at: float = 0.0
    last_error: str = ""
    max_temp_c: float | None = None
    """The extender's maxTemp, from its last answer."""
    asks: dict[str, Ask] = field(default_factory=dict)
    """The remediation requests of its last answer: ``self_test`` / ``reboot`` → the ask."""
    policy: dict[str, float | bool] | None = None
    """The policy its last answer said the agent's local protection should follow."""
    lend: dict[str, int] = field(default_factory=dict)
    """Idle blocks its last answer said each GPU lends (GPU uuid → blocks)."""


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
    ``power_saving``, ``power_saving_threshold_pct``; each only when valid)."""
    lend: dict[str, int] = field(default_factory=dict)
    """Idle blocks lent per GPU uuid: the least any answering extender said (none: none)."""


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
    ) -> None:
        self._urls = list(urls)
        self._targets = [_Target(u, u.rstrip("/") + "/v1/telemetry") for u in urls]
        self._resolve_all = resolve_all
        self._resolved: dict[str, _Target] = {}
        self._client = client
        self._clock = clock
        self._token_file = token_file
        self._base = base_backoff_s
        self._max = max_backoff_s
        self._rng = rng or random.Random()

    def backoff_s(self, failures: int) -> float:
        """Delay after ``failures`` failures in a row.

        delay = min(max, base · 2^(n−1)), jittered down to 50-100 % so replicas do not retry
        in step.
        """
        bound = min(self._max, self._base * 2.0 ** max(failures - 1, 0))
        return float(bound * self._rng.uniform(0.5, 1.0))

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self._token_file is not None:
            try:
                # Projected tokens rotate: read the file on every push.
                token = self._token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                log.warning("cannot read token file %s: %s", self._token_file, exc.strerror)
            else:
                headers["authorization"] = f"Bearer {token}"
        return headers

    async def _replicas(self) -> list[_Target]:
        """Every address each URL's host resolves to (a headless Service lists every replica).

        Backoff is kept per address; an address that stops resolving is dropped, a new one
        starts fresh. A name that does not resolve at all keeps its last addresses.
        """
        loop = asyncio.get_running_loop()
        targets: list[_Target] = []
        for base in self._urls:
            parts = urlsplit(base)
            host = parts.hostname or ""
            port = parts.port or (443 if parts.scheme == "https" else 80)
            mine = {k: t for k, t in self._resolved.items() if k.startswith(base + "@")}
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                log.warning("cannot resolve %s: %s", host, exc)
                targets += mine.values()
                continue
            addresses = sorted({str(info[4][0]) for info in infos})
            for stale in set(mine) - {f"{base}@{a}" for a in addresses}:
                del self._resolved[stale]
            for address in addresses:
                key = f"{base}@{address}"
                if key not in self._resolved:
                    shown = f"[{address}]" if ":" in address else address
                    url = urlunsplit((parts.scheme, f"{shown}:{port}", parts.path, "", ""))
                    self._resolved[key] = _Target(
                        key, url.rstrip("/") + "/v1/telemetry", parts.netloc, host
                    )
                targets.append(self._resolved[key])
        return targets

    async def _one(
        self, target: _Target, body: bytes, headers: dict[str, str]
    ) -> tuple[PushResult, frozenset[int]]:
        now = self._clock()
        if now < target.next_at:
            return "backoff", frozenset()
        if target.host is not None:
            headers = {**headers, "host": target.host}
        try:
            response = await self._client.post(
                target.url, content=body, headers=headers, extensions=_tls_name(target)
            )
        except httpx.HTTPError as exc:
            return self._failed(target, now, f"{type(exc).__name__}: {exc}"), frozenset()
        if response.status_code >= 500 or response.status_code in (401, 403, 429):
            return self._failed(
                target, now, f"HTTP {response.status_code}: {response.text[:200]}"
            ), frozenset()
        if response.status_code >= 400:
            # Our report is wrong: say so loudly, and back off so the log is not flooded.
            self._failed(target, now, f"HTTP {response.status_code}: {response.text[:500]}")
            return "rejected", frozenset()
        if target.failures:
            log.info("push to %s works again after %d failures", target.url, target.failures)
        target.failures, target.next_at, target.last_error = 0, 0.0, ""
        try:
            payload = response.json()
        except ValueError:
            payload = {}
        gpus = payload.get("performance_gpus") if isinstance(payload, dict) else None
        boost = (
            frozenset(g for g in gpus if isinstance(g, int))
            if isinstance(gpus, list)
            else frozenset()
        )
        accepted = payload.get("accepted", True) if isinstance(payload, dict) else True
        max_temp = payload.get("max_temp_c") if isinstance(payload, dict) else None
        if isinstance(max_temp, int | float) and not isinstance(max_temp, bool):
            target.max_temp_c = float(max_temp)
        target.policy = _policy(payload.get("policy") if isinstance(payload, dict) else None)
        target.lend = _lend(payload.get("lend_blocks") if isinstance(payload, dict) else None)
        target.asks = {}
        for kind in ("self_test", "reboot"):
            ask = _ask(payload.get(kind) if isinstance(payload, dict) else None)
            if ask is not None:
                target.asks[kind] = ask
        return ("ok" if accepted else "ignored"), boost

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
            targets = await self._replicas() if self._resolve_all else self._targets
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
                resp = await self._client.get(
                    url, headers={**headers, **extra}, extensions=_tls_name(t)
                )
        except (httpx.HTTPError, TimeoutError) as exc:
            log.warning("assignments from %s: %s", url, f"{type(exc).__name__}: {exc}")
            return None
        if resp.status_code != 200:
            log.warning("assignments from %s: HTTP %d %s", url, resp.status_code,
                        resp.text[:200])  # fmt: skip
            return None
        try:
            rows = resp.json()["assignments"]
            return [
                Assigned(
                    str(r["uid"]),
                    str(r["namespace"]),
                    str(r["name"]),
                    str(r["gpu_uuids"][0]),
                    int(r["blocks"]),
                    float(r["assigned_at"]),
                    r.get("phase"),
                    tuple(int(b) for b in r.get("containers") or ()),
                )
                for r in rows
                if r.get("gpu_uuids") and r["gpu_uuids"][0]
            ]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            log.warning("assignments from %s: not understood: %s", url, exc)
            return None

    async def push(self, body: bytes) -> PushOutcome:
        """Send one report body to every URL that is not backing off, concurrently."""
        headers = self._headers()
        targets = await self._replicas() if self._resolve_all else self._targets
        done = await asyncio.gather(*(self._one(t, body, headers) for t in targets))
        boost: frozenset[int] = frozenset().union(*(b for _, b in done)) if done else frozenset()
        told = [t.max_temp_c for t in targets if t.max_temp_c is not None]
        asks: dict[str, Ask] = {}
        policy = None
        lends: list[dict[str, int]] = []
        for t, (result, _) in zip(targets, done, strict=True):
            if result in ("ok", "ignored"):
                asks.update(t.asks)
                policy = policy or t.policy
                lends.append(t.lend)
        # A replica behind on a pod's use may still lend what another already took back.
        lend = {u: min(d.get(u, 0) for d in lends) for u in lends[0]} if lends else {}
        return PushOutcome(
            {t.base: r for t, (r, _) in zip(targets, done, strict=True)},
            boost,
            min(told) if told else None,
            asks,
            policy,
            {u: n for u, n in lend.items() if n > 0},
        )


_POLICY_RANGES = {
    "memory_block_mib": (1.0, 1_048_576.0),
    "max_temp_c": (1.0, 150.0),
    "cool_down_s": (0.0, 86_400.0),
    "power_saving_threshold_pct": (0.0, 100.0),
}


MAX_LENT_BLOCKS = 1024
"""Blocks one GPU may lend at most, as the agent reads an answer (a bad one costs nothing)."""


def _lend(doc: object) -> dict[str, int]:
    """The valid entries of an answer's ``lend_blocks`` (GPU uuid → blocks)."""
    if not isinstance(doc, dict):
        return {}
    return {
        str(uuid)[:128]: n
        for uuid, n in doc.items()
        if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_LENT_BLOCKS
    }


def _policy(doc: object) -> dict[str, float | bool] | None:
    """The valid fields of an answer's ``policy`` (a newer or broken extender costs nothing)."""
    if not isinstance(doc, dict):
        return None
    out: dict[str, float | bool] = {}
    for key, (low, high) in _POLICY_RANGES.items():
        value = doc.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            if low <= value <= high:
                out[key] = float(value)
    if isinstance(doc.get("power_saving"), bool):
        out["power_saving"] = doc["power_saving"]
    return out or None


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


def _tls_name(target: _Target) -> dict[str, str]:
    """For a replica reached by address: the host name its certificate must name."""
    return {"sni_hostname": target.server_name} if target.server_name else {}
