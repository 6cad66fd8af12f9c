"""Decoding a telemetry push on the extender's hot path.

``schema.TelemetryReport`` (pydantic) is the contract: the agent builds it, the OpenAPI page
shows it, and it lists every problem of a refused report. Validating a push with it costs about
35 µs (4 µs a GPU), a third of what a push costs us in all; the msgspec structs below take the
same JSON with the same fields, defaults and limits in a few µs. A refused report is validated
once more by the pydantic model, only to locate every problem for the agent's log.
``tests/extender/test_telemetry_decode.py`` holds the two definitions to each other.

The store keeps the latest report of every node, so a report lives about one push interval,
long enough to be walked by the cyclic garbage collector: with lists and GC-tracked structs,
5,000 nodes pushing every second kept some 50,000 young objects alive, and each collection that
walked them stopped the event loop for 6-20 ms. These structs hold no references that could
form a cycle, so they are not tracked (``gc=False``), and their sequences are tuples (a tuple
of untracked items leaves the collector's lists after its first collection; an empty one is
shared). JSON is the same either way.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from pydantic import ValidationError

from scheduler_extender.telemetry import schema

_REASON = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z0-9_.:/-]+$")]
_NonNegInt = Annotated[int, msgspec.Meta(ge=0)]


_Ratio = Annotated[float, msgspec.Meta(ge=0, le=1)]
_Celsius = Annotated[float, msgspec.Meta(ge=-60, le=200)]
_Watts = Annotated[float, msgspec.Meta(ge=0, le=10_000)]
_Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]
_MiB = Annotated[float, msgspec.Meta(ge=0, le=16_777_216)]
_MHz = Annotated[float, msgspec.Meta(ge=0, le=100_000)]


class AgentInfo(msgspec.Struct, frozen=True, gc=False):
    """Who sent the report."""

    version: Annotated[str, msgspec.Meta(max_length=64)]
    backend: Annotated[str, msgspec.Meta(min_length=1, max_length=32)]
    boot_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    seq: _NonNegInt


class NodeHealth(msgspec.Struct, frozen=True, gc=False):
    """Node-level health."""

    driver_ok: bool | None = None
    device_nodes_ok: bool | None = None
    device_plugin_ok: bool | None = None
    cuda_ctx_success_ratio: _Ratio | None = None


class GpuProcess(msgspec.Struct, frozen=True, gc=False):
    """A process holding GPU memory."""

    pid: _NonNegInt
    pod_uid: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    container: Annotated[str, msgspec.Meta(max_length=253)] | None = None
    used_mib: Annotated[float, msgspec.Meta(ge=0)] | None = None


class GpuReport(msgspec.Struct, frozen=True, gc=False):
    """One GPU at one moment."""

    index: Annotated[int, msgspec.Meta(ge=0, lt=schema.MAX_GPUS_PER_NODE)]
    uuid: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    model: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    temperature_c: _Celsius | None = None
    power_w: _Watts | None = None
    power_limit_w: _Watts | None = None
    utilization_pct: _Percent | None = None
    memory_total_mib: _MiB | None = None
    memory_used_mib: _MiB | None = None
    sm_clock_mhz: _MHz | None = None
    sm_clock_max_mhz: _MHz | None = None
    throttle_reasons: Annotated[tuple[_REASON, ...], msgspec.Meta(max_length=64)] = ()
    ecc_uncorrected: _NonNegInt | None = None
    xid_last: _NonNegInt | None = None
    health: Literal["healthy", "degraded", "unhealthy"] = "healthy"
    health_reasons: Annotated[tuple[_REASON, ...], msgspec.Meta(max_length=64)] = ()
    processes: Annotated[
        tuple[GpuProcess, ...], msgspec.Meta(max_length=schema.MAX_PROCESSES_PER_GPU)
    ] = ()


class TelemetryReport(msgspec.Struct, frozen=True, gc=False):
    """One push from one node agent: every GPU of the node."""

    schema_: Literal["edgegpu.io/telemetry/v1"] = msgspec.field(name="schema")
    node: Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
    agent: AgentInfo
    sampled_at: datetime
    interval_s: Annotated[float, msgspec.Meta(gt=0, le=3600)]
    gpus: Annotated[tuple[GpuReport, ...], msgspec.Meta(max_length=schema.MAX_GPUS_PER_NODE)]
    labels: Annotated[
        dict[
            Annotated[str, msgspec.Meta(max_length=317)],
            Annotated[str, msgspec.Meta(max_length=63)],
        ],
        msgspec.Meta(max_length=64),
    ] = {}
    node_health: NodeHealth = msgspec.field(default_factory=NodeHealth)

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for gpu in self.gpus:
            if gpu.index in seen:
                raise ValueError(f"gpu index {gpu.index} appears twice")
            seen.add(gpu.index)


_DECODER = msgspec.json.Decoder(TelemetryReport)


class ReportError(Exception):
    """A push that is not a valid report; ``problems`` locate what is wrong."""

    def __init__(self, problems: list[dict[str, str]], total: int | None = None) -> None:
        total = len(problems) if total is None else total
        super().__init__(f"invalid telemetry report ({total} problems)")
        self.problems = problems


def decode_report(body: bytes, max_problems: int = 20) -> TelemetryReport:
    """The report in a push body; ReportError with every located problem when it is invalid."""
    try:
        return _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        first = str(exc)
    except msgspec.DecodeError as exc:
        first = f"body is not valid JSON: {exc}"
    try:
        schema.TelemetryReport.model_validate_json(body)
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
