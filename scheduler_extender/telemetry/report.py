"""A telemetry push as the hot path reads it: the report's msgspec structs, and its digest.

``telemetry.schema.TelemetryReport`` (pydantic) is the contract: the agent builds it, the
OpenAPI page shows it, and it lists every problem of a refused report. The msgspec structs here
take the same JSON with the same fields, defaults and limits in a few µs (pydantic took about
35 µs a push); ``telemetry.decode`` adds the contract's list of problems for a refused report,
and ``tests/extender/test_telemetry_decode.py`` holds the two definitions to each other.

The store keeps the latest report of every node, so a report lives about one push interval,
long enough to be walked by the cyclic garbage collector: with lists and GC-tracked structs,
5,000 nodes pushing every second kept some 50,000 young objects alive, and each collection that
walked them stopped the event loop for 6-20 ms. These structs hold no references that could
form a cycle, so they are not tracked (``gc=False``), and their sequences are tuples (a tuple
of untracked items leaves the collector's lists after its first collection; an empty one is
shared). JSON is the same either way.

A ``Digest`` is what the extender's table and ledgers take from a report: its node, agent boot
and sequence number, labels, and one row of floats per GPU. Imports msgspec, the standard
library, numpy, ``domain``, ``fields``, the generated ``readings_msgspec`` and ``logs`` only.
"""

from __future__ import annotations

import math
import operator
import re
from datetime import datetime
from itertools import chain
from typing import Annotated, Literal, cast

import msgspec
import numpy as np

from scheduler_extender.domain import (
    MAX_BLOCKS_PER_HOLDER,
    MAX_GPUS_PER_NODE,
    MAX_HOLDERS_PER_NODE,
    MAX_PROCESSES_PER_GPU,
    NAMESPACE_PATTERN,
    POD_NAME_PATTERN,
    PRINTABLE_PATTERN,
    Health,
    duplicate_holder,
)
from scheduler_extender.logs import CONTROL_CHARACTERS
from scheduler_extender.telemetry.fields import GPU_FIELDS
from scheduler_extender.telemetry.readings_msgspec import GpuReadings

_REASON = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z0-9_.:/-]+$")]


def _text(max_length: int, min_length: int = 0) -> msgspec.Meta:
    """A name or id of the contract: text with no control character (``decode_push``)."""
    return msgspec.Meta(min_length=min_length, max_length=max_length)


_NonNegInt = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
"""A count or id: 0 to the int64 maximum (larger cannot be framed or stored as one)."""


_Ratio = Annotated[float, msgspec.Meta(ge=0, le=1)]
_Celsius = Annotated[float, msgspec.Meta(ge=-60, le=200)]


class AgentInfo(msgspec.Struct, frozen=True, gc=False):
    """Who sent the report."""

    version: Annotated[str, _text(64)]
    backend: Annotated[str, _text(32, min_length=1)]
    boot_id: Annotated[str, _text(128, min_length=1)]
    seq: _NonNegInt


class NodeHealth(msgspec.Struct, frozen=True, gc=False):
    """Node-level health."""

    driver_ok: bool | None = None
    device_nodes_ok: bool | None = None
    device_plugin_ok: bool | None = None
    dra_plugin_registered: bool | None = None
    cuda_ctx_success_ratio: _Ratio | None = None


class GpuProcess(msgspec.Struct, frozen=True, gc=False):
    """A process holding GPU memory."""

    pid: _NonNegInt
    pod_uid: Annotated[str, _text(128)] | None = None
    container: Annotated[str, _text(253)] | None = None
    used_mib: Annotated[float, msgspec.Meta(ge=0)] | None = None


class GpuReport(GpuReadings, frozen=True, gc=False):
    """One GPU at one moment.

    Its readings are the reported fields of ``fields.GPU_FIELDS``, inherited from the module
    ``make generate`` writes from that table (keyword-only: they follow the fields here).
    """

    index: Annotated[int, msgspec.Meta(ge=0, lt=MAX_GPUS_PER_NODE)]
    uuid: Annotated[str, _text(128, min_length=1)]
    model: Annotated[str, _text(128)] | None = None
    vendor: Annotated[str, _text(32)] | None = None
    driver_version: Annotated[str, _text(64)] | None = None
    vbios_version: Annotated[str, _text(64)] | None = None
    inforom_version: Annotated[str, _text(64)] | None = None
    firmware_version: Annotated[str, _text(64)] | None = None
    throttle_reasons: Annotated[tuple[_REASON, ...], msgspec.Meta(max_length=64)] = ()
    ecc_uncorrected: _NonNegInt | None = None
    xid_last: _NonNegInt | None = None
    health: Literal["healthy", "degraded", "unhealthy"] = "healthy"
    health_reasons: Annotated[tuple[_REASON, ...], msgspec.Meta(max_length=64)] = ()
    processes: Annotated[
        tuple[GpuProcess, ...], msgspec.Meta(max_length=MAX_PROCESSES_PER_GPU)
    ] = ()
    hot_s_ago: Annotated[float, msgspec.Meta(ge=0, le=10**9)] | None = None


class SelfTestResult(msgspec.Struct, frozen=True, gc=False):
    """The verdict of the self-test the extender asked for."""

    id: Annotated[str, _text(64, min_length=1)]
    verdict: Literal["pass", "fail"]
    detail: Annotated[str, msgspec.Meta(max_length=1024)] = ""


class StepResult(msgspec.Struct, frozen=True, gc=False):
    """The result of the maintenance step the extender asked for."""

    id: Annotated[str, _text(64, min_length=1)]
    step: Annotated[str, _text(63, min_length=1)]
    outcome: Literal["pass", "fail"]
    reboot: bool = False
    detail: Annotated[str, msgspec.Meta(max_length=1024)] = ""


class PodHolder(msgspec.Struct, frozen=True, gc=False):
    """A pod whose containers kubelet gave memory blocks of one GPU.

    The report checks its names (``_holders_problem``).
    """

    namespace: Annotated[str, msgspec.Meta(min_length=1, max_length=63)]
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
    gpu_uuid: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    blocks: Annotated[int, msgspec.Meta(ge=1, le=MAX_BLOCKS_PER_HOLDER)]


def _body(pattern: str) -> str:
    return pattern.removeprefix("^").removesuffix("$")


_HOLDER = "\x1f".join(map(_body, (NAMESPACE_PATTERN, POD_NAME_PATTERN, PRINTABLE_PATTERN)))
_HOLDERS = re.compile(f"{_HOLDER}(?:\n{_HOLDER})*")
"""Every holder's namespace, name and gpu uuid, apart by U+001F, one holder a line, in one
match: the contract's three patterns (none of which takes U+001F or a newline, so a field
cannot reach into the next), at a fraction of the cost of one pattern per field."""


def _holders_problem(holders: tuple[PodHolder, ...]) -> str | None:
    """Why a report's holders are refused (their names, each pod and GPU once); None when not."""
    keys = [f"{h.namespace}\x1f{h.name}\x1f{h.gpu_uuid}" for h in holders]
    if _HOLDERS.fullmatch("\n".join(keys)) is None:
        return "a holder's namespace, pod name or gpu uuid is not a valid one"
    if len(set(keys)) != len(keys):
        return duplicate_holder((h.namespace, h.name, h.gpu_uuid) for h in holders)
    return None


_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")
_PRINTABLE_ASCII = bytes(range(0x20, 0x7F))
_gpu_texts = operator.attrgetter(
    "uuid",
    "model",
    "vendor",
    "driver_version",
    "vbios_version",
    "inforom_version",
    "firmware_version",
)
_process_texts = operator.attrgetter("pod_uid", "container")


def _has_control_character(report: TelemetryReport) -> bool:
    """Whether a name or id of the report (every field declared ``_text``) holds one.

    All of them joined are searched once; ASCII text (the usual) by deleting its printable
    characters, which leaves nothing.
    """
    agent, test, labels, step = report.agent, report.self_test, report.labels, report.maintenance
    texts = [report.node, agent.version, agent.backend, agent.boot_id, report.host_boot_id,
             test.id if test else None, *labels, *labels.values()]  # fmt: skip
    if step is not None:
        texts += [step.id, step.step]
    texts += chain.from_iterable(map(_gpu_texts, report.gpus))
    for g in report.gpus:
        if g.processes:
            texts += chain.from_iterable(map(_process_texts, g.processes))
    text = "".join(filter(None, texts))
    if text.isascii():
        return bool(text.encode("ascii").translate(None, _PRINTABLE_ASCII))
    return _CONTROL.search(text) is not None


class TelemetryReport(msgspec.Struct, frozen=True, gc=False):
    """One push from one node agent: every GPU of the node."""

    schema_: Literal["edgegpu.io/telemetry/v1"] = msgspec.field(name="schema")
    node: Annotated[str, _text(253, min_length=1)]
    agent: AgentInfo
    sampled_at: datetime
    interval_s: Annotated[float, msgspec.Meta(gt=0, le=3600)]
    gpus: Annotated[tuple[GpuReport, ...], msgspec.Meta(max_length=MAX_GPUS_PER_NODE)]
    labels: Annotated[
        dict[Annotated[str, _text(317)], Annotated[str, _text(63)]],
        msgspec.Meta(max_length=64),
    ] = {}
    node_health: NodeHealth = msgspec.field(default_factory=NodeHealth)
    hot_threshold_c: _Celsius | None = None
    self_test: SelfTestResult | None = None
    maintenance: StepResult | None = None
    host_boot_id: Annotated[str, _text(64)] | None = None
    holders: (
        Annotated[tuple[PodHolder, ...], msgspec.Meta(max_length=MAX_HOLDERS_PER_NODE)] | None
    ) = None

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for gpu in self.gpus:
            if gpu.index in seen:
                raise ValueError(f"gpu index {gpu.index} appears twice")
            seen.add(gpu.index)
        if self.holders:
            problem = _holders_problem(self.holders)
            if problem is not None:
                raise ValueError(problem)


REPORT_DECODER = msgspec.json.Decoder(TelemetryReport)
"""Decodes a push body and checks every limit but the text rule (``decode_push`` adds it)."""


def decode_push(body: bytes) -> TelemetryReport:
    """The report in a push body (``msgspec.ValidationError`` / ``DecodeError`` when invalid).

    A JSON string cannot hold a raw C0 character: a body of ASCII with no escape and no DEL
    holds no control character anywhere, and only another body has its names searched.
    """
    report = REPORT_DECODER.decode(body)
    if body.isascii() and b"\\" not in body and b"\x7f" not in body:
        return report
    if _has_control_character(report):
        raise msgspec.ValidationError("a name or id holds a control character")
    return report


_PLAIN = tuple(f.name for f in GPU_FIELDS if f.kept and f.derive is None)
_DERIVED = tuple(f for f in GPU_FIELDS if f.kept and f.derive is not None)
DIGEST_COLUMNS = ("index", *_PLAIN, "memory_used_mib", *(f.name for f in _DERIVED), "health")
"""A digest's floats per GPU, in this order: the kept fields of ``fields`` and the memory in
use (a field the backend cannot read is NaN), then ``domain.Health``'s value."""

_HEALTH = {h.name.lower(): float(h) for h in Health}
_read_plain = operator.attrgetter("index", *_PLAIN, "memory_used_mib")
_read_derived = tuple(f.derive for f in _DERIVED if f.derive is not None)
_NAN = math.nan


class Digest(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """What the extender stores of one report (``digest``)."""

    node: str
    boot_id: str
    seq: int
    interval_s: float
    driver_ok: bool
    """Neither the driver nor the device nodes reported broken."""
    labels: dict[str, str]
    uuids: tuple[str, ...]
    """The GPUs' UUIDs, in report order."""
    gpus: bytes
    """float64 values, one row of ``DIGEST_COLUMNS`` per GPU, in report order."""
    pods: tuple[tuple[int, str, float], ...] = ()
    """(GPU index, pod UID, MiB used or 0) of each process that names its pod."""

    def column(self, name: str) -> list[float]:
        """One of ``DIGEST_COLUMNS`` for every GPU, in report order."""
        width = len(DIGEST_COLUMNS)
        view = memoryview(self.gpus).cast("d")[DIGEST_COLUMNS.index(name) :: width]
        return cast(list[float], view.tolist())


def _value(v: float | None) -> float:
    return _NAN if v is None else v


def digest(report: TelemetryReport) -> Digest:
    """The digest of a report."""
    gpus = report.gpus
    rows = np.empty((len(gpus), len(DIGEST_COLUMNS)))
    plain = len(_PLAIN) + 2
    if gpus:
        # The fields read as they are in one go (numpy makes None NaN), then the derived ones.
        rows[:, :plain] = np.array([_read_plain(g) for g in gpus], dtype=np.float64)
        for k, derive in enumerate(_read_derived, start=plain):
            rows[:, k] = [_value(derive(g)) for g in gpus]
        rows[:, -1] = [_HEALTH[g.health] for g in gpus]
    pods = [(g.index, p.pod_uid, p.used_mib or 0.0) for g in gpus for p in g.processes if p.pod_uid]
    health = report.node_health
    return Digest(
        node=report.node,
        boot_id=report.agent.boot_id,
        seq=report.agent.seq,
        interval_s=report.interval_s,
        driver_ok=health.driver_ok is not False and health.device_nodes_ok is not False,
        labels=report.labels,
        uuids=tuple(g.uuid for g in report.gpus),
        gpus=rows.tobytes(),
        pods=tuple(pods),
    )
