"""A fake ``amdsmi`` module at the library boundary: the real function, enum and exception
names of AMD SMI's Python interface (ROCm 6.x), and its units (°C, W for socket power, µW for
power caps, MB for VRAM, MHz), over a list of fake GPUs a test controls.
"""

from __future__ import annotations

import enum
import types
from dataclasses import dataclass, field
from typing import Any

AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_DRM_ERROR = 6
AMDSMI_STATUS_NO_PERM = 10


class AmdSmiLibraryException(Exception):
    """As amdsmi raises it: carries the library's status code."""

    def __init__(self, err_code: int) -> None:
        super().__init__(f"Error code:\n\t{err_code}")
        self.err_code = err_code

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiInitFlags(enum.IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2


class AmdSmiTemperatureType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0
    MAX = 1


class AmdSmiClkType(enum.IntEnum):
    SYS = 0
    GFX = 0
    DF = 1
    MEM = 4


@dataclass
class FakeAmdGpu:
    """One GPU; a field in ``unsupported`` raises NOT_SUPPORTED, ``lost`` fails every call."""

    uuid: str
    market_name: str = "AMD Instinct MI210"
    bdf: str = "0000:03:00.0"
    edge_c: int = 45
    hotspot_c: int = 58
    socket_power_w: Any = 120
    cap_uw: int = 300_000_000
    default_cap_uw: int = 300_000_000
    min_cap_uw: int = 100_000_000
    max_cap_uw: int = 300_000_000
    gfx_activity: int = 37
    vram_total_mb: int = 65520
    vram_used_mb: int = 2048
    gfx_clk_mhz: int = 1500
    gfx_max_clk_mhz: int = 1700
    uncorrectable: int = 0
    driver_version: str = "6.8.5"
    vbios_version: str = "022.040.003.043.000001"
    processes: list[dict[str, Any]] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    broken: bool = False
    """Every call but the uuid fails (the library keeps a gone GPU's identity)."""
    no_permission: bool = False
    cap_calls: list[int] = field(default_factory=list)


def build(gpus: list[FakeAmdGpu]) -> types.ModuleType:
    """A module named ``amdsmi`` over these GPUs (handles are their positions)."""
    m = types.ModuleType("amdsmi")
    state = {"init": False}

    def gpu(handle: int, what: str) -> FakeAmdGpu:
        if not state["init"]:
            raise AmdSmiLibraryException(32)  # AMDSMI_STATUS_NOT_INIT
        g = gpus[handle]
        if g.lost or (g.broken and what != "uuid"):
            raise AmdSmiLibraryException(AMDSMI_STATUS_DRM_ERROR)
        if what in g.unsupported:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return g

    def amdsmi_init(flags: int = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        state["init"] = True

    def amdsmi_shut_down() -> None:
        state["init"] = False

    def amdsmi_get_processor_handles() -> list[int]:
        if not state["init"]:
            raise AmdSmiLibraryException(32)
        return list(range(len(gpus)))

    def amdsmi_get_gpu_device_uuid(h: int) -> str:
        return gpu(h, "uuid").uuid

    def amdsmi_get_gpu_device_bdf(h: int) -> str:
        return gpu(h, "bdf").bdf

    def amdsmi_get_gpu_driver_info(h: int) -> dict[str, Any]:
        g = gpu(h, "driver")
        return {"driver_name": "amdgpu", "driver_version": g.driver_version,
                "driver_date": "2015/01/01 00:00"}  # fmt: skip

    def amdsmi_get_gpu_vbios_info(h: int) -> dict[str, Any]:
        g = gpu(h, "vbios")
        return {"name": "AMD MI210", "build_date": "2022/08/04 08:57",
                "part_number": "113-D67301-063", "version": g.vbios_version}  # fmt: skip

    def amdsmi_get_gpu_asic_info(h: int) -> dict[str, Any]:
        g = gpu(h, "asic")
        return {"market_name": g.market_name, "vendor_id": 0x1002, "device_id": 0x740F}

    def amdsmi_get_temp_metric(h: int, sensor: int, metric: int) -> int:
        g = gpu(h, "temp")
        if sensor == AmdSmiTemperatureType.EDGE:
            if "edge" in g.unsupported:
                raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
            return g.edge_c
        return g.hotspot_c

    def amdsmi_get_power_info(h: int) -> dict[str, Any]:
        g = gpu(h, "power")
        return {"current_socket_power": g.socket_power_w, "average_socket_power": g.socket_power_w,
                "gfx_voltage": 800, "power_limit": g.cap_uw // 1_000_000}  # fmt: skip

    def amdsmi_get_power_cap_info(h: int) -> dict[str, Any]:
        g = gpu(h, "power_cap")
        return {"power_cap": g.cap_uw, "default_power_cap": g.default_cap_uw, "dpm_cap": 0,
                "min_power_cap": g.min_cap_uw, "max_power_cap": g.max_cap_uw}  # fmt: skip

    def amdsmi_set_power_cap(h: int, sensor_ind: int, cap: int) -> None:
        g = gpu(h, "set_power_cap")
        if g.no_permission:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NO_PERM)
        g.cap_calls.append(cap)
        g.cap_uw = cap

    def amdsmi_get_gpu_activity(h: int) -> dict[str, Any]:
        g = gpu(h, "activity")
        return {"gfx_activity": g.gfx_activity, "umc_activity": 5, "mm_activity": "N/A"}

    def amdsmi_get_gpu_vram_usage(h: int) -> dict[str, Any]:
        g = gpu(h, "vram")
        return {"vram_total": g.vram_total_mb, "vram_used": g.vram_used_mb}

    def amdsmi_get_clock_info(h: int, clk_type: int) -> dict[str, Any]:
        g = gpu(h, "clock")
        return {"clk": g.gfx_clk_mhz, "min_clk": 500, "max_clk": g.gfx_max_clk_mhz,
                "clk_locked": False, "clk_deep_sleep": False}  # fmt: skip

    def amdsmi_get_gpu_total_ecc_count(h: int) -> dict[str, Any]:
        g = gpu(h, "ecc")
        return {"correctable_count": 0, "uncorrectable_count": g.uncorrectable, "deferred_count": 0}

    def amdsmi_get_gpu_process_list(h: int) -> list[dict[str, Any]]:
        return list(gpu(h, "processes").processes)

    for name, value in list(locals().items()):
        if name.startswith("amdsmi_"):
            setattr(m, name, value)
    m.AmdSmiLibraryException = AmdSmiLibraryException  # type: ignore[attr-defined]
    m.AmdSmiInitFlags = AmdSmiInitFlags  # type: ignore[attr-defined]
    m.AmdSmiTemperatureType = AmdSmiTemperatureType  # type: ignore[attr-defined]
    m.AmdSmiTemperatureMetric = AmdSmiTemperatureMetric  # type: ignore[attr-defined]
    m.AmdSmiClkType = AmdSmiClkType  # type: ignore[attr-defined]
    return m
