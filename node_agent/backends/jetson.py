"""Jetson backend: NVML reports nothing useful on Jetson, so read sysfs.

Temperature from ``/sys/class/thermal/thermal_zone*/{type,temp}`` (the GPU zone, millidegrees),
power from the INA3221 monitors (``/sys/bus/i2c/drivers/ina3221*/…`` iio or hwmon files, or
``/sys/class/hwmon``), load from ``/sys/devices/gpu.0/load`` (per mille), clocks from devfreq,
memory from /proc/meminfo (Jetson GPUs share system memory). Every path sits under a root
that tests point at a recorded tree. Power limits are nvpmodel's business: not supported.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from node_agent.backends.base import ReadOnlyControls
from node_agent.backends.selftest import (
    DEFAULT_TOOL_DIRS,
    SUITE_S,
    TIMEOUT_S,
    finder,
    nvidia_tools,
    run_self_test,
)
from node_agent.errors import BackendUnavailable, NotSupported
from node_agent.model import GpuReading, NodeChecks

log = logging.getLogger("node_agent.jetson")

GPU_ZONE_TYPES: Final = ("gpu-thermal", "GPU-therm", "gpu_therm", "GPU-thermal")
GPU_RAIL_LABELS: Final = ("VDD_GPU_SOC", "VDD_GPU", "GPU", "VDD_CPU_GPU_CV", "POM_5V_GPU")
LOAD_FILES: Final = (
    "sys/devices/gpu.0/load",
    "sys/devices/platform/gpu.0/load",
    "sys/devices/platform/17000000.ga10b/load",
    "sys/devices/platform/17000000.gv11b/load",
)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _num(path: Path) -> float | None:
    text = _read(path)
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


class JetsonBackend(ReadOnlyControls):
    """The integrated GPU of a Jetson module, read from sysfs."""

    name = "jetson"
    what = "Jetson"

    def __init__(
        self,
        *,
        root: Path = Path("/"),
        load_file: str | None = None,
        tool_dirs: Sequence[Path] = DEFAULT_TOOL_DIRS,
    ) -> None:
        self._which = finder(tool_dirs)
        self._stop = threading.Event()
        """Set by ``close``: a self-test running stops."""
        self._root = root
        self._load_file = load_file
        self._zone: Path | None = None
        self._load: Path | None = None
        self._model = "Jetson"

    def open(self) -> None:
        """Find the GPU's thermal zone and load file."""
        self._stop.clear()
        thermal = self._root / "sys/class/thermal"
        for zone in sorted(thermal.glob("thermal_zone*")):
            if _read(zone / "type") in GPU_ZONE_TYPES:
                self._zone = zone
                break
        candidates = [self._load_file] if self._load_file else list(LOAD_FILES)
        for rel in candidates:
            if rel and (self._root / rel).exists():
                self._load = self._root / rel
                break
        if self._zone is None and self._load is None:
            raise BackendUnavailable(
                f"no Jetson GPU found under {self._root} (no GPU thermal zone, no gpu.0/load); "
                "is this a Jetson with sysfs mounted?"
            )
        model = _read(self._root / "proc/device-tree/model")
        if model:
            self._model = model.rstrip("\x00")

    def close(self) -> None:
        """Nothing to release."""
        self._stop.set()  # a self-test running stops

    def device_count(self) -> int:
        """One integrated GPU."""
        return 1

    def _gpu_power_w(self) -> float | None:
        # hwmon style (JetPack 5+): inN_label, inN_input (mV), currN_input (mA)
        roots = [
            *self._root.glob("sys/bus/i2c/drivers/ina3221*/*/hwmon/hwmon*"),
            *self._root.glob("sys/class/hwmon/hwmon*"),
        ]
        for hwmon in roots:
            for label_file in sorted(hwmon.glob("in*_label")):
                if _read(label_file) in GPU_RAIL_LABELS:
                    n = re.sub(r"\D", "", label_file.name)
                    mv = _num(hwmon / f"in{n}_input")
                    ma = _num(hwmon / f"curr{n}_input")
                    if mv is not None and ma is not None:
                        return mv * ma / 1e6
        # iio style (JetPack 4): rail_name_N, in_power{N}_input (mW)
        for iio in self._root.glob("sys/bus/i2c/drivers/ina3221*/*/iio:device*"):
            for rail in sorted(iio.glob("rail_name_*")):
                if _read(rail) in GPU_RAIL_LABELS:
                    n = rail.name.rsplit("_", 1)[-1]
                    mw = _num(iio / f"in_power{n}_input")
                    if mw is not None:
                        return mw / 1000.0
        return None

    def _clocks_mhz(self) -> tuple[float | None, float | None]:
        for devfreq in self._root.glob("sys/class/devfreq/*"):
            name = devfreq.name
            if "gpu" in name or "ga10b" in name or "gv11b" in name or "gp10b" in name:
                cur = _num(devfreq / "cur_freq")
                top = _num(devfreq / "max_freq")
                return (cur / 1e6 if cur else None, top / 1e6 if top else None)
        return None, None

    def _memory_mib(self) -> tuple[float | None, float | None]:
        text = _read(self._root / "proc/meminfo")
        if text is None:
            return None, None
        info = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                info[key] = float(parts[0])
        total, avail = info.get("MemTotal"), info.get("MemAvailable")
        if total is None:
            return None, None
        return total / 1024, (total - avail) / 1024 if avail is not None else None

    def read(self, index: int) -> GpuReading:
        """The GPU's temperature, rail power, load, clocks and (shared) memory."""
        temp_milli = _num(self._zone / "temp") if self._zone else None
        load = _num(self._load) if self._load else None
        cur, top = self._clocks_mhz()
        total, used = self._memory_mib()
        serial = _read(self._root / "proc/device-tree/serial-number")
        return GpuReading(
            vendor="nvidia",
            index=0,
            uuid=f"JETSON-{serial.rstrip(chr(0))}" if serial else "JETSON-0",
            model=self._model,
            temperature_c=temp_milli / 1000.0 if temp_milli is not None else None,
            power_w=self._gpu_power_w(),
            power_limit_w=None,
            utilization_pct=load / 10.0 if load is not None else None,
            memory_total_mib=total,
            memory_used_mib=used,
            sm_clock_mhz=cur,
            sm_clock_max_mhz=top,
        )

    def node_checks(self) -> NodeChecks:
        """The GPU's sysfs nodes are there."""
        ok = (self._load is None or self._load.exists()) and (
            self._zone is None or self._zone.exists()
        )
        return NodeChecks(
            driver_ok=ok, device_nodes_ok=(self._root / "dev/nvhost-gpu").exists() or None
        )

    def set_power_limit_w(self, index: int, watts: float) -> None:
        """Not supported."""
        raise NotSupported("Jetson power is set with nvpmodel modes, not a power limit")

    def self_test(self, level: int = 1) -> dict[str, Any]:
        """The NVIDIA suite at ``level`` and the CUDA context probe, where present."""
        count = self.device_count()
        return run_self_test(
            count,
            timeout_s=TIMEOUT_S[level],
            budget_s=SUITE_S[level],
            stop=self._stop,
            tools=nvidia_tools(level, count),
            which=self._which,
        )
