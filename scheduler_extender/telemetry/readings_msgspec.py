# Generated from scheduler_extender/telemetry/fields.py by `make generate`: do not edit.
"""The reported readings as the hot path decodes them, from ``fields.GPU_FIELDS``.

``report.GpuReport`` inherits them; the bounds are the contract's. The agent never
imports this module (it would load msgspec).
"""

from __future__ import annotations

from typing import Annotated

import msgspec


class GpuReadings(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """Each reading of one GPU at one moment; None where its backend could not read it."""

    temperature_c: Annotated[float, msgspec.Meta(ge=-60, le=200)] | None = None
    power_w: Annotated[float, msgspec.Meta(ge=0, le=10_000)] | None = None
    power_limit_w: Annotated[float, msgspec.Meta(ge=0, le=10_000)] | None = None
    utilization_pct: Annotated[float, msgspec.Meta(ge=0, le=100)] | None = None
    memory_total_mib: Annotated[float, msgspec.Meta(ge=0, le=16_777_216)] | None = None
    memory_used_mib: Annotated[float, msgspec.Meta(ge=0, le=16_777_216)] | None = None
    sm_clock_mhz: Annotated[float, msgspec.Meta(ge=0, le=100_000)] | None = None
    sm_clock_max_mhz: Annotated[float, msgspec.Meta(ge=0, le=100_000)] | None = None
    fan_speed_pct: Annotated[float, msgspec.Meta(ge=0, le=200)] | None = None
