"""The fault loop's circuit breaker: too many nodes cordoned within a window stops new cordons.

Each node's repeat history (``marks.history``) says when we cordoned it, so the count survives
a leader change. One more cordon than ``breakerPercent`` of the GPU nodes within
``breakerWindow`` trips the breaker: its state goes to the ConfigMap
``edgegpu-remediation-breaker`` in the extender's namespace, and no node is cordoned until an
operator deletes that ConfigMap (only cordons after the reset count again). Nodes held already
go on through their workflow. A missing ConfigMap is a reset, written as such; one that is
there but unreadable counts as tripped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime

from scheduler_extender.k8s.client import JsonDict, KubeError
from scheduler_extender.policy.remediation import RemediationArgs
from scheduler_extender.remediation import marks
from scheduler_extender.remediation.actuator import Actuator

log = logging.getLogger("scheduler_extender.remediation")

CONFIG_MAP = "edgegpu-remediation-breaker"
TRIPPED, CLOSED = "tripped", "closed"


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def cordoned_within(
    nodes: Mapping[str, JsonDict], since: float, now: float, window_s: float
) -> set[str]:
    """Nodes whose history shows a cordon within the window, and after ``since`` (a reset)."""
    start = max(since, now - window_s)
    return {
        name
        for name, node in nodes.items()
        if any(start < t <= now for ts in marks.history(node).values() for t in ts)
    }


class Breaker:
    """Whether new cordons are allowed, kept in a ConfigMap while tripped."""

    def __init__(self, act: Actuator, namespace: str) -> None:
        self.act = act
        self.namespace = namespace
        self.tripped: bool | None = None
        """None until read back (a new leader)."""
        self.since = 0.0
        """When it was last reset (wall): only cordons after it count."""
        self.reason = ""
        self._unsaved = False
        """Tripped here, but not written yet: written before anything is read back."""
        self._recent: dict[str, float] = {}
        """Nodes this replica cordoned, and when (wall): the watch may not show them yet."""

    def cordoned(self, node: str, wall: float) -> None:
        """This replica cordoned ``node`` at ``wall``."""
        self._recent[node] = wall

    def reset(self) -> None:
        """Not leading: read the state back when leading again."""
        self.tripped, self._unsaved = None, False
        self._recent.clear()

    async def _read(self) -> None:
        doc = await self.act.read_config_map(self.namespace, CONFIG_MAP)
        now = self.act.clock.wall()
        if doc is None:  # deleted: an operator's reset (or a first start)
            self.tripped, self.since = False, now
            await self._write(CLOSED, "reset: no breaker state found")
            log.warning("remediation: circuit breaker closed (reset)")
        else:
            data = doc.get("data") or {}
            try:
                since = min(_epoch(str(data.get("since"))), now)  # never a reset in the future
                state = data.get("state")
            except (TypeError, ValueError):
                since, state = now, None
            # Anything but a closed breaker we can read is a tripped one: only deleting it resets.
            self.tripped, self.since = state != CLOSED, since
            self.reason = (
                str(data.get("reason", ""))
                if state in (TRIPPED, CLOSED)
                else (f"unreadable ConfigMap {CONFIG_MAP}: delete it to reset the breaker")
            )
        self.act.metrics.remediation_breaker.set(1 if self.tripped else 0)

    async def _write(self, state: str, reason: str) -> None:
        data = {"state": state, "since": marks.stamp(self.since), "reason": reason}
        await self.act.write_config_map(self.namespace, CONFIG_MAP, data)

    async def allows(
        self,
        node: str,
        nodes: Mapping[str, JsonDict],
        gpu_nodes: int,
        args: RemediationArgs,
    ) -> bool:
        """Whether ``node`` may be cordoned now; trips the breaker when it may not."""
        if args.breaker_percent <= 0:
            return True
        try:
            if self._unsaved:
                await self._write(TRIPPED, self.reason)
                self._unsaved = False
            elif self.tripped is not False:
                await self._read()  # each round while tripped: an operator may have reset it
        except KubeError as exc:
            log.warning("remediation: the circuit breaker's ConfigMap: %s", exc)
            return False  # cannot tell: no new cordon
        if self.tripped:
            return False
        now = self.act.clock.wall()
        start = max(self.since, now - args.breaker_window_s)
        # A node cordoned here counts for the window even once deleted: nodes replaced by an
        # autoscaler must not free room for the next wave of cordons.
        self._recent = {n: t for n, t in self._recent.items() if t >= start}
        seen = cordoned_within(nodes, self.since, now, args.breaker_window_s) | set(self._recent)
        allowed = args.breaker_allows(gpu_nodes)
        if len(seen | {node}) <= allowed:
            return True  # (a node cordoned again in the window counts once)
        seen.add(node)
        self.tripped = True
        self.act.metrics.remediation_breaker.set(1)
        self.reason = (
            f"{len(seen)} of {gpu_nodes} GPU nodes cordoned within "
            f"{args.breaker_window_s:.0f} s (at most {allowed}): {', '.join(sorted(seen))}"
        )
        log.error("remediation: circuit breaker tripped: %s", self.reason)
        self.act.metrics.remediation.labels("breaker", "gpu_fault", "tripped").inc()
        try:
            await self._write(TRIPPED, self.reason)
        except KubeError as exc:
            log.warning("remediation: writing the tripped circuit breaker: %s", exc)
            self._unsaved = True
        ref = {"kind": "ConfigMap", "namespace": self.namespace, "name": CONFIG_MAP}
        await self.act.event(ref, "EdgeGPURemediationBreakerTripped", self.reason, "Warning")
        return False
