"""Three-level GPU health (seed §4.1), as a pure function of readings and recent events.

Node level: the GPU answers, no fatal XID, no uncorrected ECC, not over maxTemp. Pod level: the
driver and /dev/nvidia* device nodes are there. Application level: CUDA contexts can be made.
Health recovers by itself once the fault clears. Imports only ``model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from node_agent.model import GpuHealth, GpuReading, NodeChecks

# XIDs that mean the GPU (not the application) is in trouble. 13, 31, 43 and 45 are
# application errors (bad kernel, MMU fault, stopped channel) and never count against the GPU.
DEFAULT_FATAL_XIDS: Final = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
APPLICATION_XIDS: Final = frozenset({13, 31, 43, 45})


@dataclass(frozen=True, slots=True)
class HealthArgs:
    """Thresholds of the health checks."""

    fatal_xids: frozenset[int] = field(default_factory=lambda: DEFAULT_FATAL_XIDS)
    xid_hold_s: float = 300.0
    """A fatal XID keeps the GPU unhealthy this long after it was last seen."""
    max_temp_c: float = 85.0
    cuda_min_ratio: float = 0.5
    """Below this CUDA context success ratio the GPU is unhealthy; below 1, degraded."""


_LEVEL_RANK: Final = {"healthy": 0, "degraded": 1, "unhealthy": 2}


def assess(
    reading: GpuReading,
    checks: NodeChecks,
    last_fatal_xid: tuple[int, float] | None,
    now: float,
    args: HealthArgs,
) -> GpuHealth:
    """Health of one GPU with every reason that applies (most severe decides the level).

    ``last_fatal_xid`` is (xid, when) of the newest fatal XID seen on this GPU, if any.
    """
    found: list[tuple[str, str]] = []
    xid_last = last_fatal_xid[0] if last_fatal_xid else None
    if reading.lost:
        found.append(("unhealthy", "nvml:gpu-lost"))
    if checks.driver_ok is False:
        found.append(("unhealthy", "driver:not-ok"))
    if checks.device_nodes_ok is False:
        found.append(("unhealthy", "dev:nodes-missing"))
    if last_fatal_xid is not None and now - last_fatal_xid[1] < args.xid_hold_s:
        found.append(("unhealthy", f"xid:{last_fatal_xid[0]}"))
    if reading.ecc_uncorrected:
        found.append(("unhealthy", "ecc:dbe"))
    ratio = checks.cuda_ctx_success_ratio
    if ratio is not None and ratio < args.cuda_min_ratio:
        found.append(("unhealthy", "cuda:ctx-failed"))
    elif ratio is not None and ratio < 1.0:
        found.append(("degraded", "cuda:ctx-flaky"))
    if reading.temperature_c is not None and reading.temperature_c >= args.max_temp_c:
        found.append(("degraded", "temp:over-max"))
    if any(r in ("hw_slowdown", "hw_thermal_slowdown") for r in reading.throttle_reasons):
        found.append(("degraded", "throttle:hw-slowdown"))
    if not found:
        return GpuHealth("healthy", (), xid_last)
    worst = max(found, key=lambda f: _LEVEL_RANK[f[0]])[0]
    return GpuHealth(worst, tuple(reason for _, reason in found), xid_last)  # type: ignore[arg-type]
