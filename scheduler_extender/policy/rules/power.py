"""Power rule: score power headroom, and tell active GPUs from idle ones for power saving.

Pure; imports only numpy, pydantic and the policy's ``base``, ``batch`` and ``memory`` rule.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from pydantic import Field

from scheduler_extender.policy.base import ArgsModel, Section, Sections, Term, class_weights, clip01
from scheduler_extender.policy.batch import NodeBatch
from scheduler_extender.policy.rules import memory

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class PowerArgs(ArgsModel):
    """``spec.powerSaving`` of the policy document."""

    enabled: bool = Field(
        True,
        description="Pack low-QoS pods onto already-active GPUs so idle GPUs stay in low power.",
    )
    threshold_pct: float = Field(
        70.0,
        alias="threshold",
        ge=0,
        le=100,
        description="%. Utilisation below which the agent lowers clocks; at or above = active.",
    )


SECTION = Section(
    "powerSaving",
    PowerArgs,
    "Low-QoS pods pack onto active GPUs; agents lower idle GPUs' clocks.",
)


def headroom_score(power_w: FloatArray, power_limit_w: FloatArray) -> FloatArray:
    """Power headroom in 0..1; unknown draw or limit is neutral (0.5).

    score = clip((limit − draw) / limit, 0, 1)
    """
    known_limit = power_limit_w > 0  # False for NaN too
    with np.errstate(over="ignore"):  # a limit near 0 W: the share overflows to ±inf
        share = np.divide(
            power_limit_w - power_w, power_limit_w, out=np.zeros_like(power_w), where=known_limit
        )
    unknown = np.isnan(power_w) | ~known_limit
    return np.where(unknown, 0.5, clip01(share))


def is_active(utilization_pct: FloatArray, busy: BoolArray, args: PowerArgs) -> BoolArray:
    """A GPU is active when it is loaded above the threshold or already holds work."""
    loaded = utilization_pct >= args.threshold_pct  # NaN (unknown) is not loaded
    return loaded | busy


def _headroom(batch: NodeBatch, spec: Sections) -> FloatArray:
    return headroom_score(batch.readings["power_w"], batch.readings["power_limit_w"])


def _active(batch: NodeBatch, spec: Sections) -> FloatArray:
    idle = memory.is_idle(
        batch.unaccounted_used_mib, batch.allocated_blocks, batch.whole_taken, spec[memory.SECTION]
    )
    active = is_active(batch.readings["utilization_pct"], ~idle, spec[SECTION])
    return active.astype(np.float64)


TERM = Term(
    "power",
    "Power headroom (limit − draw) of the chosen GPU.",
    class_weights(realtime=2, training=2, inference=1, best_effort=0.5),
    _headroom,
)
SAVING_TERM = Term(
    "powerSaving",
    "Prefer already-active GPUs (packing classes, while powerSaving is enabled).",
    class_weights(realtime=0, training=0, inference=2, best_effort=2),
    _active,
)
