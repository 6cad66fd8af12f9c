"""Clocks: the system clock and a fake one for tests. Imports only the standard library.

Decisions use the monotonic clock (freshness, cool-down); the wall clock is only shown.
Remediation, whose records outlive a replica, keeps time by the API server's (``ServerClock``).
"""

from __future__ import annotations

import email.utils
import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Where time comes from."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch (for display and annotations)."""
        ...


class SystemClock:
    """The real clocks."""

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    def wall(self) -> float:
        """``time.time()``."""
        return time.time()


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1000.0, wall_start: float = 1_790_000_000.0) -> None:
        self._mono = start
        self._offset = wall_start - start

    def monotonic(self) -> float:
        """The current fake time."""
        return self._mono

    def wall(self) -> float:
        """The fake time on the wall clock."""
        return self._mono + self._offset

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._mono += seconds


class ServerClock:
    """The API server's clock, read from its answers' ``Date`` headers and run on locally.

    Remediation measures its windows and deadlines (and stamps its records) in this time, so
    that every replica, whatever its own wall clock says, reads a record's times as the one
    that wrote it did: the API server's clock is the only one the replicas share. Between two
    answers the time runs on by the local monotonic clock, so a step of the local wall clock
    changes nothing. ``Date`` has whole seconds: each answer gives a lower bound of the offset
    and the largest is kept, so a true bound is never more than ``RISE_S`` above the first one
    (or the last confirmed step): the offset rises by ``RISE_S`` at most in all. A bound higher
    than that, or more than ``STEP_S`` below the one kept, is taken only once ``CONFIRM``
    answers in a row agree on it within ``AGREE_S`` (the server's clock stepped). Odd answers
    among true ones, from a proxy or a late reply, move nothing; answers that move it must come
    in runs that agree, each run a confirmed step.
    """

    RISE_S = 1.0
    STEP_S = 2.0
    AGREE_S = 1.5
    """How far apart answers of one clock can be: whole seconds, plus the answers' latency."""
    CONFIRM = 3

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._offset: float | None = None
        """Server time minus local monotonic time; None until an answer was seen."""
        self._base = 0.0
        """The first offset, or the last confirmed step's: the kept one rises RISE_S above it
        at most."""
        self._step: tuple[float, float, int] | None = None
        """A step not confirmed yet: its first and largest offset, and how many said so."""
        self._lock = threading.Lock()

    def observe(self, date: str) -> None:
        """An answer's ``Date`` header, just received (an unreadable one is ignored)."""
        try:
            server = email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError, IndexError):
            return
        bound = server - self.clock.monotonic()
        with self._lock:
            if self._offset is None:
                self._offset = self._base = bound
            elif -self.STEP_S <= bound - self._offset and bound <= self._base + self.RISE_S:
                self._offset, self._step = max(self._offset, bound), None
            else:  # a step: answers in a row within AGREE_S of the first of them confirm it
                first, best, votes = self._step or (bound, bound, 0)
                if abs(bound - first) <= self.AGREE_S:
                    self._step = (first, max(best, bound), votes + 1)
                else:
                    self._step = (bound, bound, 1)
                if self._step[2] >= self.CONFIRM:
                    self._offset = self._base = self._step[1]
                    self._step = None

    @property
    def known(self) -> bool:
        """Whether an answer of the server was seen yet."""
        return self._offset is not None

    def now(self) -> float:
        """Seconds since the epoch on the server's clock (the local wall clock until known)."""
        if self._offset is None:
            return self.clock.wall()
        return self.clock.monotonic() + self._offset
