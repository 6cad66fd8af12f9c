"""Telemetry push to every extender replica, with bounded exponential backoff and jitter.

Each round sends the latest report to every replica (``Replicas``); a replica in backoff is
skipped, so when a link comes back it gets the newest state, never a backlog. Each answer is
read field by field (``read_answer``) and the replicas' answers are merged. An https push is
made only with the extender's CA in hand (``ExtenderCa``). Imports httpx and the standard
library.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from node_agent.deviceplugin.devices import Assigned
from node_agent.dra.plugin import AllocatedClaim
from node_agent.uplink import assignments, claims
from node_agent.uplink.answer import Ask, PushAnswer, StepAsk, read_answer
from node_agent.uplink.replicas import (
    MAX_ANSWER_BYTES,
    RESOLVE_TIMEOUT_S,
    AnswerTooLarge,
    Replica,
    Replicas,
    head,
    read_capped,
    tls_name,
    waits_for_ca,
)
from node_agent.uplink.trust import ExtenderCa

log = logging.getLogger("node_agent.push")

PushResult = Literal["ok", "ignored", "rejected", "failed", "backoff"]
Read = tuple[PushAnswer, tuple[str, ...]]
"""One answer as read, and its fields ignored as invalid."""
ANSWER_TIMEOUT_S = 10.0
"""How long one push may take in all, answer included (httpx's timeouts bound each read, not
an answer dripped in slowly)."""


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
    step: StepAsk | None = None
    """A GPU maintenance's step the extenders asked for this round."""


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
        ``server_name``, ``resolve_all``, ``resolver`` and ``resolve_timeout_s``: which
        replicas are reached, and how (``Replicas``).
        """
        self._replicas = Replicas(
            urls,
            server_name=server_name,
            resolve_all=resolve_all,
            resolver=resolver,
            resolve_timeout_s=resolve_timeout_s,
        )
        self._ca = ca
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

    async def _one(
        self, target: Replica, body: bytes, headers: dict[str, str], ca_missing: str | None
    ) -> tuple[PushResult, Read | None]:
        if waits_for_ca(target, ca_missing):
            return "failed", None  # said by the CA once; no backoff, so it starts at once
        now = self._clock()
        if now < target.next_at:
            return "backoff", None
        if target.host is not None:
            headers = {**headers, "host": target.host}
        try:
            async with asyncio.timeout(self._answer_timeout_s):
                async with self._client.stream(
                    "POST", target.url, content=body, headers=headers, extensions=tls_name(target)
                ) as response:
                    status = response.status_code
                    raw = await read_capped(response, self._max_answer_bytes)
        except (httpx.HTTPError, AnswerTooLarge) as exc:
            return self._failed(target, now, f"{type(exc).__name__}: {exc}"), None
        except TimeoutError:
            return self._failed(target, now, f"no answer within {self._answer_timeout_s:g} s"), None
        if status >= 500 or status in (401, 403, 429):
            return self._failed(target, now, f"HTTP {status}: {head(raw, 200)}"), None
        if status >= 400:
            # Our report is wrong: say so loudly, and back off so the log is not flooded.
            self._failed(target, now, f"HTTP {status}: {head(raw, 500)}")
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

    def _failed(self, target: Replica, now: float, error: str) -> PushResult:
        target.failures += 1
        target.next_at = now + self.backoff_s(target.failures)
        if target.failures == 1 or error != target.last_error:
            log.warning("push to %s failed (%d in a row): %s", target.url, target.failures, error)
        target.last_error = error
        return "failed"

    async def _askable(self) -> list[Replica]:
        """The replicas to ask now: those whose CA is there."""
        replicas = (await self._replicas.current())[0]
        ca_missing = self._ca.ready() if self._ca is not None else None
        return [r for r in replicas if not waits_for_ca(r, ca_missing)]

    def assignments(self, node: str) -> Callable[[], Awaitable[list[Assigned] | None]]:
        """The device plugin's lookup of the node's GPU assignments (``assignments.merged``)."""

        async def lookup() -> list[Assigned] | None:
            return await assignments.merged(
                self._client, await self._askable(), node, self._headers(), self._max_answer_bytes
            )

        return lookup

    def claims(self, node: str) -> Callable[[], Awaitable[dict[str, AllocatedClaim] | None]]:
        """The DRA plugin's lookup of the node's allocated claims (``claims.merged``)."""

        async def lookup() -> dict[str, AllocatedClaim] | None:
            return await claims.merged(
                self._client, await self._askable(), node, self._headers(), self._max_answer_bytes
            )

        return lookup

    async def push(self, body: bytes) -> PushOutcome:
        """Send one report body to every URL that is not backing off, concurrently."""
        headers = self._headers()
        targets, unresolved = await self._replicas.current()
        ca_missing = self._ca.ready() if self._ca is not None else None
        done = await asyncio.gather(*(self._one(t, body, headers, ca_missing) for t in targets))
        reads = [read for _, read in done if read is not None]
        answers = [answer for answer, _ in reads]
        boost: frozenset[int] = frozenset().union(*(a.performance_gpus for a in answers))
        told = [t.max_temp_c for t in targets if t.max_temp_c is not None]
        asks: dict[str, Ask] = {}
        step: StepAsk | None = None
        policy = None
        lends: list[dict[str, int]] = []
        for answer in answers:
            asks.update(answer.asks)
            step = answer.maintenance or step
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
            step,
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
