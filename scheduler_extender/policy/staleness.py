"""Stale-telemetry rule: how old is too old, and which classes fail open.

Pure; imports only numpy, pydantic, ``domain`` and ``policy.base``. Staleness alone never evicts:
edge links drop, and a node that cannot report may still be running its pods well.
"""

from __future__ import annotations

from typing import overload

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from scheduler_extender.domain import QosClass
from scheduler_extender.policy.base import ArgsModel, Duration, Section

FloatArray = npt.NDArray[np.float64]

_DEFAULT_FAIL_OPEN = {
    QosClass.REALTIME: False,
    QosClass.TRAINING: False,
    QosClass.INFERENCE: True,
    QosClass.BEST_EFFORT: True,
}


class StaleArgs(ArgsModel):
    """``spec.staleTelemetry`` (ours)."""

    after_s: Duration | None = Field(
        None,
        alias="after",
        description="Age after which a node's telemetry is stale; unset = 3 × its interval_s.",
    )
    interval_multiple: float = Field(
        3.0, alias="intervalMultiple", gt=0, description="staleAfter = this × interval_s."
    )
    fail_open: dict[QosClass, bool] = Field(
        default_factory=lambda: dict(_DEFAULT_FAIL_OPEN),
        alias="failOpen",
        description="Per class: True = a stale or silent node still passes (scored lowest).",
    )

    @model_validator(mode="before")
    @classmethod
    def _class_names(cls, data: object) -> object:
        if isinstance(data, dict) and isinstance(data.get("failOpen"), dict):
            given = {
                QosClass.from_wire(k) if isinstance(k, str) else k: v
                for k, v in data["failOpen"].items()
            }
            data = {**data, "failOpen": {**_DEFAULT_FAIL_OPEN, **given}}
        return data

    @overload
    def stale_after_s(self, interval_s: float) -> float: ...
    @overload
    def stale_after_s(self, interval_s: FloatArray) -> FloatArray | float: ...
    def stale_after_s(self, interval_s: float | FloatArray) -> float | FloatArray:
        """Age in seconds past which telemetry reported every ``interval_s`` is stale.

        Takes one interval or an array of them (one per node).
        """
        return self.after_s if self.after_s is not None else self.interval_multiple * interval_s


SECTION = Section(
    "staleTelemetry",
    StaleArgs,
    "When a node's telemetry is too old, and which classes still pass it.",
)
