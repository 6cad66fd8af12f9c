"""The extender's answer to a push (DESIGN.md §3), declared once for the extender and the agent.

``PushAnswer`` is the answer as the contract says it: every field optional, a null says
nothing, a field the reader does not know is skipped (a newer extender). The extender builds it
and sends ``model_dump(mode="json", exclude_none=True)``; the agent reads it field by field
(``node_agent.uplink.answer``). Imports only pydantic, the standard library and ``domain``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StringConstraints,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass

from scheduler_extender.domain import MAX_BLOCK_MIB, MIN_BLOCK_MIB

POLICY_RANGES: dict[str, tuple[float, float]] = {
    "max_temp_c": (1.0, 150.0),
    "cool_down_s": (0.0, 86_400.0),
    "power_saving_threshold_pct": (0.0, 100.0),
    "memory_block_mib": (float(MIN_BLOCK_MIB), float(MAX_BLOCK_MIB)),
}
"""The range each number of an answer's ``policy`` must be in (closed; ``memory_block_mib`` a
whole number too)."""
MAX_TEMP_RANGE_C = POLICY_RANGES["max_temp_c"]
"""The range of the answer's top-level ``max_temp_c``, as its policy's."""
MAX_LENT_BLOCKS = 1024
"""Blocks one GPU may lend at most, as the agent reads an answer (a bad one costs nothing)."""
MAX_GPU_INDEX = 1023
"""The highest GPU index ``performance_gpus`` may name."""
GPU_UUID_PATTERN = r"[^\x00-\x1f\x7f]{1,128}"
"""A GPU uuid as the extender names it: no control characters, at most 128 characters."""


def _within(key: str) -> dict[str, Any]:
    """The bounds of ``POLICY_RANGES[key]`` as a finite number's constraints."""
    low, high = POLICY_RANGES[key]
    return {"ge": low, "le": high, "allow_inf_nan": False}


MaxTempC = Annotated[float, Strict(), Field(**_within("max_temp_c"))]
"""A finite JSON number (not a boolean) within its range, read as a float; so are the next."""
CoolDownS = Annotated[float, Strict(), Field(**_within("cool_down_s"))]
ThresholdPct = Annotated[float, Strict(), Field(**_within("power_saving_threshold_pct"))]
BlockMib = Annotated[float, Strict(), Field(multiple_of=1.0, **_within("memory_block_mib"))]
GpuIndex = Annotated[int, Strict(), Field(ge=0, le=MAX_GPU_INDEX)]
GpuUuid = Annotated[str, Strict(), StringConstraints(pattern=f"^{GPU_UUID_PATTERN}$")]
LentBlocks = Annotated[int, Strict(), Field(gt=0, le=MAX_LENT_BLOCKS)]
RequestId = Annotated[str, Strict(), StringConstraints(pattern=r"^[\x21-\x7e]{1,64}$")]
"""Printable ASCII with no space: it is written into the reboot sentinel."""
BootId = Annotated[str, Strict(), StringConstraints(pattern=r"^[\x21-\x7e]{1,128}$")]
ValidationLevel = Annotated[int, Strict(), Field(ge=1, le=3)]
STEP_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
"""A maintenance step's name: a DNS label, looked up in the agent's own allow-list."""
StepName = Annotated[str, Strict(), StringConstraints(pattern=STEP_PATTERN)]


@dataclass(frozen=True)
class Ask:
    """One request of the extender's fault loop (``self_test`` or ``reboot``).

    On the wire a plain id, or ``{"id": …, "boot": …}`` (``boot`` optional). An id or boot that
    is not printable ASCII without spaces, or too long, makes the whole request invalid (never
    cut short to something it did not say).
    """

    id: RequestId
    boot: BootId | None = None
    """The boot the decision was made for (the host's boot id, else the agent's); None when
    the answer does not say (a self-test; a reboot ask naming no boot is refused)."""
    level: ValidationLevel | None = None
    """A self-test's depth: 1 quick (the fault loop's), 2 medium, 3 long (a maintenance's
    validation may ask for more); None: 1."""

    @model_validator(mode="before")
    @classmethod
    def _plain_id(cls, doc: object) -> object:
        return {"id": doc} if isinstance(doc, str) else doc


@dataclass(frozen=True)
class StepAsk:
    """A GPU maintenance's request: run this step of the agent's allow-list, once per id."""

    id: RequestId
    step: StepName


class AnswerPolicy(BaseModel):
    """The policy in force for the agent's local protection, as the extender answers it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    max_temp_c: MaxTempC | None = None
    cool_down_s: CoolDownS | None = None
    power_saving: StrictBool | None = None
    power_saving_threshold_pct: ThresholdPct | None = None
    memory_block_mib: BlockMib | None = None

    def said(self) -> dict[str, float | bool]:
        """The fields the answer gave, by name."""
        return self.model_dump(exclude_none=True)


class PushAnswer(BaseModel):
    """The extender's answer to one push: its channel to an agent that has no inbound port."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    accepted: StrictBool = True
    """False: the report was not newer than one held under its boot id, and was ignored."""
    performance_gpus: frozenset[GpuIndex] = frozenset()
    """GPUs that hold high-QoS pods (restore full clocks)."""
    max_temp_c: MaxTempC | None = None
    """The extender's maxTemp (what counts as hot). ``policy.max_temp_c`` says the same; agents
    before ``policy`` read only this one."""
    policy: AnswerPolicy | None = None
    lend_blocks: dict[GpuUuid, LentBlocks] = Field(default_factory=dict)
    """Idle blocks each GPU lends to best-effort pods, by GPU uuid."""
    self_test: Ask | None = None
    reboot: Ask | None = None
    maintenance: StepAsk | None = None
    """A GPU maintenance's step to run (a name in the agent's allow-list, never a command)."""
    reason: str | None = None
    """Why the report was not accepted, for a person reading the answer (agents act on none)."""

    @model_validator(mode="before")
    @classmethod
    def _null_says_nothing(cls, doc: object) -> object:
        if isinstance(doc, dict):
            return {key: value for key, value in doc.items() if value is not None}
        return doc

    @field_validator("reason", mode="before")
    @classmethod
    def _reason_is_text(cls, value: object) -> object:
        return value if isinstance(value, str) else None  # anything else says nothing

    @field_serializer("performance_gpus")
    def _in_order(self, gpus: frozenset[int]) -> list[int]:
        return sorted(gpus)

    @property
    def asks(self) -> dict[str, Ask]:
        """The fault loop's requests: ``self_test`` / ``reboot`` → the ask."""
        asks = {"self_test": self.self_test, "reboot": self.reboot}
        return {kind: ask for kind, ask in asks.items() if ask is not None}
