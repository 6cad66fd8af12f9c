"""QoS rule: which class a pod is in, and how much each score term weighs for that class.

Pure; imports only pydantic, ``domain`` and ``policy.base``.
"""

from __future__ import annotations

from typing import Final

from pydantic import Field, model_validator

from scheduler_extender.domain import QosClass
from scheduler_extender.policy.base import ArgsModel

TERMS: Final = ("thermal", "power", "memoryFit", "powerSaving", "health", "topology")
"""Every score term, in the order /debug/explain lists them."""


class TermWeights(ArgsModel):
    """Relative weight of each score term (0 switches a term off)."""

    thermal: float = Field(1.0, ge=0, description="Temperature headroom of the chosen GPU.")
    power: float = Field(1.0, ge=0, description="Power headroom (limit − draw) of the chosen GPU.")
    memory_fit: float = Field(
        1.0, alias="memoryFit", ge=0, description="Best fit (packing classes) or most room left."
    )
    power_saving: float = Field(
        1.0, alias="powerSaving", ge=0, description="Prefer already-active GPUs (packing classes)."
    )
    health: float = Field(1.0, ge=0, description="Prefer healthy over degraded GPUs.")
    topology: float = Field(1.0, ge=0, description="Keep a job group in one rack, prefer RDMA.")

    def as_tuple(self) -> tuple[float, ...]:
        """Weights in ``TERMS`` order."""
        return (
            self.thermal,
            self.power,
            self.memory_fit,
            self.power_saving,
            self.health,
            self.topology,
        )


def _weights(**kw: float) -> TermWeights:
    return TermWeights.model_validate(kw)


# Training and realtime want cool GPUs with power headroom and room to themselves; inference and
# best-effort pack onto busy GPUs (best fit) so that whole GPUs stay free and idle ones stay idle.
DEFAULT_CLASS_WEIGHTS: Final = {
    QosClass.REALTIME: _weights(
        thermal=3, power=2, memoryFit=1, powerSaving=0, health=2, topology=1
    ),
    QosClass.TRAINING: _weights(
        thermal=2, power=2, memoryFit=1, powerSaving=0, health=2, topology=3
    ),
    QosClass.INFERENCE: _weights(
        thermal=1, power=1, memoryFit=3, powerSaving=2, health=2, topology=1
    ),
    QosClass.BEST_EFFORT: _weights(
        thermal=0.5, power=0.5, memoryFit=3, powerSaving=2, health=1, topology=0.5
    ),
}


class PriorityThresholds(ArgsModel):
    """Mapping from ``spec.priority`` to a class when the pod has no ``edgegpu.io/qos``."""

    realtime: int = Field(1_000_000, description="priority ≥ this → realtime.")
    training: int = Field(10_000, description="priority ≥ this → training.")
    inference: int = Field(0, description="priority ≥ this → inference; below → best-effort.")

    @model_validator(mode="after")
    def _ordered(self) -> PriorityThresholds:
        if not self.realtime >= self.training >= self.inference:
            raise ValueError("priority thresholds must satisfy realtime ≥ training ≥ inference")
        return self


class QosArgs(ArgsModel):
    """``spec.qos`` (ours)."""

    default_class: QosClass = Field(
        QosClass.INFERENCE,
        alias="defaultClass",
        description="Class of a pod with neither the annotation nor a priority.",
    )
    priority_thresholds: PriorityThresholds = Field(
        default_factory=PriorityThresholds, alias="priorityThresholds"
    )
    weights: dict[QosClass, TermWeights] = Field(
        default_factory=dict,
        description="Per-class term weights; a class left out keeps its default weights.",
    )

    @model_validator(mode="before")
    @classmethod
    def _class_names(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        if isinstance(out.get("defaultClass"), str):
            out["defaultClass"] = QosClass.from_wire(out["defaultClass"])
        weights = out.get("weights")
        if isinstance(weights, dict):
            out["weights"] = {
                QosClass.from_wire(k) if isinstance(k, str) else k: v for k, v in weights.items()
            }
        return out

    def class_weights(self, qos: QosClass) -> TermWeights:
        """Term weights in force for one class."""
        return self.weights.get(qos, DEFAULT_CLASS_WEIGHTS[qos])


def resolve_class(annotation: str | None, priority: int | None, args: QosArgs) -> QosClass:
    """The pod's class: its ``edgegpu.io/qos`` annotation, else its priority, else the default.

    Raises ``ValueError`` for an annotation that names no class.
    """
    if annotation is not None:
        return QosClass.from_wire(annotation.strip().lower())
    if priority is None:
        return args.default_class
    t = args.priority_thresholds
    if priority >= t.realtime:
        return QosClass.REALTIME
    if priority >= t.training:
        return QosClass.TRAINING
    if priority >= t.inference:
        return QosClass.INFERENCE
    return QosClass.BEST_EFFORT
