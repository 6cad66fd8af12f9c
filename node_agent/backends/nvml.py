"""NVML backend (nvidia-ml-py, module ``pynvml``): the only module that imports it.

NVMLError becomes our errors here: NotSupported → ``None`` for a reading and ``NotSupported``
for a setter; GpuIsLost → that GPU only reads as lost; NoPermission on a setter →
``PermissionDenied`` (reported, not retried). Units are converted here and only here: NVML's
milliwatts become watts, bytes become MiB, bit masks become reason names.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from node_agent.backends.cuda_probe import CudaProbe
from node_agent.backends.procmap import pod_of_pid
from node_agent.backends.selftest import (
    DEFAULT_TOOL_DIRS,
    SUITE_S,
    TIMEOUT_S,
    finder,
    gpu_checks,
    nvidia_tools,
    run_self_test,
)
from node_agent.errors import BackendUnavailable, NotSupported, PermissionDenied
from node_agent.model import (
    Capabilities,
    GpuProcess,
    GpuReading,
    NodeChecks,
    PowerLimits,
    XidEvent,
    version_text,
)

log = logging.getLogger("node_agent.nvml")

MIB: Final = 1024 * 1024

# Clock event (throttle) reason bits, as nvml.h defines them.
THROTTLE_BITS: Final = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

_NOT_SUPPORTED: Final = 3
_NO_PERMISSION: Final = 4
_TIMEOUT: Final = 10
_GPU_IS_LOST: Final = 15
_LOST_CODES: Final = frozenset({_GPU_IS_LOST, 17, 999})  # lost, reset required, unknown


def throttle_reasons(mask: int) -> tuple[str, ...]:
    """Names of the set bits of a clock event reasons mask."""
    return tuple(name for bit, name in THROTTLE_BITS if mask & bit)


class NvmlBackend:
    """GPUs read through NVML."""

    name = "nvml"

    def __init__(
        self,
        *,
        module: ModuleType | Any | None = None,
        proc_root: Path = Path("/proc"),
        dev_root: Path = Path("/dev"),
        device_plugin_socket: Path | None = None,
        cuda_probe: CudaProbe | None = None,
        probe_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        tool_dirs: Sequence[Path] = DEFAULT_TOOL_DIRS,
    ) -> None:
        self._which = finder(tool_dirs)
        self._stop = threading.Event()
        """Set by ``close``: a self-test running stops."""
        self._nv: Any = module
        self._proc_root = proc_root
        self._dev_root = dev_root
        self._plugin_socket = device_plugin_socket
        self._probe = cuda_probe
        self._probe_interval_s = probe_interval_s
        self._clock = clock
        self._last_probe = -float("inf")
        self._handles: list[Any] = []
        self._uuids: dict[int, str] = {}
        """The uuid each GPU last read with: a lost GPU keeps it (its claims and pods do)."""
        self._events: Any = None
        self._xid_capable: set[int] = set()
        self._limits: dict[int, PowerLimits | None] = {}
        self._opened = False

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """Initialise NVML and register for XID events."""
        self._stop.clear()
        if self._nv is None:
            try:
                import pynvml
            except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
                raise BackendUnavailable(
                    f"nvidia-ml-py is not installed ({exc}); pip install nvidia-ml-py"
                ) from None
            self._nv = pynvml
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise BackendUnavailable(
                f"cannot initialise NVML: {exc}. Is the NVIDIA driver installed and "
                "/dev/nvidia* visible to this container? Use --backend simulated to try the "
                "agent without a GPU."
            ) from None
        self._opened = True
        try:
            count = nv.nvmlDeviceGetCount()
            self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nv.NVMLError as exc:
            self.close()
            raise BackendUnavailable(f"NVML lists no GPUs: {exc}") from None
        try:
            self._events = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.warning("no XID events (event set: %s)", exc)
            self._events = None
        for i, handle in enumerate(self._handles):
            if self._events is None:
                break
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self._events)
                self._xid_capable.add(i)
            except nv.NVMLError as exc:
                log.info("gpu %d: no XID events: %s", i, exc)

    def close(self) -> None:
        """Free the event set and shut NVML down. Safe to call twice."""
        self._stop.set()  # a self-test running stops
        if not self._opened:
            return
        nv = self._nv
        self._opened = False
        if self._events is not None:
            try:
                nv.nvmlEventSetFree(self._events)
            except nv.NVMLError:
                pass
            self._events = None
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass

    def device_count(self) -> int:
        """GPUs NVML listed at open."""
        return len(self._handles)

    # -- reads ------------------------------------------------------------------------------
    def _field(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML; NotSupported (and other per-field errors) → None, lost → raise."""
        nv = self._nv
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            if exc.value in _LOST_CODES:
                raise
            if exc.value != _NOT_SUPPORTED:
                log.debug("%s: %s", getattr(fn, "__name__", fn), exc)
            return None

    def read(self, index: int) -> GpuReading:
        """Every field of one GPU; a lost GPU is a lost reading."""
        nv = self._nv
        h = self._handles[index]
        try:
            read = self._field(nv.nvmlDeviceGetUUID, h)
            uuid = read or self._uuids.get(index, f"GPU-index-{index}")
            name = self._field(nv.nvmlDeviceGetName, h)
            temp = self._field(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            power_mw = self._field(nv.nvmlDeviceGetPowerUsage, h)
            limit_mw = self._field(nv.nvmlDeviceGetEnforcedPowerLimit, h)
            util = self._field(nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._field(nv.nvmlDeviceGetMemoryInfo, h)
            sm = self._field(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            sm_max = self._field(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)
            fan = self._field(nv.nvmlDeviceGetFanSpeed, h)  # NotSupported: no fan
            reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
                nv.nvmlDeviceGetCurrentClocksThrottleReasons
            )
            mask = self._field(reasons_fn, h)
            ecc = self._field(
                nv.nvmlDeviceGetTotalEccErrors,
                h,
                nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nv.NVML_VOLATILE_ECC,
            )
            procs = self._field(nv.nvmlDeviceGetComputeRunningProcesses, h)
            vbios = self._field(nv.nvmlDeviceGetVbiosVersion, h)
            inforom = self._field(nv.nvmlDeviceGetInforomImageVersion, h)
            driver = self._field(nv.nvmlSystemGetDriverVersion)
        except nv.NVMLError as exc:
            log.error("gpu %d is lost: %s", index, exc)
            uuid = self._uuids.get(index, f"GPU-index-{index}")
            return GpuReading(index=index, uuid=uuid, vendor="nvidia", lost=True)
        if read:
            self._uuids[index] = _text(read)
        return GpuReading(
            vendor="nvidia",
            index=index,
            uuid=_text(uuid),
            model=_text(name) if name is not None else None,
            temperature_c=float(temp) if temp is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000.0 if limit_mw is not None else None,
            utilization_pct=float(util.gpu) if util is not None else None,
            memory_total_mib=mem.total / MIB if mem is not None else None,
            memory_used_mib=mem.used / MIB if mem is not None else None,
            sm_clock_mhz=float(sm) if sm is not None else None,
            sm_clock_max_mhz=float(sm_max) if sm_max is not None else None,
            fan_speed_pct=float(fan) if fan is not None else None,
            throttle_reasons=throttle_reasons(int(mask)) if mask is not None else (),
            ecc_uncorrected=int(ecc) if ecc is not None else None,
            processes=tuple(self._process(p) for p in procs or ()),
            driver_version=version_text(driver),
            vbios_version=version_text(vbios),
            inforom_version=version_text(inforom),
        )

    def _process(self, proc: Any) -> GpuProcess:
        used = getattr(proc, "usedGpuMemory", None)
        pod_uid, container = pod_of_pid(int(proc.pid), self._proc_root)
        return GpuProcess(
            pid=int(proc.pid),
            used_mib=used / MIB if isinstance(used, int) else None,
            pod_uid=pod_uid,
            container=container,
        )

    def node_checks(self) -> NodeChecks:
        """Driver answers, device nodes exist, device plugin socket, CUDA probe ratio."""
        nv = self._nv
        try:
            nv.nvmlSystemGetDriverVersion()
            driver_ok = True
        except nv.NVMLError:
            driver_ok = False
        nodes = [
            self._dev_root / "nvidiactl",
            *(self._dev_root / f"nvidia{i}" for i in range(len(self._handles))),
        ]
        devices_ok = all(p.exists() for p in nodes)
        plugin_ok = self._plugin_socket.exists() if self._plugin_socket is not None else None
        ratio = None
        if self._probe is not None:
            now = self._clock()
            if now - self._last_probe >= self._probe_interval_s:
                self._last_probe = now
                for i in range(len(self._handles)):
                    result = self._probe.probe(i)
                    if not result.ok:
                        log.warning("gpu %d: CUDA context probe failed: %s", i, result.detail)
            ratio = self._probe.ratio()
        return NodeChecks(driver_ok, devices_ok, plugin_ok, ratio)

    def poll_xids(self, now: float) -> list[XidEvent]:
        """Drain the XID event set without blocking (timeout 0)."""
        if self._events is None:
            return []
        nv = self._nv
        events: list[XidEvent] = []
        for _ in range(256):  # bounded: a storm of events must not stall the loop
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError as exc:
                if exc.value != _TIMEOUT:
                    log.warning("xid poll: %s", exc)
                break
            index = self._index_of(data.device)
            if index >= 0:
                events.append(XidEvent(index=index, xid=int(data.eventData), at=now))
        return events

    def _index_of(self, handle: Any) -> int:
        # Handles are ctypes pointers: compare through NVML, not by identity.
        nv = self._nv
        try:
            return int(nv.nvmlDeviceGetIndex(handle))
        except nv.NVMLError:
            return -1

    # -- control ----------------------------------------------------------------------------
    def capabilities(self, index: int) -> Capabilities:
        """Power limits where NVML gives their range; clocks are tried and learned."""
        return Capabilities(
            power_limit=self.power_limits(index) is not None,
            locked_clocks=True,
            xid_events=index in self._xid_capable,
            processes=True,
        )

    def power_limits(self, index: int) -> PowerLimits | None:
        """Allowed range and default (W), read once per GPU: they are fixed by the board."""
        if index in self._limits:
            return self._limits[index]
        nv = self._nv
        h = self._handles[index]
        try:
            lo, hi = nv.nvmlDeviceGetPowerManagementLimitConstraints(h)
            default = nv.nvmlDeviceGetPowerManagementDefaultLimit(h)
            limits: PowerLimits | None = PowerLimits(
                min_w=lo / 1000.0, max_w=hi / 1000.0, default_w=default / 1000.0
            )
        except nv.NVMLError as exc:
            if exc.value in _LOST_CODES:
                return None  # a lost GPU may answer again later: do not remember this
            limits = None
        self._limits[index] = limits
        return limits

    def _set(self, fn: Callable[..., Any], *args: Any) -> None:
        nv = self._nv
        try:
            fn(*args)
        except nv.NVMLError as exc:
            if exc.value == _NOT_SUPPORTED:
                raise NotSupported(str(exc)) from None
            if exc.value == _NO_PERMISSION:
                raise PermissionDenied(
                    f"{exc} (the agent needs root / CAP_SYS_ADMIN for this)"
                ) from None
            raise

    def set_power_limit_w(self, index: int, watts: float) -> None:
        """nvmlDeviceSetPowerManagementLimit, in milliwatts."""
        self._set(
            self._nv.nvmlDeviceSetPowerManagementLimit,
            self._handles[index],
            round(watts * 1000),
        )

    def lock_clocks_mhz(self, index: int, max_mhz: float) -> None:
        """nvmlDeviceSetGpuLockedClocks(0, max)."""
        self._set(self._nv.nvmlDeviceSetGpuLockedClocks, self._handles[index], 0, int(max_mhz))

    def reset_clocks(self, index: int) -> None:
        """NvmlDeviceResetGpuLockedClocks."""
        self._set(self._nv.nvmlDeviceResetGpuLockedClocks, self._handles[index])

    def self_test(self, level: int = 1) -> dict[str, Any]:
        """NVML's word on every GPU, then the NVIDIA suite at ``level`` and the CUDA probe."""
        count = self.device_count()
        checks = gpu_checks(count, self.read, self._memory)
        uuids = [self._uuids.get(i, "") for i in range(count)]
        return run_self_test(
            count,
            probe=self._probe,
            which=self._which,
            timeout_s=TIMEOUT_S[level],
            budget_s=SUITE_S[level],
            stop=self._stop,
            tools=nvidia_tools(level, count, uuids if all(uuids) else None),
            checks=checks,
            bandwidth=level >= 2,
        )

    def _memory(self, index: int) -> list[str]:
        """Row remapping failed or pending, retired pages pending.

        The PCIe link is the bandwidth tests' to judge: NVML's current width drops at idle.
        """
        h = self._handles[index]

        def ask(function: str) -> Any:
            fn = getattr(self._nv, function, None)  # older bindings lack some
            return self._field(fn, h) if fn is not None else None

        problems = []
        rows = ask("nvmlDeviceGetRemappedRows")
        if rows is not None:
            _, _, pending, failed = rows
            if failed:
                problems.append("row remapping failed: the GPU needs service")
            elif pending:
                problems.append("row remapping pending: the GPU needs a reset")
        retired = ask("nvmlDeviceGetRetiredPagesPendingStatus")
        if retired:
            problems.append("retired pages pending: the GPU needs a reset")
        return problems


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
