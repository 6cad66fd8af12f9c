"""Clocks: the system clock and a fake one for tests. Imports only the standard library.

Decisions use the monotonic clock (freshness, cool-down); the wall clock is only shown.
"""

from __future__ import annotations

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
