"""Health rule: prefer GPUs the agent reports healthy over degraded ones.

Unhealthy GPUs never pass the filter (``combine``); this term only ranks the rest.
Pure; imports only numpy, ``domain`` and ``policy.base``/``batch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from scheduler_extender.domain import Health
from scheduler_extender.policy.base import Term, class_weights
from scheduler_extender.policy.batch import FloatArray, NodeBatch

if TYPE_CHECKING:
    from scheduler_extender.policy.document import PolicySpec

_HEALTHY = int(Health.HEALTHY)


def _term(batch: NodeBatch, spec: PolicySpec) -> FloatArray:
    """1 for a healthy GPU, 0 for a degraded one."""
    healthy: FloatArray = (batch.health == _HEALTHY).astype(np.float64)
    return healthy


TERM = Term(
    "health",
    "Prefer healthy over degraded GPUs.",
    class_weights(realtime=2, training=2, inference=2, best_effort=1),
    _term,
)
