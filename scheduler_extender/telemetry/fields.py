"""The per-GPU readings of the telemetry contract, declared once.

Each reading's name (unit in it), type, bounds and who uses it. ``make generate``
(``tools/gen_fields.py``) writes the reading fields of the contract's pydantic model, of the
extender's msgspec struct and of the agent's dataclass from this table, as protobuf stubs are
written from a ``.proto``; a test keeps those modules equal to its output. The agent's report,
the telemetry digest, the extender's node table, the rules' ``NodeBatch.readings``, the agent's
Prometheus gauges, the debug view and ``kubectl edgegpu nodes`` read the table itself.

A new reading takes a row here, ``make generate``, and the backends that read it; a rule reads
it from ``NodeBatch.readings[name]`` when it is ``kept``. Imports only the standard library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

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
    type: Literal["float", "int"] = "float"
    """Its type on the wire and in the structs (always ``| None``: None = could not be read)."""
    ge: float | None = None
    """The least value the contract takes (None: no bound); a report under it is refused."""
    le: float | None = None
    """The greatest value the contract takes (None: no bound)."""
    kept: bool = True
    """The extender keeps it per GPU for the rules (``NodeBatch.readings[name]``)."""
    metric: str | None = None
    """The agent's gauge for it (labels gpu, uuid, model, node); None = not exported."""
    scale: float = 1.0
    """The gauge's value is the reading times this (MiB → bytes, % → ratio)."""
    debug: Literal["summary", "detail"] | None = None
    """Shown by ``/debug/nodes`` and ``/debug/nodes/{name}`` (summary), by the latter only
    (detail), or by neither."""
    kubectl: str | None = None
    """The column of ``kubectl edgegpu nodes`` that shows it; readings naming the same column
    share it, ``/`` between them. None = not shown."""
    derive: Callable[[Any], float | None] | None = None
    """Works the value out from a reported GPU's other fields; None = read ``name`` itself.
    A derived field is not reported: it has no type, bounds, debug entry or column."""

    def __post_init__(self) -> None:
        if self.derive is not None and (
            self.ge is not None
            or self.le is not None
            or self.debug is not None
            or self.kubectl is not None
        ):
            raise ValueError(f"{self.name}: a derived field is not reported nor shown")

    @property
    def reported(self) -> bool:
        """Whether agents report it (a field of the contract's ``GpuReport``)."""
        return self.derive is None

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
        ge=-60,
        le=200,
        metric="node_gpu_temperature_celsius",
        debug="summary",
        kubectl="TEMP°C",
    ),
    GpuField(
        "power_w",
        "GPU power draw in watts.",
        ge=0,
        le=10_000,
        metric="node_gpu_power_watts",
        debug="summary",
        kubectl="POWER/LIMIT W",
    ),
    GpuField(
        "power_limit_w",
        "Enforced GPU power limit in watts.",
        ge=0,
        le=10_000,
        metric="node_gpu_power_limit_watts",
        debug="summary",
        kubectl="POWER/LIMIT W",
    ),
    GpuField(
        "utilization_pct",
        "GPU utilisation, 0 to 1.",
        ge=0,
        le=100,
        metric="node_gpu_utilization_ratio",
        scale=0.01,
        debug="summary",
    ),
    GpuField(
        "memory_total_mib",
        "GPU memory in all, bytes.",
        ge=0,
        le=16_777_216,
        metric="node_gpu_memory_total_bytes",
        scale=1048576.0,
        debug="summary",
    ),
    GpuField(
        "memory_used_mib",
        "GPU memory in use, bytes.",
        ge=0,
        le=16_777_216,
        kept=False,  # the extender keeps what its pods do not explain instead
        metric="node_gpu_memory_used_bytes",
        scale=1048576.0,
        debug="summary",
    ),
    GpuField(
        "sm_clock_mhz",
        "GPU SM clock in hertz.",
        ge=0,
        le=100_000,
        kept=False,
        metric="node_gpu_sm_clock_hertz",
        scale=1e6,
        debug="detail",
    ),
    GpuField(
        "sm_clock_max_mhz",
        "GPU maximum SM clock in hertz.",
        ge=0,
        le=100_000,
        kept=False,
        metric="node_gpu_sm_clock_max_hertz",
        scale=1e6,
        debug="detail",
    ),
    GpuField(
        "fan_speed_pct",
        "GPU fan speed, 0 to 1 of its rated maximum (none on passively cooled boards).",
        ge=0,
        le=200,  # NVML: may exceed 100 % on some boards
        metric="node_gpu_fan_speed_ratio",
        scale=0.01,
        debug="detail",
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

REPORTED: Final = tuple(f for f in GPU_FIELDS if f.reported)
"""The fields an agent reports, in table order (the others are worked out from them)."""
