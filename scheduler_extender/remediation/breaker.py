"""The fleet-wide disruption budget and its circuit breaker, kept in the API server.

Every cordon and every eviction of every controller is written down in the ConfigMap
``edgegpu-remediation-breaker`` (extender's namespace), so a new leader goes on counting where
the last one stopped: each is written down *before* it is made (an entry for one that was then
definitely refused is taken back; one whose outcome is unknown stays), so nothing disruptive
is ever made uncounted. Within ``breakerWindow``: one cordon more than ``breakerPercent`` of the
GPU nodes, or one eviction more than ``breakerEvictions``, trips the breaker, and no cordon or
eviction is made until an operator deletes the ConfigMap (which also clears the ledger: only
what comes after a reset counts). ``evictionsPerMinute`` is read from the same ledger. Times are
the API server's (``Actuator.now``); the ConfigMap is written at its resourceVersion, so two
writers never lose each other's entries. A ConfigMap that is there but unreadable counts as
tripped. Something done but not yet written down is written before anything else is allowed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from scheduler_extender.k8s.client import JsonDict, KubeError
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.policy.remediation import RemediationArgs
from scheduler_extender.remediation import marks
from scheduler_extender.telemetry.clock import Clock

log = logging.getLogger("scheduler_extender.remediation")

CONFIG_MAP = "edgegpu-remediation-breaker"
TRIPPED, CLOSED = "tripped", "closed"
REREAD_S = 10.0
"""A closed ledger older than this (monotonic) is read again before it allows anything."""
TRIPPED_REREAD_S = 2.0
"""A tripped one is read again this often (an operator's reset is seen within a round)."""
FAILED_S = 5.0
"""After the ConfigMap could not be read or written, nothing is allowed (nor asked) this long."""
FUTURE_S = 60.0
"""A ledger time later than now by more than this is taken as now (it still counts)."""
KEEP = 5000
"""Eviction times kept at most (a window's worth at 60 a minute is 3,600)."""


def _epoch(text: str) -> float:
    t = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    if not 0 <= t < _LATEST_S:
        raise ValueError(f"time out of range: {text}")
    return t


_LATEST_S = 32503680000.0
"""Year 3000."""

Entry = tuple[str, str, float]
"""("evict", node, t) or ("cordon", node, t): one disruption written down."""


class Writes(Protocol):
    """What the breaker needs of the actuator (which owns it)."""

    clock: Clock
    metrics: ExtenderMetrics

    def now(self) -> float:
        """The API server's time."""
        ...

    async def read_config_map(self, namespace: str, name: str) -> JsonDict | None:
        """A ConfigMap, or None when there is none."""
        ...

    async def write_config_map(
        self, namespace: str, name: str, data: dict[str, str], version: str | None
    ) -> JsonDict:
        """Create a ConfigMap, or replace it at ``version``."""
        ...

    async def event(self, ref: JsonDict, reason: str, message: str, kind: str) -> None:
        """A core/v1 Event."""
        ...


class Breaker:
    """The ledger of cordons and evictions, and whether it allows one more."""

    def __init__(self, act: Writes, namespace: str) -> None:
        self.act = act
        self.namespace = namespace
        self.tripped: bool | None = None
        """None until read back (a new leader)."""
        self.since = 0.0
        """When it was last reset (server time)."""
        self.reason = ""
        self.cordons: dict[str, list[float]] = {}
        """Node → when we cordoned it (server time), within the window."""
        self.evictions: list[float] = []
        """When each eviction was made (server time), within the window."""
        self._version: str | None = None
        """The ConfigMap's resourceVersion as last read or written (None: there is none)."""
        self._read_at: float | None = None
        self._pending: list[Entry] = []
        """Reserved here but not written down yet."""
        self._cancelled: list[Entry] = []
        """Taken back here but maybe still in the ConfigMap (removed from whatever is read)."""
        self._unsaved_trip = ""
        """The reason of a trip not written yet (it holds whatever the ConfigMap says)."""
        self._failed_at: float | None = None
        self._said: str | None = None
        """The version of an unreadable ConfigMap last logged (and said in an Event)."""

    def reset(self) -> None:
        """Not leading: read the ledger back when leading again.

        What is pending or taken back stays (written by the next leader's save); a trip not
        written is dropped: the entries behind it are written, so it is decided again from them.
        """
        self.tripped = None
        self._read_at = None
        self._unsaved_trip = ""

    # -- the ConfigMap -------------------------------------------------------------------------
    def _parse(self, doc: JsonDict) -> bool:
        """Take the ledger from the ConfigMap; False when it is unreadable (then tripped)."""
        data = doc.get("data") or {}
        self._version = str((doc.get("metadata") or {}).get("resourceVersion") or "") or None
        now = self.act.now()

        def when(text: Any) -> float:
            return min(_epoch(str(text)), now + FUTURE_S)  # from the future: counted as now

        try:
            state = data.get("state")
            since = min(_epoch(str(data.get("since"))), now)  # never a reset in the future
            cordons = {
                str(n): [when(t) for t in ts]
                for n, ts in dict(json.loads(data.get("cordons") or "{}")).items()
            }
            evictions = [when(t) for t in json.loads(data.get("evictions") or "[]")][-KEEP:]
        except Exception:  # whatever it holds: an unreadable ledger is a tripped one
            state, since, cordons, evictions = None, now, {}, []
        # Anything but a closed breaker we can read is a tripped one: only deleting it resets.
        self.tripped = state != CLOSED
        self.since, self.cordons, self.evictions = since, cordons, evictions
        readable = state in (TRIPPED, CLOSED)
        self.reason = (
            str(data.get("reason", ""))
            if readable
            else f"unreadable ConfigMap {CONFIG_MAP}: delete it to reset the breaker"
        )
        return readable

    def _fresh_ledger(self, why: str) -> None:
        self.tripped, self.since, self.reason = False, self.act.now(), why
        self.cordons, self.evictions, self._version = {}, [], None

    def _merge_pending(self) -> None:
        if self._unsaved_trip:  # whatever was read: the trip stands until it is written
            self.tripped, self.reason = True, self._unsaved_trip
        for what, node, t in self._pending:
            if what == "evict":
                if t not in self.evictions:
                    self.evictions.append(t)
            elif t not in self.cordons.setdefault(node, []):
                self.cordons[node].append(t)
        for what, node, t in self._cancelled:
            held = self.evictions if what == "evict" else self.cordons.get(node, [])
            if t in held:
                held.remove(t)

    def _data(self, window_s: float) -> dict[str, str]:
        start = self.act.now() - max(window_s, 60.0)
        cordons = {n: sorted(t for t in ts if t > start) for n, ts in self.cordons.items()}
        self.cordons = {n: ts for n, ts in cordons.items() if ts}
        self.evictions = sorted(t for t in self.evictions if t > start)[-KEEP:]
        return {
            "state": TRIPPED if self.tripped else CLOSED,
            "since": marks.stamp(self.since),
            "reason": self.reason,
            "cordons": json.dumps(
                {n: [marks.stamp_precise(t) for t in ts] for n, ts in sorted(self.cordons.items())}
            ),
            "evictions": json.dumps([marks.stamp_precise(t) for t in self.evictions]),
        }

    async def _read(self) -> None:
        doc = await self.act.read_config_map(self.namespace, CONFIG_MAP)
        if doc is None:  # deleted: an operator's reset (or a first start)
            self._fresh_ledger("reset: no breaker state found")
            log.warning("remediation: circuit breaker closed (reset)")
        else:
            if not self._parse(doc) and self._said != self._version:
                self._said = self._version  # said once for each version of the ConfigMap
                log.error("remediation: circuit breaker tripped: %s", self.reason)
                ref = {"kind": "ConfigMap", "namespace": self.namespace, "name": CONFIG_MAP}
                await self.act.event(
                    ref, "EdgeGPURemediationBreakerTripped", self.reason, "Warning"
                )
        self._merge_pending()
        self._read_at = self.act.clock.monotonic()
        self.act.metrics.remediation_breaker.set(1 if self.tripped else 0)

    async def _save(self, window_s: float, *, retry: bool = True) -> bool:
        """Write the ledger with what is pending, at its resourceVersion; whether it was.

        On a conflict the ledger is read again and (``retry``) written once more.
        """
        for attempt in range(2):
            self._merge_pending()
            try:
                doc = await self.act.write_config_map(
                    self.namespace, CONFIG_MAP, self._data(window_s), self._version
                )
            except KubeError as exc:
                if exc.status not in (404, 409) or attempt:
                    raise
                await self._read()  # someone else wrote it, or an operator deleted it
                if not retry:
                    return False
                continue
            self._version = str((doc.get("metadata") or {}).get("resourceVersion") or "") or None
            self._pending.clear()
            self._cancelled.clear()
            self._unsaved_trip = ""
            return True
        raise AssertionError("unreachable")

    def _unwritten(self) -> bool:
        return bool(self._pending or self._cancelled or self._unsaved_trip)

    async def _ready(self, args: RemediationArgs) -> bool:
        """The ledger read (again while tripped or old) and nothing left unwritten."""
        now = self.act.clock.monotonic()
        if self._failed_at is not None and now - self._failed_at < FAILED_S:
            return False  # it failed a moment ago: no call per pod while the API is down
        reread = TRIPPED_REREAD_S if self.tripped is not False else REREAD_S
        try:
            if self._read_at is None or self.tripped is None or now - self._read_at > reread:
                await self._read()
                if self._version is None or self._unwritten():
                    await self._save(args.breaker_window_s)
            elif self._unwritten():
                await self._save(args.breaker_window_s)
        except KubeError as exc:
            log.warning("remediation: the circuit breaker's ConfigMap: %s", exc)
            self._failed_at = now
            return False  # cannot tell, or cannot write down what was done: nothing new
        self._failed_at = None
        return True

    async def _trip(self, reason: str, args: RemediationArgs) -> None:
        self.tripped, self.reason = True, reason
        self.act.metrics.remediation_breaker.set(1)
        log.error("remediation: circuit breaker tripped: %s", reason)
        self._unsaved_trip = reason
        try:
            await self._save(args.breaker_window_s)
        except KubeError as exc:  # held until written (dropped when leadership is lost)
            log.warning("remediation: writing the tripped circuit breaker: %s", exc)
        ref = {"kind": "ConfigMap", "namespace": self.namespace, "name": CONFIG_MAP}
        await self.act.event(ref, "EdgeGPURemediationBreakerTripped", reason, "Warning")

    # -- what it allows ------------------------------------------------------------------------
    def _within(self, window_s: float) -> Callable[[float], bool]:
        start = max(self.since, self.act.now() - window_s)
        return lambda t: t >= start

    async def may_cordon(self, node: str, gpu_nodes: int, args: RemediationArgs) -> str | None:
        """None when ``node`` may be cordoned now; else why not (and trips the breaker)."""
        if not await self._ready(args):
            return "breaker_unknown"
        if self.tripped:
            return "breaker"
        if args.breaker_percent <= 0:
            return None
        within = self._within(args.breaker_window_s)
        seen = {n for n, ts in self.cordons.items() if any(within(t) for t in ts)}
        seen |= {n for what, n, t in self._pending if what == "cordon" and within(t)}
        allowed = args.breaker_allows(gpu_nodes)
        if len(seen | {node}) <= allowed:
            return None  # (a node cordoned again in the window counts once)
        seen.add(node)
        await self._trip(
            f"{len(seen)} of {gpu_nodes} GPU nodes cordoned within "
            f"{args.breaker_window_s:.0f} s (at most {allowed}): {', '.join(sorted(seen))}",
            args,
        )
        return "breaker"

    async def may_evict(self, args: RemediationArgs) -> str | None:
        """None when one more eviction may be made now; else why not."""
        if not await self._ready(args):
            return "breaker_unknown"
        if self.tripped:
            return "breaker"
        recent = self._within(60.0)
        if sum(recent(t) for t in self.evictions) >= args.evictions_per_minute:
            return "rate_limited"
        if args.breaker_evictions <= 0:
            return None
        within = self._within(args.breaker_window_s)
        made = sum(within(t) for t in self.evictions)
        if made < args.breaker_evictions:
            return None
        await self._trip(
            f"{made} evictions within {args.breaker_window_s:.0f} s (at most "
            f"{args.breaker_evictions}): one more was asked for",
            args,
        )
        return "breaker"

    async def reserve(self, what: str, node: str, args: RemediationArgs) -> Entry | None:
        """Write down a ``"cordon"`` or ``"evict"`` about to be made on ``node``.

        None when it cannot be written: then it must not be made. Nor is it when someone else
        wrote the ledger since it was read (what it allowed was decided on an old ledger): the
        ledger is read again, and the next round decides from it.
        """
        entry = (what, node, round(self.act.now(), 6))
        self._pending.append(entry)
        try:
            written = await self._save(args.breaker_window_s, retry=False)
        except KubeError as exc:
            log.warning("remediation: writing down a %s in the breaker's ConfigMap: %s", what, exc)
            self.cancel(entry)  # it is not made (a write that landed anyway is taken back)
            self._failed_at = self.act.clock.monotonic()
            return None
        except BaseException:
            self.cancel(entry)  # not leading, or the round was cancelled: not made either
            raise
        if not written:
            log.warning("remediation: the breaker's ConfigMap changed since it was read: "
                        "the %s of %s waits for the next round", what, node)  # fmt: skip
            self.cancel(entry)
            return None
        return entry

    def cancel(self, entry: Entry) -> None:
        """Take back an entry whose action was definitely not made.

        Removed here at once and from every read of the ConfigMap until a save has written
        the ledger without it.
        """
        if entry in self._pending:
            self._pending.remove(entry)
        if entry not in self._cancelled:
            self._cancelled.append(entry)
        self._merge_pending()

    async def flush(self, args: RemediationArgs) -> None:
        """At the end of a round: write what was taken back (or is pending) and not written."""
        if self.tripped is None or not self._unwritten():
            return  # not read back yet: the next round's read comes first
        try:
            await self._save(args.breaker_window_s)
        except KubeError as exc:
            log.warning("remediation: the circuit breaker's ConfigMap: %s", exc)
            self._failed_at = self.act.clock.monotonic()

    def view(self) -> dict[str, Any]:
        """What the ledger holds, as last read or written."""
        return {
            "tripped": self.tripped,
            "reason": self.reason,
            "cordons": sorted(self.cordons),
            "evictions": len(self.evictions),
        }
