"""Intel backend on ``xpu-smi`` (Intel XPU Manager's CLI, over Level Zero Sysman), JSON output.

No maintained Python binding of Level Zero Sysman is on the package index, so the agent runs
``xpu-smi`` and reads its ``-j`` output: ``discovery -j`` lists the GPUs, ``discovery -d N -j``
gives a GPU's uuid, name and memory, ``stats -d N -j`` its readings (device level). A metric
xpu-smi does not print is ``None``; a GPU whose stats cannot be read is lost. The device-level
power limit is read with ``config -d N -j`` and set with ``config -d N --powerlimit W``; clocks
are not controlled. The self-test is ``xpu-smi diag`` at the level asked, on every GPU.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

from node_agent.backends import diag_output, selftest
from node_agent.backends.base import ReadOnlyControls
from node_agent.backends.selftest import Tool, gpu_checks, run_self_test
from node_agent.errors import BackendUnavailable, NotSupported, PermissionDenied
from node_agent.model import Capabilities, GpuReading, NodeChecks, PowerLimits, version_text

log = logging.getLogger("node_agent.intel")

MIB: Final = 1024 * 1024
TIMEOUT_S: Final = 10.0

Run = Callable[[Sequence[str]], str]
"""Runs ``xpu-smi`` with these arguments and returns its stdout (``RuntimeError`` on failure)."""

RANGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s+to\s+(\d+(?:\.\d+)?)\s*$")
"""``power_vaild_range`` as xpu-smi prints it (sic): ``"1 to 150"``, watts."""


class XpuSmiError(RuntimeError):
    """xpu-smi refused; ``error`` is the ``"error"`` text of its JSON answer when it printed one."""

    def __init__(self, message: str, error: str = "") -> None:
        super().__init__(message)
        self.error = error


def run_xpu_smi(args: Sequence[str]) -> str:
    """``xpu-smi ARGS`` → stdout; a missing tool, a timeout or an error exit → XpuSmiError."""
    what = f"xpu-smi {' '.join(args)}"
    try:
        proc = subprocess.run(
            ["xpu-smi", *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise XpuSmiError(f"{what}: {exc}") from None
    if proc.returncode != 0:
        error = _error_of(proc.stdout)
        detail = error or proc.stderr.strip()[:300]
        raise XpuSmiError(f"{what}: exit {proc.returncode}: {detail}", error)
    return proc.stdout


def _error_of(stdout: str) -> str:
    """The ``"error"`` of a JSON answer (``-j``), or ``""``."""
    try:
        answer = json.loads(stdout)
    except ValueError:
        return ""
    return str(answer.get("error") or "") if isinstance(answer, dict) else ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


class IntelBackend(ReadOnlyControls):
    """Intel Data Center / Flex / Arc GPUs read through xpu-smi."""

    name = "intel"
    what = "Intel GPUs"

    def __init__(
        self,
        *,
        run: Run | None = None,
        dev_root: Path = Path("/dev"),
        root: bool | None = None,
        tool_dirs: Sequence[Path] = selftest.DEFAULT_TOOL_DIRS,
    ) -> None:
        self._which = selftest.finder(tool_dirs)
        self._stop = threading.Event()
        """Set by ``close``: a self-test running stops."""
        self._run = run
        self._dev_root = dev_root
        self._root = os.geteuid() == 0 if root is None else root
        self._ids: list[int] = []
        self._info: dict[int, dict[str, Any]] = {}
        self._driver_ok = True
        self._limits: dict[int, PowerLimits | None] = {}
        self._limit_w: dict[int, float] = {}

    def _json(self, *args: str) -> Any:
        assert self._run is not None
        return json.loads(self._run(args))

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """List the GPUs (``xpu-smi discovery -j``) and read each one's identity."""
        self._stop.clear()
        if self._run is None:
            if shutil.which("xpu-smi") is None:
                raise BackendUnavailable(
                    "xpu-smi is not installed (Intel XPU Manager: it reads the GPUs through "
                    "Level Zero); use --backend simulated to try the agent"
                )
            self._run = run_xpu_smi
        try:
            listing = self._json("discovery", "-j")
            devices = listing.get("device_list") if isinstance(listing, dict) else listing
            self._ids = [int(d["device_id"]) for d in devices or []]
        except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BackendUnavailable(f"xpu-smi lists no GPUs: {exc}") from None
        if not self._ids:
            raise BackendUnavailable("xpu-smi lists no GPUs")
        self._discover()

    def _discover(self) -> None:
        """Each GPU's identity, memory, driver and firmware (``discovery -d N -j``)."""
        for device in self._ids:
            try:
                info = self._json("discovery", "-d", str(device), "-j")
            except (RuntimeError, ValueError) as exc:
                log.warning("gpu %d: no details from xpu-smi: %s", device, exc)
                info = None
            if isinstance(info, dict):
                self._info[device] = info
            else:  # what was read before stays (its uuid above all)
                self._info.setdefault(device, {})

    def close(self) -> None:
        """Nothing to release."""
        self._stop.set()  # a self-test running stops

    def device_count(self) -> int:
        """GPUs xpu-smi listed at open."""
        return len(self._ids)

    # -- reads ------------------------------------------------------------------------------
    def read(self, index: int) -> GpuReading:
        """One GPU's readings (``xpu-smi stats -d N -j``, device level)."""
        device = self._ids[index]
        info = self._info.get(device, {})
        uuid = str(info.get("uuid") or f"INTEL-index-{index}")
        model = str(info["device_name"]) if info.get("device_name") else None
        try:
            stats = self._json("stats", "-d", str(device), "-j")
            metrics = {
                str(m["metrics_type"]): m.get("value")
                for m in stats.get("device_level") or []
                if isinstance(m, dict) and "metrics_type" in m
            }
        except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("gpu %d is lost: %s", index, exc)
            self._driver_ok = False
            return GpuReading(index=index, uuid=uuid, model=model, vendor="intel", lost=True)
        self._driver_ok = True
        total = _number(info.get("memory_physical_size_byte"))
        uncorrectable = _number(metrics.get("XPUM_STATS_RAS_ERROR_CAT_CACHE_ERRORS_UNCORRECTABLE"))
        return GpuReading(
            index=index,
            uuid=uuid,
            model=model,
            vendor="intel",
            temperature_c=_number(metrics.get("XPUM_STATS_GPU_CORE_TEMPERATURE")),
            power_w=_number(metrics.get("XPUM_STATS_POWER")),
            utilization_pct=_number(metrics.get("XPUM_STATS_GPU_UTILIZATION")),
            memory_total_mib=total / MIB if total is not None else None,
            memory_used_mib=_number(metrics.get("XPUM_STATS_MEMORY_USED")),
            sm_clock_mhz=_number(metrics.get("XPUM_STATS_GPU_FREQUENCY")),
            ecc_uncorrected=int(uncorrectable) if uncorrectable is not None else None,
            power_limit_w=self._limit_w.get(index),
            pci_bus_id=str(info["pci_bdf_address"]) if info.get("pci_bdf_address") else None,
            driver_version=version_text(info.get("driver_version")),
            firmware_version=version_text(info.get("gfx_firmware_version")),
        )

    def node_checks(self) -> NodeChecks:
        """xpu-smi answered at the last read; the DRM device nodes exist."""
        return NodeChecks(
            driver_ok=self._driver_ok, device_nodes_ok=(self._dev_root / "dri").exists()
        )

    # -- control ----------------------------------------------------------------------------
    def capabilities(self, index: int) -> Capabilities:
        """A device-level power limit where xpu-smi reads one; no clock locking, no processes."""
        return Capabilities(power_limit=self.power_limits(index) is not None)

    def power_limits(self, index: int) -> PowerLimits | None:
        """``config -d N -j``: the valid range; read once per GPU.

        xpu-smi prints no default limit, so the top of the valid range stands for it (what the
        agent restores after a cap).
        """
        if index in self._limits:
            return self._limits[index]
        limits = None
        try:
            config = self._json("config", "-d", str(self._ids[index]), "-j")
        except (RuntimeError, ValueError) as exc:
            log.info("gpu %d: no power limit from xpu-smi: %s", index, exc)
            config = {}
        if isinstance(config, dict) and not config.get("error"):
            match = RANGE.match(str(config.get("power_vaild_range") or ""))
            current = _number(config.get("power_limit"))
            if match and float(match[2]) > 0:
                lo, hi = float(match[1]), float(match[2])
                limits = PowerLimits(min_w=lo, max_w=hi, default_w=hi)
                if current is not None and current > 0:
                    self._limit_w[index] = current
        self._limits[index] = limits
        return limits

    def set_power_limit_w(self, index: int, watts: float) -> None:
        """``config -d N --powerlimit W`` (whole watts, at least 1)."""
        if self.power_limits(index) is None:
            raise NotSupported("xpu-smi reads no power limit range for this GPU")
        limit = max(1, round(watts))
        try:
            answer = self._json(
                "config", "-d", str(self._ids[index]), "--powerlimit", str(limit), "-j"
            )
        except XpuSmiError as exc:
            self._refused(exc.error or str(exc))
        except ValueError:
            answer = {}
        if isinstance(answer, dict) and answer.get("error"):
            self._refused(str(answer["error"]))
        self._limit_w[index] = float(limit)

    def _refused(self, error: str) -> NoReturn:
        """Classify xpu-smi's refusal of a setting.

        Its message names both causes at once ("unsupported feature or insufficient privilege"),
        so who the agent runs as decides: not root is a missing permission.
        """
        if not self._root:
            raise PermissionDenied(f"xpu-smi: {error} (the agent needs root for this)")
        if "unsupported" in error.lower():
            raise NotSupported(f"xpu-smi: {error}")
        raise XpuSmiError(f"xpu-smi: {error}", error)

    def self_test(self, level: int = 1) -> dict[str, Any]:
        """Each GPU reads, then ``xpu-smi diag`` at ``level`` (1 to 3) on every GPU.

        The GPUs' details are read again first: after a driver or firmware update the
        versions reported from then on are the new ones.
        """
        self._discover()
        tools = [
            Tool(
                f"xpu-smi-diag-gpu{d}",
                ("xpu-smi", "diag", "-d", str(d), "-l", str(level)),
                diag_output.xpu_diag,
            )
            for d in self._ids
        ]
        count = self.device_count()
        return run_self_test(
            count,
            which=self._which,
            timeout_s=selftest.TIMEOUT_S[level],
            budget_s=selftest.SUITE_S[level],
            stop=self._stop,
            tools=tools,
            cuda=False,
            checks=gpu_checks(count, self.read),
        )
