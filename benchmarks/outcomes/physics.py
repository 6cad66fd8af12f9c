"""The GPUs of the fleet: datasheet figures per model, power, clocks and a first-order thermal
model. Pure numpy over arrays of GPUs; the models and time constant are the simulated agent
backend's where it has them.

Power:  P = P_idle + (P_max − P_idle) · busy · c^ALPHA, with busy = min(1, demand / c) the share
of time the GPU computes at clock fraction c (a slower clock computes longer for the same work).
Thermal: T → T_ss = inlet + R · P with time constant TAU_S (exact exponential step).
Clocks: c = min(power-limit clock, agent lock, ½ at or above the slowdown temperature).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from node_agent.backends.simulated import MODELS as SIMULATED, TIME_CONSTANT_S, GpuModel

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

ALPHA = 2.0
"""Dynamic power ∝ clock^ALPHA: f·V² with the voltage falling about half as fast as the clock."""
TAU_S = TIME_CONSTANT_S
"""Thermal time constant of a GPU and its heatsink: the simulated agent backend's."""
DESIGN_INLET_C = 35.0
"""ASHRAE A2's highest allowable inlet: the chassis keeps a GPU at its TDP at DESIGN_TEMP_C there."""
DESIGN_TEMP_C = 85.0
"""The temperature a GPU at TDP reaches with DESIGN_INLET_C air (the seed's maxTemp)."""
HW_SLOWDOWN_CLOCK = 0.5
"""NVML: HW slowdown reduces "the core clocks by a factor of 2 or more"."""


@dataclass(frozen=True, slots=True)
class FleetGpu:
    """One GPU model of the trace: the simulated backend's figures, its slowdown temperature and
    where the figures come from."""

    spec: GpuModel
    slowdown_c: float
    source: str

    @property
    def name(self) -> str:
        """The trace's model name."""
        return self.spec.name


def thermal_resistance(tdp_w: FloatArray) -> FloatArray:
    """°C/W such that a GPU at its TDP with DESIGN_INLET_C air sits at DESIGN_TEMP_C."""
    out: FloatArray = (DESIGN_TEMP_C - DESIGN_INLET_C) / tdp_w
    return out


def _model(
    name: str, tdp_w: float, idle_w: float, min_w: float, mib: float, mhz: float
) -> GpuModel:
    return GpuModel(
        name, tdp_w, idle_w, min_w, mib, mhz, float(thermal_resistance(np.array(tdp_w)))
    )


_SIM = {m.name: m for m in SIMULATED}
MODELS: dict[str, FleetGpu] = {
    m.name: m
    for m in (
        FleetGpu(replace(_SIM["Tesla T4"], name="T4"), 93,
                 "NVIDIA T4 datasheet (70 W, 16 GB, 1590 MHz boost)"),
        FleetGpu(_model("P100", 250, 30, 125, 16280, 1329), 82,
                 "NVIDIA Tesla P100 PCIe 16 GB datasheet (250 W, 1329 MHz boost)"),
        FleetGpu(_model("V100M16", 300, 40, 150, 16160, 1530), 87,
                 "NVIDIA Tesla V100 SXM2 16 GB datasheet (300 W, 1530 MHz boost)"),
        FleetGpu(_model("V100M32", 300, 40, 150, 32510, 1530), 87,
                 "NVIDIA Tesla V100 SXM2 32 GB datasheet (300 W, 1530 MHz boost)"),
        FleetGpu(replace(_SIM["NVIDIA A10"], name="A10"), 95,
                 "NVIDIA A10 datasheet (150 W, 24 GB, 1695 MHz boost)"),
        FleetGpu(_model("G2", 250, 35, 150, 40536, 1410), 89,
                 "undisclosed Alibaba model: taken as NVIDIA A100 PCIe 40 GB (datasheet 250 W)"),
        FleetGpu(replace(_SIM["NVIDIA A10"], name="G3"), 95,
                 "undisclosed Alibaba model: taken as NVIDIA A10 (datasheet 150 W)"),
    )
}  # fmt: skip
"""T4 and A10 are the simulated agent backend's own models. TDP, memory and boost clock from the
datasheets named; idle draw, the lowest settable limit and the slowdown temperature are what
``nvidia-smi -q`` is commonly seen to report, not datasheet figures (docs/outcomes.md)."""


def power_w(
    idle_w: FloatArray, max_w: FloatArray, demand: FloatArray, clock: FloatArray
) -> FloatArray:
    """Draw of GPUs asked for ``demand`` (share of the GPU at full clock) at clock fraction ``clock``."""
    busy = np.minimum(1.0, demand / clock)
    out: FloatArray = idle_w + (max_w - idle_w) * busy * clock**ALPHA
    return out


def clock_under_limit(
    idle_w: FloatArray, max_w: FloatArray, demand: FloatArray, limit_w: FloatArray
) -> FloatArray:
    """The highest clock fraction (≤ 1) whose draw at ``demand`` stays within ``limit_w``.

    Where the GPU computes all the time (demand ≥ c): (max − idle) · c^ALPHA = limit − idle.
    Where it has slack (demand < c): (max − idle) · demand · c^(ALPHA−1) = limit − idle.
    """
    room = np.clip((limit_w - idle_w) / (max_w - idle_w), 1e-6, None)
    saturated = room ** (1.0 / ALPHA)
    with np.errstate(divide="ignore"):
        slack = (room / np.maximum(demand, 1e-9)) ** (1.0 / (ALPHA - 1.0))
    clock = np.where(demand >= saturated, saturated, slack)
    out: FloatArray = np.clip(clock, 0.05, 1.0)
    return out


def progress(demand: FloatArray, clock: FloatArray) -> FloatArray:
    """Share of the asked work each GPU gets done: 1 while the slowed GPU still has room."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out: FloatArray = np.where(demand > clock, clock / demand, 1.0)
    return out


def temperature_step(temp_c: FloatArray, steady_c: FloatArray, dt_s: float) -> FloatArray:
    """First-order response over ``dt_s``: exact for a steady target held through the step."""
    keep = math.exp(-dt_s / TAU_S)
    out: FloatArray = steady_c + (temp_c - steady_c) * keep
    return out
