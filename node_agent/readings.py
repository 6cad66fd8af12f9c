# Generated from scheduler_extender/telemetry/fields.py by `make generate`: do not edit.
"""The readings a backend takes of a GPU, from the extender's ``fields.GPU_FIELDS``.

``model.GpuReading`` inherits them. Imports only the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuReadings:
    """Each reading of one GPU at one moment; None where its backend could not read it."""

    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    utilization_pct: float | None = None
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    fan_speed_pct: float | None = None
