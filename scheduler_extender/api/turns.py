"""Telemetry pushes give way to the scheduler's verbs.

kube-scheduler waits on every verb it sends us; an agent does not mind a few milliseconds. With
5,000 nodes pushing every second, a verb that arrives while a burst of pushes is being applied
and answered would wait for the whole burst. So while the scheduler is active (a verb within
the last ``BUSY_S``), pushes take turns: one is applied and answered per turn of the event loop,
in arrival order, and a verb waits for about one push (more only when a backlog builds up).
When the scheduler is quiet, every waiting push goes at once (a turn of the loop per push would
cost ingest throughput).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from scheduler_extender.state.cluster import ClusterState

log = logging.getLogger("scheduler_extender")

BUSY_S = 0.1
"""How long after a verb the scheduler counts as active."""

BACKLOG = 8
"""While it is, a turn lets through one push, or an eighth of those waiting when more queue up
(so that pushes arriving faster than one per turn cannot pile up without bound)."""

STEP_S = 0.0002
"""While the scheduler is active, held pushes are applied in steps of about this long, and a
request that arrives during one waits for that step only (``give_way``)."""


async def give_way() -> None:
    """Yield so that requests that arrived meanwhile run before the caller continues.

    One ``asyncio.sleep(0)`` is not enough: the caller's next step is queued at once, and a
    request read by the poll that follows queues its handler behind it, so the request would
    wait for one more step of background work. Yielding twice puts the caller behind it.
    """
    await asyncio.sleep(0)
    await asyncio.sleep(0)


class PushTurns:
    """A FIFO of pushes waiting for their turn (one event loop only)."""

    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._scheduled = False
        self._verb_at = -float("inf")

    def verb(self) -> None:
        """A scheduler verb arrived: pushes take turns for the next ``BUSY_S``."""
        self._verb_at = time.monotonic()

    @property
    def busy(self) -> bool:
        """Whether the scheduler is active (a verb within the last ``BUSY_S``)."""
        return time.monotonic() - self._verb_at < BUSY_S

    @property
    def waiting(self) -> int:
        """Pushes waiting for their turn."""
        return len(self._waiting)

    async def take(self) -> None:
        """Wait for this push's turn (its place is given away if the caller is cancelled)."""
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[None] = loop.create_future()
        self._waiting.append(turn)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._next)
        await turn

    def _next(self) -> None:
        # Runs once per loop iteration while pushes wait. The pushes it wakes continue at the
        # next iteration, after the requests that the poll brought in meanwhile.
        waiting = len(self._waiting)
        let = max(1, waiting // BACKLOG) if self.busy else waiting
        while self._waiting and let:
            turn = self._waiting.popleft()
            if not turn.done():  # a cancelled push gives its turn away
                turn.set_result(None)
                let -= 1
        if self._waiting:
            asyncio.get_running_loop().call_soon(self._next)
        else:
            self._scheduled = False


async def settle_loop(state: ClusterState, period_s: float) -> None:
    """Every ``period_s``, settle the pushes taken meanwhile and warm the recent decisions.

    Warming yields to the event loop after each step (``ClusterState.warm``), so the scheduler's
    next requests find their answers ready instead of each deciding the changed rows themselves.
    """
    while True:
        await asyncio.sleep(period_s)
        try:
            if state.settle():
                for _ in state.warm():
                    await give_way()
        except Exception:  # never let a bad batch stop the loop; the verbs decide on their own
            log.exception("settling telemetry failed")
