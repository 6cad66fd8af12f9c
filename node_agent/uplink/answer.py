"""The extender's answer to a push (DESIGN.md §3), declared once, and the agent's reading of it.

``PushAnswer`` is the answer as the contract says it: every field optional, a null says
nothing, a field the agent does not know is skipped (a newer extender). The model is strict;
``read_answer`` reads an answer field by field, so that one bad field costs that field only.
Imports pydantic, the standard library and ``model``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Final

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic_core import ErrorDetails

from node_agent.model import MAX_BLOCK_MIB, MIN_BLOCK_MIB

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

    @model_validator(mode="before")
    @classmethod
    def _plain_id(cls, doc: object) -> object:
        return {"id": doc} if isinstance(doc, str) else doc


class AnswerPolicy(BaseModel):
    """The policy in force for the agent's local protection, as the extender answers it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    max_temp_c: MaxTempC | None = None
    cool_down_s: CoolDownS | None = None
    power_saving_threshold_pct: ThresholdPct | None = None
    memory_block_mib: BlockMib | None = None
    power_saving: StrictBool | None = None

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
    """The extender's maxTemp (what counts as hot)."""
    policy: AnswerPolicy | None = None
    lend_blocks: dict[GpuUuid, LentBlocks] = Field(default_factory=dict)
    """Idle blocks each GPU lends to best-effort pods, by GPU uuid."""
    self_test: Ask | None = None
    reboot: Ask | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_says_nothing(cls, doc: object) -> object:
        if isinstance(doc, dict):
            return {key: value for key, value in doc.items() if value is not None}
        return doc

    @property
    def asks(self) -> dict[str, Ask]:
        """The fault loop's requests: ``self_test`` / ``reboot`` → the ask."""
        asks = {"self_test": self.self_test, "reboot": self.reboot}
        return {kind: ask for kind, ask in asks.items() if ask is not None}


_BY_ENTRY: Final = {"performance_gpus": False, "lend_blocks": False, "policy": True}
"""The fields read entry by entry: a bad entry is left out and the others kept. True: each bad
entry is named on its own (``policy.max_temp_c``); False: the field is named once."""
_LEFT_OUT: Final = object()


def read_answer(body: bytes) -> tuple[PushAnswer, tuple[str, ...]]:
    """An extender's push answer, every field checked on its own, and the fields ignored.

    Never raises. A field of the wrong type or out of its range is ignored and named; a list
    or mapping keeps its valid entries (``_BY_ENTRY``). A body that is not a JSON object says
    nothing but is named (``answer``).
    """
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return PushAnswer(), ("answer",)
    if not isinstance(doc, dict):
        return PushAnswer(), ("answer",)
    ignored: dict[str, None] = {}
    for _ in range(3):  # a second reading takes what is left; a third is a safeguard
        try:
            return PushAnswer.model_validate(doc), tuple(ignored)
        except ValidationError as exc:
            doc = _without(doc, exc.errors(include_url=False, include_input=False), ignored)
    return PushAnswer(), (*ignored, "answer")


def _without(
    doc: dict[str, Any], errors: list[ErrorDetails], ignored: dict[str, None]
) -> dict[str, Any]:
    """``doc`` less what each error names, each named in ``ignored``.

    The entry, where the field is read entry by entry and the entry can be found; else the
    whole field.
    """
    out = dict(doc)
    left_out: set[tuple[str, str | int]] = set()  # a key and its value may both be wrong
    for error in errors:
        loc, *rest = error["loc"]
        field = name = str(loc)  # a top-level key: the answer is an object
        entry = (field, rest[0]) if rest else None
        if (
            field in _BY_ENTRY
            and entry is not None
            and (entry in left_out or _leave_out(out.get(field), entry[1]))
        ):
            left_out.add(entry)
            name = f"{field}.{entry[1]}" if _BY_ENTRY[field] else name
        else:
            out.pop(field, None)
        ignored[name] = None
    for field in _BY_ENTRY:
        if isinstance(out.get(field), list):
            out[field] = [entry for entry in out[field] if entry is not _LEFT_OUT]
    return out


def _leave_out(entries: object, key: object) -> bool:
    """Leave entry ``key`` out of a list or mapping; False when it is not found there."""
    if isinstance(entries, dict) and key in entries:
        del entries[key]
        return True
    if isinstance(entries, dict) and isinstance(key, str) and "\ufffd" in key:
        # pydantic names a key that is not Unicode text (a lone surrogate) by its repair
        for k in [k for k in entries if isinstance(k, str) and not _is_text(k)]:
            del entries[k]
        return True
    if isinstance(entries, list) and isinstance(key, int) and 0 <= key < len(entries):
        entries[key] = _LEFT_OUT
        return True
    return False


def _is_text(value: str) -> bool:
    """Whether ``value`` is Unicode text (JSON may escape a lone surrogate into a string)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
