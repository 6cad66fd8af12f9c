"""The per-GPU readings the extender keeps and the agent exports, declared once.

The telemetry digest, the extender's node table, the rules' ``NodeBatch.readings`` and the
agent's Prometheus gauges all read this table. Imports only the standard library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

SLOWDOWN_REASONS: Final = frozenset(
    {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
)
"""Throttle reasons (NVML's clock event reasons) that hold clocks down for heat or a power
brake. ``sw_power_cap`` is left out: a GPU at full load sits at its power limit."""


def _slowdown(gpu: Any) -> float | None:
    if getattr(gpu, "vendor", None) not in (None, "nvidia"):
        return None  # only NVML reports the reasons: unknown elsewhere
    reasons = gpu.throttle_reasons
    return 1.0 if reasons and not SLOWDOWN_REASONS.isdisjoint(reasons) else 0.0


@dataclass(frozen=True, slots=True)
class GpuField:
    """One per-GPU reading: its name (unit in it), what it means, and where it goes."""

    name: str
    """Attribute of a reported GPU; column of the extender's table; key of ``readings``."""
    help: str
    """What it is, in the units of its gauge (the gauge's help text)."""
    kept: bool = True
    """The extender keeps it per GPU for the rules (``NodeBatch.readings[name]``)."""
    metric: str | None = None
    """The agent's gauge for it (labels gpu, uuid, model, node); None = not exported."""
    scale: float = 1.0
    """The gauge's value is the reading times this (MiB → bytes, % → ratio)."""
    derive: Callable[[Any], float | None] | None = None
    """Works the value out from a reported GPU's other fields; None = read ``name`` itself."""

    def read(self, gpu: Any) -> float | None:
        """The value for one reported GPU (the wire report's or the agent's reading)."""
        if self.derive is not None:
            return self.derive(gpu)
        value = getattr(gpu, self.name)
        return None if value is None else float(value)


GPU_FIELDS: Final = (
    GpuField(
        "temperature_c",
        "GPU temperature in degrees Celsius.",
        metric="node_gpu_temperature_celsius",
    ),
    GpuField("power_w", "GPU power draw in watts.", metric="node_gpu_power_watts"),
    GpuField(
        "power_limit_w", "Enforced GPU power limit in watts.", metric="node_gpu_power_limit_watts"
    ),
    GpuField(
        "utilization_pct",
        "GPU utilisation, 0 to 1.",
        metric="node_gpu_utilization_ratio",
        scale=0.01,
    ),
    GpuField(
        "memory_total_mib",
        "GPU memory in all, bytes.",
        metric="node_gpu_memory_total_bytes",
        scale=1048576.0,
    ),
    GpuField(
        "memory_used_mib",
        "GPU memory in use, bytes.",
        kept=False,  # the extender keeps what its pods do not explain instead
        metric="node_gpu_memory_used_bytes",
        scale=1048576.0,
    ),
    GpuField(
        "sm_clock_mhz",
        "GPU SM clock in hertz.",
        kept=False,
        metric="node_gpu_sm_clock_hertz",
        scale=1e6,
    ),
    GpuField(
        "sm_clock_max_mhz",
        "GPU maximum SM clock in hertz.",
        kept=False,
        metric="node_gpu_sm_clock_max_hertz",
        scale=1e6,
    ),
    GpuField(
        "slowdown",
        "1 while the GPU's clocks are held down for heat or a power brake (NVIDIA only).",
        metric="node_gpu_clock_slowdown",
        derive=_slowdown,
    ),
)
"""Every field, in the order digests and table columns hold them."""

KEPT: Final = tuple(f.name for f in GPU_FIELDS if f.kept)
"""Names of the fields the extender keeps per GPU, in table order."""
