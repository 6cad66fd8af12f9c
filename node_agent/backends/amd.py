"""AMD backend on ``amdsmi`` (ROCm's AMD SMI Python interface): the only module importing it.

``AmdSmiLibraryException`` becomes our errors here: not supported → ``None`` for a reading and
``NotSupported`` for a setter; no permission on a setter → ``PermissionDenied``; any other
error reading the GPU's identity → that GPU reads as lost. Units are converted here and only
here: power caps come in microwatts, VRAM in MB, temperatures in °C.

Temperature: the **edge** sensor where the board has one (closest to what NVML reports as the
GPU temperature, so one ``maxTemp`` means the same on both), else the **hotspot** (junction)
sensor, which reads 10-20 °C higher (Instinct MI300 has no edge sensor: set ``maxTemp`` for
those nodes accordingly). Clocks cannot be locked through this backend; power capping is the
thermal and power-saving lever. No XID equivalent is read yet.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from node_agent.backends import diag_output
from node_agent.backends.procmap import pod_of_pid
from node_agent.backends.selftest import (
    DEFAULT_TOOL_DIRS,
    SUITE_S,
    TIMEOUT_S,
    Tool,
    finder,
    gpu_checks,
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

log = logging.getLogger("node_agent.amd")

MIB: Final = 1024 * 1024
_NOT_SUPPORTED: Final = 2
_NO_PERM: Final = 10
LOST_AFTER_ERRORS: Final = 4
"""A GPU whose identity still reads but this many other reads fail (not as unsupported) is
lost: a GPU gone from the bus can leave its cached uuid behind."""


def amd_tools(level: int) -> tuple[Tool, ...]:
    """The AMD suite at ``level``.

    1: the GPUs answer ``amd-smi list`` and ``rvs -g``; 2 and 3 add the ROCm Validation
    Suite's predefined level (``rvs -r <level>``) and rocm-bandwidth-test's copy bandwidths.
    """
    tools = [Tool("amd-smi", ("amd-smi", "list")), Tool("rvs-gpus", ("rvs", "-g"))]
    if level >= 2:
        tools += [
            Tool(f"rvs-r{level}", ("rvs", "-r", str(level)), diag_output.rvs),
            Tool("rocm-bandwidth-test", ("rocm-bandwidth-test",), diag_output.rocm_bandwidth),
        ]
    return tuple(tools)


def _number(value: Any) -> float | None:
    """A reading, or None for the library's "N/A" and other non-numbers."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class AmdBackend:
    """AMD GPUs read through amdsmi."""

    name = "amd"

    def __init__(
        self,
        *,
        module: ModuleType | Any | None = None,
        proc_root: Path = Path("/proc"),
        tool_dirs: Sequence[Path] = DEFAULT_TOOL_DIRS,
    ) -> None:
        self._which = finder(tool_dirs)
        self._stop = threading.Event()
        """Set by ``close``: a self-test running stops."""
        self._smi: Any = module
        self._proc_root = proc_root
        self._handles: list[Any] = []
        self._uuids: dict[int, str] = {}
        """The uuid each GPU last read with: a lost GPU keeps it (its claims and pods do)."""
        self._limits: dict[int, PowerLimits | None] = {}
        self._opened = False
        self._failed = 0
        """Reads of the current GPU that failed with something other than not supported."""

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """Initialise amdsmi for AMD GPUs and list them."""
        self._stop.clear()
        if self._smi is None:
            try:
                import amdsmi  # type: ignore[import-not-found]
            except ImportError as exc:
                raise BackendUnavailable(
                    f"the amdsmi package is not installed ({exc}): it ships with ROCm "
                    "(/opt/rocm/share/amd_smi); use --backend simulated to try the agent"
                ) from None
            self._smi = amdsmi
        smi = self._smi
        try:
            smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        except smi.AmdSmiLibraryException as exc:
            raise BackendUnavailable(
                f"cannot initialise amdsmi: {exc}. Is the amdgpu driver loaded and /dev/kfd, "
                "/dev/dri visible to this container?"
            ) from None
        self._opened = True
        try:
            self._handles = list(smi.amdsmi_get_processor_handles())
        except smi.AmdSmiLibraryException as exc:
            self.close()
            raise BackendUnavailable(f"amdsmi lists no GPUs: {exc}") from None

    def close(self) -> None:
        """Shut amdsmi down. Safe to call twice."""
        self._stop.set()  # a self-test running stops
        if not self._opened:
            return
        self._opened = False
        try:
            self._smi.amdsmi_shut_down()
        except self._smi.AmdSmiLibraryException:
            pass

    def device_count(self) -> int:
        """GPUs amdsmi listed at open."""
        return len(self._handles)

    # -- reads ------------------------------------------------------------------------------
    def _field(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call amdsmi; any error of one field → None (counted unless not supported)."""
        smi = self._smi
        try:
            return fn(*args)
        except smi.AmdSmiLibraryException as exc:
            if exc.get_error_code() != _NOT_SUPPORTED:
                self._failed += 1
                log.debug("%s: %s", getattr(fn, "__name__", fn), exc)
            return None

    def _temperature(self, h: Any) -> float | None:
        smi = self._smi
        kinds = smi.AmdSmiTemperatureType
        hotspot = getattr(kinds, "HOTSPOT", None) or getattr(kinds, "JUNCTION", None)
        for sensor in (kinds.EDGE, hotspot):
            if sensor is None:
                continue
            value = _number(
                self._field(
                    smi.amdsmi_get_temp_metric, h, sensor, smi.AmdSmiTemperatureMetric.CURRENT
                )
            )
            if value is not None:
                return value
        return None

    def read(self, index: int) -> GpuReading:
        """Every field of one GPU; one whose identity cannot be read is a lost reading."""
        smi = self._smi
        h = self._handles[index]
        try:
            uuid = smi.amdsmi_get_gpu_device_uuid(h)
        except smi.AmdSmiLibraryException as exc:
            log.error("gpu %d is lost: %s", index, exc)
            uuid = self._uuids.get(index, f"AMD-index-{index}")
            return GpuReading(index=index, uuid=uuid, vendor="amd", lost=True)
        self._failed = 0
        self._uuids[index] = str(uuid)
        asic = self._field(smi.amdsmi_get_gpu_asic_info, h) or {}
        power = self._field(smi.amdsmi_get_power_info, h) or {}
        activity = self._field(smi.amdsmi_get_gpu_activity, h) or {}
        vram = self._field(smi.amdsmi_get_gpu_vram_usage, h) or {}
        clock = self._field(smi.amdsmi_get_clock_info, h, smi.AmdSmiClkType.GFX) or {}
        ecc = self._field(smi.amdsmi_get_gpu_total_ecc_count, h) or {}
        procs = self._field(smi.amdsmi_get_gpu_process_list, h) or []
        cap = self._field(smi.amdsmi_get_power_cap_info, h) or {}
        bdf = self._field(smi.amdsmi_get_gpu_device_bdf, h)
        watts = _number(power.get("current_socket_power"))
        if watts is None:
            watts = _number(power.get("average_socket_power"))
        if self._failed >= LOST_AFTER_ERRORS:
            log.error("gpu %d is lost: %d reads failed", index, self._failed)
            return GpuReading(index=index, uuid=str(uuid), vendor="amd", lost=True)
        cap_uw = _number(cap.get("power_cap"))
        uncorrected = _number(ecc.get("uncorrectable_count"))
        return GpuReading(
            index=index,
            uuid=str(uuid),
            model=str(asic["market_name"]) if asic.get("market_name") else None,
            vendor="amd",
            temperature_c=self._temperature(h),
            power_w=watts,
            power_limit_w=cap_uw / 1e6 if cap_uw is not None else None,
            utilization_pct=_number(activity.get("gfx_activity")),
            memory_total_mib=_number(vram.get("vram_total")),
            memory_used_mib=_number(vram.get("vram_used")),
            sm_clock_mhz=_number(clock.get("clk", clock.get("cur_clk"))),
            sm_clock_max_mhz=_number(clock.get("max_clk")),
            ecc_uncorrected=int(uncorrected) if uncorrected is not None else None,
            processes=tuple(p for p in (self._process(x) for x in procs) if p is not None),
            pci_bus_id=str(bdf) if bdf else None,
            driver_version=self._version(h, "amdsmi_get_gpu_driver_info", "driver_version"),
            vbios_version=self._version(h, "amdsmi_get_gpu_vbios_info", "version"),
        )

    def _version(self, h: Any, function: str, key: str) -> str | None:
        """A version string from an amdsmi info call; absent or failing: None, not a fault."""
        fn = getattr(self._smi, function, None)  # older amdsmi releases lack some
        try:
            info = fn(h) if fn is not None else None
        except self._smi.AmdSmiLibraryException:
            return None
        return version_text(info.get(key) if isinstance(info, dict) else None)

    def _process(self, proc: Any) -> GpuProcess | None:
        if not isinstance(proc, dict) or not isinstance(proc.get("pid"), int):
            return None  # an older amdsmi's opaque process handle: not read
        usage = proc.get("memory_usage") or {}
        vram = _number(usage.get("vram_mem")) if isinstance(usage, dict) else None
        pod_uid, container = pod_of_pid(int(proc["pid"]), self._proc_root)
        return GpuProcess(
            pid=int(proc["pid"]),
            used_mib=vram / MIB if vram is not None else None,
            pod_uid=pod_uid,
            container=container,
        )

    def node_checks(self) -> NodeChecks:
        """The driver answers (amdsmi lists the GPUs); /dev/kfd exists."""
        smi = self._smi
        try:
            smi.amdsmi_get_processor_handles()
            driver_ok = True
        except smi.AmdSmiLibraryException:
            driver_ok = False
        return NodeChecks(driver_ok=driver_ok, device_nodes_ok=Path("/dev/kfd").exists())

    def poll_xids(self, now: float) -> list[XidEvent]:
        """No XID equivalent is read on AMD yet."""
        return []

    # -- control ----------------------------------------------------------------------------
    def capabilities(self, index: int) -> Capabilities:
        """Power caps where amdsmi gives their range; no clock locking; processes."""
        return Capabilities(power_limit=self.power_limits(index) is not None, processes=True)

    def power_limits(self, index: int) -> PowerLimits | None:
        """Allowed power cap range and default (W), read once per GPU."""
        if index in self._limits:
            return self._limits[index]
        info = self._field(self._smi.amdsmi_get_power_cap_info, self._handles[index]) or {}
        lo, hi = _number(info.get("min_power_cap")), _number(info.get("max_power_cap"))
        default = _number(info.get("default_power_cap"))
        limits = None
        if lo is not None and hi is not None and default is not None and hi > 0:
            limits = PowerLimits(min_w=lo / 1e6, max_w=hi / 1e6, default_w=default / 1e6)
        self._limits[index] = limits
        return limits

    def set_power_limit_w(self, index: int, watts: float) -> None:
        """amdsmi_set_power_cap, in microwatts."""
        smi = self._smi
        try:
            smi.amdsmi_set_power_cap(self._handles[index], 0, round(watts * 1e6))
        except smi.AmdSmiLibraryException as exc:
            if exc.get_error_code() == _NOT_SUPPORTED:
                raise NotSupported(str(exc)) from None
            if exc.get_error_code() == _NO_PERM:
                raise PermissionDenied(f"{exc} (the agent needs root for this)") from None
            raise

    def lock_clocks_mhz(self, index: int, max_mhz: float) -> None:
        """Not through this backend."""
        raise NotSupported("clock locking is not implemented for AMD GPUs: power caps are used")

    def reset_clocks(self, index: int) -> None:
        """Not through this backend."""
        raise NotSupported("clock locking is not implemented for AMD GPUs")

    def self_test(self, level: int = 1) -> dict[str, Any]:
        """Amdsmi's word on every GPU, then the AMD suite at ``level`` where installed."""
        count = self.device_count()
        return run_self_test(
            count,
            which=self._which,
            timeout_s=TIMEOUT_S[level],
            budget_s=SUITE_S[level],
            stop=self._stop,
            tools=amd_tools(level),
            cuda=False,
            checks=gpu_checks(count, self.read),
            bandwidth=level >= 2,
        )
