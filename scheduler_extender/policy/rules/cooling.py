"""Cooling rule: prefer GPUs whose fans have speed to spare.

A GPU whose fan already runs near its rated maximum can shed no more heat: a new pod there
heats it toward the thermal limit, where a twin whose fan has room holds its temperature. Fans
matter on the fan-cooled boards of edge boxes; passively cooled boards report no fan speed and
are not judged. Pure; imports only numpy and ``policy.base``/``batch``.
"""

from __future__ import annotations

import numpy as np

from scheduler_extender.policy.base import Sections, Term, class_weights
from scheduler_extender.policy.batch import FloatArray, NodeBatch

FULL_FROM_PCT = 50.0
"""Up to this fan speed (% of its rated maximum) a fan has all the room it needs."""


def _term(batch: NodeBatch, spec: Sections) -> FloatArray:
    """1 up to half speed, falling to 0 at full speed; 1 where no fan speed is reported."""
    fan = batch.readings["fan_speed_pct"]
    room = np.clip((100.0 - fan) / (100.0 - FULL_FROM_PCT), 0.0, 1.0)
    out: FloatArray = np.where(np.isnan(fan), 1.0, room)
    return out


TERM = Term(
    "cooling",
    "Prefer GPUs whose fans have speed to spare (fan-cooled boards; passive ones are not judged).",
    class_weights(realtime=2, training=1, inference=1, best_effort=0),
    _term,
)
