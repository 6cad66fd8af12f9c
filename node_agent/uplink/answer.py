"""The agent's reading of the extender's answer to a push (DESIGN.md §3).

The answer is declared once, in ``scheduler_extender.telemetry.answer`` (``PushAnswer``), for the
extender that builds it and the agent that reads it. The model is strict; ``read_answer`` reads
an answer field by field, so that one bad field costs that field only. Imports pydantic, the
standard library and the shared answer model.
"""

from __future__ import annotations

import json
from typing import Any, Final

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from scheduler_extender.telemetry.answer import GPU_UUID_PATTERN, Ask, PushAnswer, StepAsk

__all__ = ["GPU_UUID_PATTERN", "Ask", "PushAnswer", "StepAsk", "read_answer"]

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
