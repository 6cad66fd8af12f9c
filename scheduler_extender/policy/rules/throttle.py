"""Throttle rule: prefer GPUs whose clocks are not held down for heat or power.

A throttled GPU runs a new pod slower than its twin at full clocks, before it is hot enough for
the thermal filter. Pure; imports only numpy and ``policy.base``/``batch``.
"""

from __future__ import annotations

import numpy as np

from scheduler_extender.policy.base import Sections, Term, class_weights
from scheduler_extender.policy.batch import FloatArray, NodeBatch


def _term(batch: NodeBatch, spec: Sections) -> FloatArray:
    """1 for a GPU at full clocks (or unknown), 0 for one slowed for heat or power."""
    slowed: FloatArray = np.where(batch.readings["slowdown"] > 0, 0.0, 1.0)  # NaN: not slowed
    return slowed


TERM = Term(
    "throttle",
    "Prefer GPUs not slowed for heat or power (NVML's thermal and power clock reasons).",
    class_weights(realtime=2, training=2, inference=1, best_effort=0),
    _term,
)
