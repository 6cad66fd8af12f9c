"""Decoding a telemetry push, with the contract's list of problems when it is refused.

The hot path decodes with the msgspec structs of ``report`` (a few µs); a
refused report is validated once more by the contract's pydantic model
(``schema.TelemetryReport``), only to locate every problem for the agent's log.
"""

from __future__ import annotations

from typing import Any

import msgspec
from pydantic import ValidationError

from scheduler_extender.telemetry import schema
from scheduler_extender.telemetry.report import (
    AgentInfo,
    GpuProcess,
    GpuReport,
    NodeHealth,
    PodHolder,
    StepResult,
    TelemetryReport,
    decode_push,
)

__all__ = [
    "AgentInfo",
    "GpuProcess",
    "GpuReport",
    "NodeHealth",
    "PodHolder",
    "ReportError",
    "StepResult",
    "TelemetryReport",
    "decode_report",
    "report_from",
]


class ReportError(Exception):
    """A push that is not a valid report; ``problems`` locate what is wrong."""

    def __init__(self, problems: list[dict[str, str]], total: int | None = None) -> None:
        total = len(problems) if total is None else total
        super().__init__(f"invalid telemetry report ({total} problems)")
        self.problems = problems


def decode_report(body: bytes, max_problems: int = 20) -> TelemetryReport:
    """The report in a push body; ReportError with every located problem when it is invalid."""
    try:
        return decode_push(body)
    except msgspec.ValidationError as exc:
        first = str(exc)
    except msgspec.DecodeError as exc:
        first = f"body is not valid JSON: {exc}"
    except RecursionError:
        raise ReportError([{"loc": "", "msg": "body is nested too deeply"}]) from None
    try:
        schema.TelemetryReport.model_validate_json(body)
    except RecursionError:
        raise ReportError([{"loc": "", "msg": "body is nested too deeply"}]) from None
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        raise ReportError(
            [
                {"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"]}
                for e in errors[:max_problems]
            ],
            total=len(errors),
        ) from None
    # The contract's model is laxer on a few spellings (a number in a string): say what the
    # strict decoder found.
    raise ReportError([{"loc": "", "msg": first}])


def report_from(doc: dict[str, Any]) -> TelemetryReport:
    """A report from an already parsed document (tests, tools); ReportError when invalid."""
    return decode_report(msgspec.json.encode(doc))
