"""Plain values the agent passes around: readings, limits, capabilities, planned actions.

Imports only the standard library and the generated ``readings``. Units are in the names;
``None`` = not supported / no data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from node_agent.readings import GpuReadings
from scheduler_extender.logs import CONTROL_CHARACTERS

_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")


def version_text(value: object) -> str | None:
    """A version string as telemetry carries it.

    UTF-8 text without control characters, at most 64 characters; nothing, blank, ``N/A`` or
    ``unknown`` → None.
    """
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    text = _CONTROL.sub("", str(value)) if value is not None else ""
    text = text.encode("utf-8", "replace").decode("utf-8").strip()[:64]
    return text if text and text.lower() not in ("n/a", "unknown") else None


DEFAULT_BLOCK_MIB = 4096
"""MiB per ``edgegpu.io/gpu-mem-block`` when neither an extender nor the agent's state says
otherwise: the policy's default ``spec.memory.blockMiB`` (the agent may not import the policy;
a test keeps the two equal)."""
MIN_BLOCK_MIB = 256
"""The smallest block the policy allows: smaller ones make more devices than kubelet's gRPC
message limit carries."""
MAX_BLOCK_MIB = 1_048_576
"""The largest block size taken from an extender's answer, the state file or ``--block-mib``."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding memory on a GPU."""

    pid: int
    used_mib: float | None = None
    pod_uid: str | None = None
    container: str | None = None


@dataclass(frozen=True, slots=True)
class GpuHolder:
    """A pod whose containers kubelet gave memory blocks of one GPU."""

    namespace: str
    name: str
    gpu_uuid: str
    blocks: int


@dataclass(frozen=True, slots=True)
class GpuReading(GpuReadings):
    """One GPU at one moment, as the backend could read it.

    The readings (``GpuReadings``, keyword-only) are the reported fields of the extender's
    ``fields.GPU_FIELDS``, generated into ``node_agent.readings`` (``make generate``).
    """

    index: int
    uuid: str
    model: str | None = None
    vendor: str | None = None
    """``nvidia``, ``amd`` or ``intel``."""
    throttle_reasons: tuple[str, ...] = ()
    ecc_uncorrected: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    lost: bool = False
    """The GPU stopped answering; every other field is then None."""
    pci_bus_id: str | None = None
    """``0000:4d:00.0``: where its device nodes are found (``/sys/bus/pci/devices/<id>/drm``)."""
    driver_version: str | None = None
    """The driver the GPU runs under (``570.86.15``), as its library says."""
    vbios_version: str | None = None
    """The board's VBIOS (firmware) version."""
    inforom_version: str | None = None
    """NVIDIA's InfoROM image version."""
    firmware_version: str | None = None
    """The GPU's firmware where it has no VBIOS (Intel: its GFX firmware)."""


@dataclass(frozen=True, slots=True)
class PowerLimits:
    """What the power limit may be set to (W)."""

    min_w: float
    max_w: float
    default_w: float


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do for one GPU; everything defaults to "not supported"."""

    power_limit: bool = False
    locked_clocks: bool = False
    xid_events: bool = False
    processes: bool = False


@dataclass(frozen=True, slots=True)
class NodeChecks:
    """Node- and pod-level health inputs (seed §4.1)."""

    driver_ok: bool | None = None
    device_nodes_ok: bool | None = None
    device_plugin_ok: bool | None = None
    cuda_ctx_success_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class XidEvent:
    """An XID error reported by the driver for one GPU."""

    index: int
    xid: int
    at: float
    """Agent monotonic seconds."""


HealthLevel = Literal["healthy", "degraded", "unhealthy"]


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """A GPU's health with stable reason codes (``xid:79``, ``ecc:dbe``, ...)."""

    level: HealthLevel
    reasons: tuple[str, ...] = ()
    xid_last: int | None = None


ActionKind = Literal["set_power_limit", "reset_power_limit", "lock_clocks", "reset_clocks"]


@dataclass(frozen=True, slots=True)
class PowerAction:
    """One planned change to a GPU's power state, with why."""

    index: int
    kind: ActionKind
    reason: str
    """``thermal``, ``power-saving``, ``restore``..."""
    watts: float | None = None
    clock_mhz: float | None = None


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What became of a planned action."""

    action: PowerAction
    outcome: Literal["applied", "dry-run", "not-supported", "no-permission", "failed", "skipped"]
    detail: str = ""


@dataclass(slots=True)
class Snapshot:
    """One sampling round of the whole node."""

    taken_at: float
    readings: list[GpuReading] = field(default_factory=list)
    checks: NodeChecks = field(default_factory=NodeChecks)
    xids: list[XidEvent] = field(default_factory=list)
