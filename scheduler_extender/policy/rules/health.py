"""Health rule: prefer GPUs the agent reports healthy over degraded ones.

Unhealthy GPUs never pass the filter (``verdict``); this term only ranks the rest.
Pure; imports only numpy, ``domain`` and ``policy.base``/``batch``.
"""

from __future__ import annotations

import numpy as np

from scheduler_extender.domain import Health
from scheduler_extender.policy.base import Sections, Term, class_weights
from scheduler_extender.policy.batch import FloatArray, NodeBatch

_HEALTHY = int(Health.HEALTHY)


def _term(batch: NodeBatch, spec: Sections) -> FloatArray:
    """1 for a healthy GPU, 0 for a degraded one."""
    healthy: FloatArray = (batch.health == _HEALTHY).astype(np.float64)
    return healthy


TERM = Term(
    "health",
    "Prefer healthy over degraded GPUs.",
    class_weights(realtime=2, training=2, inference=2, best_effort=1),
    _term,
)
