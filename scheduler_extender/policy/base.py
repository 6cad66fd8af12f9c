"""Shared pieces of the rules: score range, spec sections, score terms, verdict reasons, durations.

Imports only numpy, pydantic, the standard library, ``domain`` and ``policy.batch``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
)

from scheduler_extender.domain import QosClass
from scheduler_extender.policy.batch import FloatArray, NodeBatch

MAX_SCORE: Final = 10

"""kube-scheduler's MaxExtenderPriority: prioritize answers lie in 0..MAX_SCORE."""


def clip01(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``x`` clipped to [0, 1], NaN kept.

    ``np.clip`` gives the same, but its Python wrapper costs several microseconds a call, and
    the rules run on every request.
    """
    out: npt.NDArray[np.float64] = np.minimum(np.maximum(x, 0.0), 1.0)
    return out


class ArgsModel(BaseModel):
    """Config shared by every rule's Args model: camelCase keys as in the CRD, no typos."""

    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, frozen=True, validate_default=True
    )


ArgsT = TypeVar("ArgsT", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Section(Generic[ArgsT]):
    """A section of the policy's ``spec``, declared by the rule it configures.

    ``document.PolicySpec`` has one field per registered section: read from ``key``, named
    ``name``, ``args()`` where the document leaves it out, described by ``help`` in the CRD.
    A rule reads its own section as ``spec[SECTION]``.
    """

    key: str
    """The section's key in documents, camelCase as in the CRD (``thermalThrottling``)."""
    args: type[ArgsT]
    """The section's model: its fields, defaults and validation."""
    help: str
    """What the section is for (its description in the CRD)."""
    name: str = field(init=False)
    """The key in snake_case: the attribute of ``PolicySpec`` (``thermal_throttling``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", re.sub(r"(?<!^)(?=[A-Z])", "_", self.key).lower())

    def as_field(self) -> tuple[type[ArgsT], Any]:
        """The section as a pydantic field definition (type, ``FieldInfo``) of ``PolicySpec``."""
        return self.args, Field(default_factory=self.args, alias=self.key, description=self.help)


class Sections(Protocol):
    """The policy's ``spec`` as the rules see it: each rule's section by its ``Section``."""

    def __getitem__(self, section: Section[ArgsT], /) -> ArgsT: ...


@dataclass(frozen=True, slots=True)
class Term:
    """A score term of a rule: it names the term's weight in the policy and in explanations."""

    name: str
    """Key of the term's weight in ``spec.weights`` and ``spec.qos.weights``."""
    help: str
    """What a high value of the term means (the weight's description in the CRD)."""
    weights: Mapping[QosClass, float]
    """Default weight per QoS class (0 = the class ignores the term)."""
    per_gpu: Callable[[NodeBatch, Sections], FloatArray] | None = None
    """The term (N, G) in 0..1 from each GPU's own readings, whatever the pod asks. None for
    memoryFit and topology, which depend on the pod: ``verdict`` works out memoryFit and
    ``combine`` topology."""


def class_weights(
    realtime: float, training: float, inference: float, best_effort: float
) -> Mapping[QosClass, float]:
    """A term's default weights, one per QoS class."""
    return {
        QosClass.REALTIME: realtime,
        QosClass.TRAINING: training,
        QosClass.INFERENCE: inference,
        QosClass.BEST_EFFORT: best_effort,
    }


class Reason(enum.IntEnum):
    """Why a node failed the filter. The text is short, stable and has no node name in it."""

    OK = 0
    TELEMETRY_MISSING = 1
    TELEMETRY_STALE = 2
    NO_GPU = 3
    DRIVER_NOT_OK = 4
    ALL_UNHEALTHY = 5
    REQUEST_EXCEEDS_GPU = 6
    TOO_FEW_GPUS = 7
    GPU_HOT = 8
    GPU_COOLING_DOWN = 9
    NO_FREE_BLOCKS = 10
    NO_FREE_GPUS = 11
    ROOM_ONLY_ON_UNHEALTHY_GPU = 12

    @property
    def text(self) -> str:
        """The message put in FailedNodes / FailedAndUnresolvableNodes."""
        return _TEXT[self]

    @property
    def resolvable(self) -> bool:
        """Whether evicting pods (preemption) or waiting could make the node fit."""
        return self in _RESOLVABLE


_TEXT: Final = {
    Reason.OK: "",
    Reason.TELEMETRY_MISSING: "edgegpu: no gpu telemetry from node",
    Reason.TELEMETRY_STALE: "edgegpu: gpu telemetry is stale",
    Reason.NO_GPU: "edgegpu: node has no gpu",
    Reason.DRIVER_NOT_OK: "edgegpu: gpu driver not ok",
    Reason.ALL_UNHEALTHY: "edgegpu: every gpu is unhealthy",
    Reason.REQUEST_EXCEEDS_GPU: "edgegpu: gpu-mem-block request exceeds every gpu",
    Reason.TOO_FEW_GPUS: "edgegpu: node has fewer usable gpus than requested",
    Reason.GPU_HOT: "edgegpu: gpu too hot",
    Reason.GPU_COOLING_DOWN: "edgegpu: gpu cooling down",
    Reason.NO_FREE_BLOCKS: "edgegpu: not enough free gpu-mem-blocks on one gpu",
    Reason.NO_FREE_GPUS: "edgegpu: not enough free whole gpus",
    Reason.ROOM_ONLY_ON_UNHEALTHY_GPU: "edgegpu: the gpu with room is unhealthy",
}

# Hot and cooling GPUs will cool; whole GPUs held by pods can be freed by preemption. Missing
# or stale telemetry, absent hardware and unhealthy GPUs cannot be fixed by evicting pods. Nor,
# for kube-scheduler, can a node with blocks enough but not on one GPU: it counts blocks per
# node, so its preemption dry run finds no victim there, and a resolvable verdict only makes it
# retry at once, again and again. The pod waits for room instead. (A node short of blocks as a
# whole fails kube-scheduler's own resource check, and its preemption frees blocks there.)
_RESOLVABLE: Final = frozenset({Reason.GPU_HOT, Reason.GPU_COOLING_DOWN, Reason.NO_FREE_GPUS})

REASON_TEXT: Final = np.array([_TEXT[r] for r in Reason], dtype=object)
"""Reason text by code, for turning a whole array of codes into messages at once."""
REASON_JSON: Final = np.array([b'"' + _TEXT[r].encode() + b'"' for r in Reason], dtype=object)
"""Reason text by code as JSON string bytes (the texts need no escaping)."""
REASON_RESOLVABLE: Final = np.array([r in _RESOLVABLE for r in Reason], dtype=np.bool_)
"""Whether each reason code belongs in FailedNodes (True) or FailedAndUnresolvableNodes."""

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration_s(value: Any) -> float:
    """Read a Go-style duration (``"5m"``, ``"1h30m"``, ``"90s"``) or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a string such as '5m' or a number of seconds")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        pos, seconds = 0, 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_S[match.group(2)]
            pos = match.end()
        if not text or pos != len(text):
            raise ValueError(f"{value!r} is not a duration (examples: '30s', '5m', '1h30m')")
    else:
        raise ValueError("a duration is a string such as '5m' or a number of seconds")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def format_duration(seconds: float) -> str:
    """Write seconds back as a Go-style duration (``300.0`` → ``"5m"``)."""
    if seconds == 0:
        return "0s"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    out = ""
    if hours:
        out += f"{int(hours)}h"
    if minutes:
        out += f"{int(minutes)}m"
    if secs:
        out += f"{secs:g}s"
    return out


Duration = Annotated[
    float,
    BeforeValidator(parse_duration_s),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema({"x-kubernetes-int-or-string": True}),
]
"""Seconds in memory; a Go-style duration string (or whole seconds) in documents."""
