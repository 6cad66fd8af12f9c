"""The telemetry push contract ``edgegpu.io/telemetry/v1`` (DESIGN.md §3).

Imported by both packages: it imports pydantic, the standard library, ``domain``, ``logs`` and
the generated ``readings`` only, so that the node agent never loads the extender's web stack.
Units are in the field names; a field the backend cannot read is ``None``, never a made-up
number. Every name and id a report carries is text: a control character in one
(``logs.CONTROL_CHARACTERS``) refuses the report.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from scheduler_extender.domain import (
    MAX_BLOCKS_PER_HOLDER,
    MAX_GPUS_PER_NODE,
    MAX_HOLDERS_PER_NODE,
    MAX_PROCESSES_PER_GPU,
    NAMESPACE_PATTERN,
    POD_NAME_PATTERN,
    PRINTABLE_PATTERN,
    duplicate_holder,
)
from scheduler_extender.logs import CONTROL_CHARACTERS
from scheduler_extender.telemetry.readings import GpuReadings

SCHEMA = "edgegpu.io/telemetry/v1"


HealthValue = Literal["healthy", "degraded", "unhealthy"]
ReasonCode = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9_.:/-]+$")]
TEXT_PATTERN = f"^[^{CONTROL_CHARACTERS}]*$"
"""Text with no control character (pydantic's engine: ``$`` is the end of the text only)."""
Name = Annotated[str, Field(min_length=1, max_length=253, pattern=TEXT_PATTERN)]
Labels = dict[
    Annotated[str, Field(max_length=317, pattern=TEXT_PATTERN)],
    Annotated[str, Field(max_length=63, pattern=TEXT_PATTERN)],
]
"""Node labels as a report carries them (and as the agent's ``--labels`` are checked)."""


class _Model(BaseModel):
    # Unknown fields are ignored so that a newer agent can talk to an older extender.
    model_config = ConfigDict(extra="ignore", frozen=True)


class AgentInfo(_Model):
    """Who sent the report; ``seq`` grows by one per report within one ``boot_id``."""

    version: Annotated[str, Field(max_length=64, pattern=TEXT_PATTERN)]
    backend: Annotated[str, Field(min_length=1, max_length=32, pattern=TEXT_PATTERN)]
    boot_id: Annotated[str, Field(min_length=1, max_length=128, pattern=TEXT_PATTERN)]
    seq: Annotated[int, Field(ge=0, le=2**63 - 1)]


class NodeHealth(_Model):
    """Node-level and pod-level health (seed §4.1): driver, device nodes, CUDA context probe."""

    driver_ok: bool | None = None
    device_nodes_ok: bool | None = None
    device_plugin_ok: bool | None = None
    dra_plugin_registered: bool | None = None
    cuda_ctx_success_ratio: Annotated[float, Field(ge=0, le=1)] | None = None


class GpuProcess(_Model):
    """A process holding GPU memory; ``pod_uid`` when the agent could map it to a pod."""

    pid: Annotated[int, Field(ge=0, le=2**63 - 1)]
    pod_uid: Annotated[str, Field(max_length=128, pattern=TEXT_PATTERN)] | None = None
    container: Annotated[str, Field(max_length=253, pattern=TEXT_PATTERN)] | None = None
    used_mib: Annotated[float, Field(ge=0)] | None = None


# The readings are the reported fields of ``fields.GPU_FIELDS``, inherited from the module
# ``make generate`` writes from that table. The docstring is the OpenAPI page's description of
# a GPU.
class GpuReport(_Model, GpuReadings):
    """One GPU at one moment."""

    index: Annotated[int, Field(ge=0, lt=MAX_GPUS_PER_NODE)]
    uuid: Annotated[str, Field(min_length=1, max_length=128, pattern=TEXT_PATTERN)]
    model: Annotated[str, Field(max_length=128, pattern=TEXT_PATTERN)] | None = None
    """As the driver names it (``Tesla T4``); any unicode but control characters."""
    vendor: Annotated[str, Field(max_length=32, pattern=TEXT_PATTERN)] | None = None
    """``nvidia``, ``amd`` or ``intel``."""
    driver_version: Annotated[str, Field(max_length=64, pattern=TEXT_PATTERN)] | None = None
    """The driver the GPU runs under (``570.86.15``); what a maintenance upgrades."""
    vbios_version: Annotated[str, Field(max_length=64, pattern=TEXT_PATTERN)] | None = None
    """The board's VBIOS (firmware) version."""
    inforom_version: Annotated[str, Field(max_length=64, pattern=TEXT_PATTERN)] | None = None
    """NVIDIA's InfoROM image version."""
    firmware_version: Annotated[str, Field(max_length=64, pattern=TEXT_PATTERN)] | None = None
    """The GPU's firmware where it has no VBIOS (Intel: its GFX firmware)."""
    throttle_reasons: Annotated[list[ReasonCode], Field(max_length=64)] = Field(
        default_factory=list
    )
    ecc_uncorrected: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    xid_last: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    health: HealthValue = "healthy"
    health_reasons: Annotated[list[ReasonCode], Field(max_length=64)] = Field(default_factory=list)
    processes: Annotated[list[GpuProcess], Field(max_length=MAX_PROCESSES_PER_GPU)] = Field(
        default_factory=list
    )
    hot_s_ago: Annotated[float, Field(ge=0, le=10**9)] | None = None
    """Seconds before this sample that the GPU last read at or above the report's
    ``hot_threshold_c`` (0: it is now); null when not since the agent started."""


class SelfTestResult(_Model):
    """The verdict of the self-test the extender asked for (``self_test.id`` of its answer)."""

    id: Annotated[str, Field(min_length=1, max_length=64, pattern=TEXT_PATTERN)]
    verdict: Literal["pass", "fail"]
    detail: Annotated[str, Field(max_length=1024)] = ""
    """Free text (a tool's output may span lines): written escaped wherever it is shown."""


class StepResult(_Model):
    """The result of the maintenance step the extender asked for (``maintenance.id``)."""

    id: Annotated[str, Field(min_length=1, max_length=64, pattern=TEXT_PATTERN)]
    step: Annotated[str, Field(min_length=1, max_length=63, pattern=TEXT_PATTERN)]
    outcome: Literal["pass", "fail"]
    reboot: bool = False
    """The step's entry in the agent's allow-list asks for a reboot after it passes."""
    detail: Annotated[str, Field(max_length=1024)] = ""


class PodHolder(_Model):
    """A pod whose containers kubelet gave memory blocks of one GPU (its PodResources API)."""

    namespace: Annotated[str, Field(min_length=1, max_length=63, pattern=NAMESPACE_PATTERN)]
    name: Annotated[str, Field(min_length=1, max_length=253, pattern=POD_NAME_PATTERN)]
    gpu_uuid: Annotated[str, Field(min_length=1, max_length=128, pattern=PRINTABLE_PATTERN)]
    blocks: Annotated[int, Field(ge=1, le=MAX_BLOCKS_PER_HOLDER)]
    """Blocks of that GPU the pod's containers hold (lent ones included)."""


class TelemetryReport(_Model):
    """One push from one node agent: every GPU of the node."""

    schema_: Literal["edgegpu.io/telemetry/v1"] = Field(alias="schema")
    node: Name
    agent: AgentInfo
    sampled_at: datetime
    interval_s: Annotated[float, Field(gt=0, le=3600)]
    labels: Labels = Field(default_factory=dict, max_length=64)
    node_health: NodeHealth = Field(default_factory=NodeHealth)
    gpus: Annotated[list[GpuReport], Field(max_length=MAX_GPUS_PER_NODE)]
    hot_threshold_c: Annotated[float, Field(ge=-60, le=200)] | None = None
    """The temperature the GPUs' ``hot_s_ago`` count from: the extender's ``maxTemp`` as its
    last answer said (a cool-down survives the extender's restart through it)."""
    self_test: SelfTestResult | None = None
    """The last self-test the extender asked for, once it has run (repeated in every report
    until the next request)."""
    maintenance: StepResult | None = None
    """The last maintenance step the extender asked for, once it has run (repeated in every
    report until the next request, and across the agent's restarts)."""
    host_boot_id: Annotated[str, Field(max_length=64, pattern=TEXT_PATTERN)] | None = None
    """The host's boot id (``/proc/sys/kernel/random/boot_id``): a new one means the node
    rebooted, where a new ``agent.boot_id`` means only that the agent restarted."""
    holders: Annotated[list[PodHolder], Field(max_length=MAX_HOLDERS_PER_NODE)] | None = None
    """Which pods hold which GPU's memory blocks, as kubelet says; null when not known (no
    device plugin, kubelet's PodResources API out of reach, an older agent). Each pod and GPU
    once."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    @field_validator("gpus")
    @classmethod
    def _unique_indices(cls, gpus: list[GpuReport]) -> list[GpuReport]:
        seen: set[int] = set()
        for gpu in gpus:
            if gpu.index in seen:
                raise ValueError(f"gpu index {gpu.index} appears twice")
            seen.add(gpu.index)
        return gpus

    @field_validator("holders")
    @classmethod
    def _unique_holders(cls, holders: list[PodHolder] | None) -> list[PodHolder] | None:
        duplicate = duplicate_holder((h.namespace, h.name, h.gpu_uuid) for h in holders or ())
        if duplicate is not None:
            raise ValueError(duplicate)
        return holders

    def to_json_bytes(self) -> bytes:
        """The wire form, as an agent sends it."""
        return self.model_dump_json(by_alias=True).encode()
