"""Thermal rule: exclude hot GPUs with a cool-down (hysteresis) and score temperature headroom.

Pure: the caller passes the time. Imports only numpy, pydantic and ``policy.base``/``batch``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from pydantic import Field

from scheduler_extender.policy.base import (
    ArgsModel,
    Duration,
    Section,
    Sections,
    Term,
    class_weights,
    clip01,
)
from scheduler_extender.policy.batch import NodeBatch

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class ThermalArgs(ArgsModel):
    """``spec.thermalThrottling`` of the policy document."""

    max_temp_c: float = Field(
        85.0,
        alias="maxTemp",
        gt=0,
        le=150,
        description="°C. A GPU at or above it takes no new pods (the seed's 85 °C alert level).",
    )
    cool_down_s: Duration = Field(
        300.0,
        alias="coolDownPeriod",
        description="How long a GPU must stay below maxTemp before it takes pods again (5m).",
    )
    migrate_after_s: Duration = Field(
        120.0,
        alias="migrateAfter",
        description="A GPU hot for longer than this has its lowest-QoS pods evicted (2m).",
    )
    idle_temp_c: float = Field(
        30.0,
        alias="idleTemp",
        description="°C where the headroom score reaches 1: about an idle GPU in a cool room.",
    )


SECTION = Section(
    "thermalThrottling",
    ThermalArgs,
    "Hot GPUs take no pods until cooled down; long-hot GPUs shed pods.",
)


@dataclass(frozen=True, slots=True)
class ThermalState:
    """Hysteresis state of one GPU. Times are the caller's monotonic seconds."""

    hot_since: float | None = None
    """When the GPU reached maxTemp; None while it is below."""
    below_since: float | None = None
    """When a GPU that had been hot dropped below maxTemp; None if it was never hot."""


COOL = ThermalState()


def step(
    state: ThermalState, temperature_c: float | None, now: float, args: ThermalArgs
) -> ThermalState:
    """Advance one GPU's hysteresis with a new reading.

    At or above maxTemp: hot (keep the first ``hot_since``). Below it after being hot: start or
    continue the cool-down. An unknown temperature changes nothing.
    """
    if temperature_c is None or math.isnan(temperature_c):
        return state
    if temperature_c >= args.max_temp_c:
        return ThermalState(hot_since=state.hot_since if state.hot_since is not None else now)
    if state.hot_since is not None:
        return ThermalState(below_since=now)
    return state


def excluded_until(hot: BoolArray, below_since: FloatArray, args: ThermalArgs) -> FloatArray:
    """Monotonic time until which each GPU takes no new pods.

    +inf while hot; ``below_since + coolDownPeriod`` once a hot GPU dropped below maxTemp;
    -inf for a GPU that was never hot (``below_since`` NaN).
    """
    cooling = np.where(np.isnan(below_since), -np.inf, below_since + args.cool_down_s)
    return np.where(hot, np.inf, cooling)


def hot_or_cooling(state: ThermalState, now: float, args: ThermalArgs) -> bool:
    """Whether the GPU is hot, or still in its cool-down after being hot."""
    return state.hot_since is not None or (
        state.below_since is not None and now < state.below_since + args.cool_down_s
    )


def needs_migration(state: ThermalState, now: float, args: ThermalArgs) -> bool:
    """Whether the GPU has been hot for longer than ``migrateAfter``."""
    return state.hot_since is not None and now - state.hot_since > args.migrate_after_s


def headroom_score(temperature_c: FloatArray, args: ThermalArgs) -> FloatArray:
    """Temperature headroom in 0..1; unknown temperature is neutral (0.5).

    score = clip((maxTemp − T) / (maxTemp − idleTemp), 0, 1)
    """
    span = max(args.max_temp_c - args.idle_temp_c, 1.0)
    score = clip01((args.max_temp_c - temperature_c) / span)
    return np.where(np.isnan(temperature_c), 0.5, score)


def _term(batch: NodeBatch, spec: Sections) -> FloatArray:
    return headroom_score(batch.readings["temperature_c"], spec[SECTION])


TERM = Term(
    "thermal",
    "Temperature headroom of the chosen GPU.",
    class_weights(realtime=3, training=2, inference=1, best_effort=0.5),
    _term,
)
