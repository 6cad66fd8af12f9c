# Generated from scheduler_extender/telemetry/fields.py by `make generate`: do not edit.
"""The reported readings of the telemetry contract, from ``fields.GPU_FIELDS``.

``schema.GpuReport`` inherits them. Imports pydantic only: the agent imports it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field


class GpuReadings(BaseModel):
    """Each reading of one GPU at one moment; None where its backend could not read it."""

    temperature_c: Annotated[float, Field(ge=-60, le=200)] | None = None
    power_w: Annotated[float, Field(ge=0, le=10_000)] | None = None
    power_limit_w: Annotated[float, Field(ge=0, le=10_000)] | None = None
    utilization_pct: Annotated[float, Field(ge=0, le=100)] | None = None
    memory_total_mib: Annotated[float, Field(ge=0, le=16_777_216)] | None = None
    memory_used_mib: Annotated[float, Field(ge=0, le=16_777_216)] | None = None
    sm_clock_mhz: Annotated[float, Field(ge=0, le=100_000)] | None = None
    sm_clock_max_mhz: Annotated[float, Field(ge=0, le=100_000)] | None = None
    fan_speed_pct: Annotated[float, Field(ge=0, le=200)] | None = None
