"""The scoring rules, one module each, and the registry of their score terms.

A rule module holds its ``Args`` and their ``SECTION`` of the policy's ``spec`` (registered in
``document.SECTIONS``), its pure functions and its ``Term``. ``TERMS`` below is the one list
``verdict``, ``combine``, the weights and the explanations read; topology stays last (it is
added after the GPUs are chosen).
"""

from __future__ import annotations

from typing import Final

from scheduler_extender.policy.base import Term
from scheduler_extender.policy.rules import (
    cooling,
    health,
    memory,
    power,
    thermal,
    throttle,
    topology,
)

REGISTRY: Final[tuple[Term, ...]] = (
    thermal.TERM,
    power.TERM,
    memory.TERM,
    power.SAVING_TERM,
    health.TERM,
    throttle.TERM,
    cooling.TERM,
    topology.TERM,
)
"""Every score term, in the order explanations list them."""

TERMS: Final = tuple(t.name for t in REGISTRY)
"""The terms' names, in ``REGISTRY`` order."""

if TERMS[-1] != "topology" or len(set(TERMS)) != len(TERMS):
    raise RuntimeError("score terms must have distinct names, with topology last")
