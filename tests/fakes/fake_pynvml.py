"""An honest fake of the ``pynvml`` module (nvidia-ml-py) for machines without a GPU.

Same function names, same constants, same exception classes (``NVMLError`` with ``value``
and one ``NVMLError_<Name>`` subclass per code, built the way pynvml builds them). Scripted
faults: a GPU lost mid-run, NotSupported fields, XID events, NoPermission on setters.
"""

from __future__ import annotations

import string
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

_CODES = {
    "UNINITIALIZED": 1, "INVALID_ARGUMENT": 2, "NOT_SUPPORTED": 3, "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5, "NOT_FOUND": 6, "DRIVER_NOT_LOADED": 9, "TIMEOUT": 10,
    "LIBRARY_NOT_FOUND": 12, "GPU_IS_LOST": 15, "RESET_REQUIRED": 16, "UNKNOWN": 999,
}  # fmt: skip


class NVMLError(Exception):
    _valClassMapping: dict[int, type] = {}  # noqa: RUF012 - mirrors pynvml

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        self.value = value

    def __str__(self) -> str:
        names = {v: k for k, v in _CODES.items()}
        return names.get(self.value, f"NVML Error with code {self.value}").replace("_", " ").title()


def _build_error_classes(namespace: dict[str, Any]) -> None:
    for name, value in _CODES.items():
        class_name = "NVMLError_" + string.capwords(name, "_").replace("_", "")

        def new(cls: type, *args: Any, _v: int = value) -> NVMLError:
            return NVMLError.__new__(cls, _v)

        klass = type(class_name, (NVMLError,), {"__new__": new, "__init__": lambda self, *a: None})
        NVMLError._valClassMapping[value] = klass
        namespace[class_name] = klass
        namespace[f"NVML_ERROR_{name}"] = value


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    temperature_c: int = 45
    power_mw: int = 120_000
    limit_mw: int = 700_000
    limit_range_mw: tuple[int, int] = (200_000, 700_000)
    default_limit_mw: int = 700_000
    util_pct: int = 30
    mem_total: int = 143_771 * 1024 * 1024
    mem_used: int = 1024 * 1024 * 1024
    sm_mhz: int = 1980
    sm_max_mhz: int = 1980
    fan_pct: int | None = None
    """None: a passively cooled board (NVML answers NotSupported)."""
    reasons_mask: int = 0
    ecc_uncorrected: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    lost: bool = False
    not_supported: set[str] = field(default_factory=set)
    """Function names that answer NotSupported for this GPU."""
    locked_clocks: tuple[int, int] | None = None
    vbios: str = "96.00.74.00.01"
    inforom: str = "G525.0200.00.05"
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    """(correctable, uncorrectable, pending, failure occurred), as nvmlDeviceGetRemappedRows."""
    retired_pending: int = 0


class FakePynvml:
    """An object that looks like the ``pynvml`` module."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, gpus: list[FakeGpu] | None = None, *, init_error: int | None = None) -> None:
        ns: dict[str, Any] = {}
        _build_error_classes(ns)
        self.__dict__.update(ns)
        self.NVMLError = NVMLError
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.initialised = False
        self.setters_denied = False
        self.events_supported = True
        self.driver_version = "570.86.15"
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self._events: deque[tuple[int, int]] = deque()

    # -- scripting --------------------------------------------------------------------------
    def push_xid(self, index: int, xid: int) -> None:
        self._events.append((index, xid))

    # -- helpers ----------------------------------------------------------------------------
    def _raise(self, name: str) -> None:
        raise NVMLError(_CODES[name])

    def _gpu(self, handle: Any, fn: str) -> FakeGpu:
        if not self.initialised:
            self._raise("UNINITIALIZED")
        gpu: FakeGpu = self.gpus[handle.index]
        if gpu.lost:
            self._raise("GPU_IS_LOST")
        if fn in gpu.not_supported:
            self._raise("NOT_SUPPORTED")
        return gpu

    # -- the pynvml API used by the backend -------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        if not self.initialised:
            self._raise("UNINITIALIZED")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimpleNamespace:
        return SimpleNamespace(index=index)

    def nvmlDeviceGetIndex(self, h: Any) -> int:
        return int(h.index)

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return self._gpu(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, h: Any) -> str:
        return self._gpu(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetVbiosVersion(self, h: Any) -> str:
        return self._gpu(h, "nvmlDeviceGetVbiosVersion").vbios

    def nvmlDeviceGetInforomImageVersion(self, h: Any) -> str:
        return self._gpu(h, "nvmlDeviceGetInforomImageVersion").inforom

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return self._gpu(h, "nvmlDeviceGetTemperature").temperature_c

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetEnforcedPowerLimit").limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: Any) -> list[int]:
        return list(self._gpu(h, "nvmlDeviceGetPowerManagementLimitConstraints").limit_range_mw)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerManagementDefaultLimit").default_limit_mw

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> SimpleNamespace:
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.util_pct, memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> SimpleNamespace:
        g = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=g.mem_total, used=g.mem_used, free=g.mem_total - g.mem_used)

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetClockInfo")
        return g.locked_clocks[1] if g.locked_clocks else g.sm_mhz

    def nvmlDeviceGetMaxClockInfo(self, h: Any, clock: int) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxClockInfo").sm_max_mhz

    def nvmlDeviceGetFanSpeed(self, h: Any) -> int:
        g = self._gpu(h, "nvmlDeviceGetFanSpeed")
        if g.fan_pct is None:
            self._raise("NOT_SUPPORTED")
        return int(g.fan_pct)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").reasons_mask

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksThrottleReasons").reasons_mask

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter: int) -> int:
        return self._gpu(h, "nvmlDeviceGetTotalEccErrors").ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        return self._gpu(h, "nvmlDeviceGetRemappedRows").remapped_rows

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[SimpleNamespace]:
        g = self._gpu(h, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in g.processes]

    def _setter(self, h: Any, fn: str) -> FakeGpu:
        gpu = self._gpu(h, fn)
        self.calls.append((fn, (h.index,)))
        if self.setters_denied:
            self._raise("NO_PERMISSION")
        return gpu

    def nvmlDeviceSetPowerManagementLimit(self, h: Any, limit_mw: int) -> None:
        g = self._setter(h, "nvmlDeviceSetPowerManagementLimit")
        lo, hi = g.limit_range_mw
        if not lo <= limit_mw <= hi:
            self._raise("INVALID_ARGUMENT")
        g.limit_mw = limit_mw

    def nvmlDeviceSetGpuLockedClocks(self, h: Any, lo: int, hi: int) -> None:
        self._setter(h, "nvmlDeviceSetGpuLockedClocks").locked_clocks = (lo, hi)

    def nvmlDeviceResetGpuLockedClocks(self, h: Any) -> None:
        self._setter(h, "nvmlDeviceResetGpuLockedClocks").locked_clocks = None

    def nvmlEventSetCreate(self) -> object:
        if not self.events_supported:
            self._raise("NOT_SUPPORTED")
        return object()

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, event_set: object) -> None:
        self._gpu(h, "nvmlDeviceRegisterEvents")

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        if not self._events:
            self._raise("TIMEOUT")
        index, xid = self._events.popleft()
        return SimpleNamespace(device=SimpleNamespace(index=index), eventData=xid, eventType=0x8)

    def nvmlEventSetFree(self, event_set: object) -> None:
        return None
