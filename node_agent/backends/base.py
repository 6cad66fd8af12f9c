"""The one interface every GPU backend implements (NVML, simulated, Jetson, later AMD/Intel).

A backend reads and, where it can, sets; what it cannot do says so in ``capabilities`` and
raises ``NotSupported``. Imports only ``model`` and ``errors``.
"""

from __future__ import annotations

from typing import Any, Protocol

from node_agent.errors import NotSupported
from node_agent.model import Capabilities, GpuReading, NodeChecks, PowerLimits, XidEvent


class GpuBackend(Protocol):
    """A source of GPU readings and a sink for power settings."""

    name: str
    """Short name sent as ``agent.backend`` in telemetry."""

    def open(self) -> None:
        """Start; raises ``BackendUnavailable`` with a message saying what to do."""
        ...

    def close(self) -> None:
        """Release the library / handles. Safe to call twice."""
        ...

    def device_count(self) -> int:
        """How many GPUs the node has."""
        ...

    def read(self, index: int) -> GpuReading:
        """Sample one GPU; a lost GPU comes back as ``GpuReading(lost=True)``, not an error."""
        ...

    def node_checks(self) -> NodeChecks:
        """Driver and device-node checks for the whole node."""
        ...

    def poll_xids(self, now: float) -> list[XidEvent]:
        """XID events since the last call, without blocking."""
        ...

    def capabilities(self, index: int) -> Capabilities:
        """What can be set on this GPU."""
        ...

    def power_limits(self, index: int) -> PowerLimits | None:
        """Allowed power-limit range, None when not supported."""
        ...

    def set_power_limit_w(self, index: int, watts: float) -> None:
        """Set the power limit; ``NotSupported`` / ``PermissionDenied`` on failure."""
        ...

    def lock_clocks_mhz(self, index: int, max_mhz: float) -> None:
        """Lock the SM clock to at most ``max_mhz``."""
        ...

    def reset_clocks(self, index: int) -> None:
        """Undo ``lock_clocks_mhz``."""
        ...

    def self_test(self, level: int = 1) -> dict[str, Any]:
        """The node's GPU self-test (``selftest.run_self_test``'s verdict document).

        ``level``: 1 quick (the fault loop's), 2 medium, 3 long (a maintenance may ask for
        more: the diagnostics' deeper runs).
        """
        ...


class ReadOnlyControls:
    """The control half of a backend that reads only.

    No XIDs, and every control reported as not supported (the agent then does not try it again).
    """

    what = "this backend"
    """Named in the not-supported messages."""

    def poll_xids(self, now: float) -> list[XidEvent]:
        """No XID equivalent is read."""
        return []

    def capabilities(self, index: int) -> Capabilities:
        """Read-only."""
        return Capabilities()

    def power_limits(self, index: int) -> PowerLimits | None:
        """No power limit range is read."""
        return None

    def set_power_limit_w(self, index: int, watts: float) -> None:
        """Not supported."""
        raise NotSupported(f"power limits are not implemented for {self.what}")

    def lock_clocks_mhz(self, index: int, max_mhz: float) -> None:
        """Not supported."""
        raise NotSupported(f"clock locking is not implemented for {self.what}")

    def reset_clocks(self, index: int) -> None:
        """Not supported."""
        raise NotSupported(f"clock locking is not implemented for {self.what}")
