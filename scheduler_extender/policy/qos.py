"""QoS rule: which class a pod is in, and how much each score term weighs for that class.

Pure; imports only pydantic, ``domain``, ``policy.base`` and the rules' registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from pydantic import Field, create_model, model_validator

from scheduler_extender.domain import QosClass
from scheduler_extender.policy.base import ArgsModel, Section
from scheduler_extender.policy.rules import REGISTRY, TERMS


class _Weights(ArgsModel):
    """Relative weight of each score term (0 switches a term off), keyed by the term's name."""

    def as_tuple(self) -> tuple[float, ...]:
        """Weights in ``TERMS`` order."""
        return tuple(getattr(self, name) for name in TERMS)


if TYPE_CHECKING:
    TermWeights = _Weights
else:
    TermWeights = create_model(
        "TermWeights",
        __base__=_Weights,
        **{t.name: (float, Field(1.0, ge=0, description=t.help)) for t in REGISTRY},
    )
    """One weight per term of the rules' registry (1 where not given)."""


def class_default(qos: QosClass) -> dict[str, float]:
    """A class's default weight of every term, from the terms' own defaults."""
    return {t.name: t.weights[qos] for t in REGISTRY}


DEFAULT_CLASS_WEIGHTS: Final = {
    qos: TermWeights.model_validate(class_default(qos)) for qos in QosClass
}
"""The weights of a class the policy does not mention. Training and realtime want cool GPUs
with power headroom; inference and best-effort pack onto busy GPUs (best fit) so that whole
GPUs stay free and idle ones stay idle."""


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
        description="Per-class term weights; a term or class left out keeps its default weight.",
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
            by_class = {
                QosClass.from_wire(k) if isinstance(k, str) else k: v for k, v in weights.items()
            }
            out["weights"] = {
                qos: {**class_default(qos), **given} if isinstance(given, dict) else given
                for qos, given in by_class.items()
            }
        return out

    def class_weights(self, qos: QosClass) -> TermWeights:
        """Term weights in force for one class."""
        return self.weights.get(qos, DEFAULT_CLASS_WEIGHTS[qos])


SECTION = Section("qos", QosArgs, "QoS classes of pods and each class's term weights.")
WEIGHTS = Section("weights", TermWeights, "Multipliers applied on top of every class's weights.")


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
