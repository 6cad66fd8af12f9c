"""Intel backend on ``xpu-smi`` (Intel XPU Manager's CLI, over Level Zero Sysman), JSON output.

No maintained Python binding of Level Zero Sysman is on the package index, so the agent runs
``xpu-smi`` and reads its ``-j`` output: ``discovery -j`` lists the GPUs, ``discovery -d N -j``
gives a GPU's uuid, name and memory, ``stats -d N -j`` its readings (device level). A metric
xpu-smi does not print is ``None``; a GPU whose stats cannot be read is lost. Nothing is
controlled through this backend yet (power limits and clocks are not supported); the self-test
is ``xpu-smi diag`` level 1 on every GPU.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from node_agent.backends.base import ReadOnlyControls
from node_agent.errors import BackendUnavailable
from node_agent.model import GpuReading, NodeChecks
from node_agent.selftest import run_self_test

log = logging.getLogger("node_agent.intel")

MIB: Final = 1024 * 1024
TIMEOUT_S: Final = 10.0

Run = Callable[[Sequence[str]], str]
"""Runs ``xpu-smi`` with these arguments and returns its stdout (``RuntimeError`` on failure)."""


def run_xpu_smi(args: Sequence[str]) -> str:
    """``xpu-smi ARGS`` → stdout; a missing tool, a timeout or an error exit → RuntimeError."""
    try:
        proc = subprocess.run(
            ["xpu-smi", *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"xpu-smi {' '.join(args)}: {exc}") from None
    if proc.returncode != 0:
        raise RuntimeError(
            f"xpu-smi {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()[:300]}"
        )
    return proc.stdout


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
    what = "Intel GPUs (yet)"

    def __init__(self, *, run: Run | None = None, dev_root: Path = Path("/dev")) -> None:
        self._run = run
        self._dev_root = dev_root
        self._ids: list[int] = []
        self._info: dict[int, dict[str, Any]] = {}
        self._driver_ok = True

    def _json(self, *args: str) -> Any:
        assert self._run is not None
        return json.loads(self._run(args))

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """List the GPUs (``xpu-smi discovery -j``) and read each one's identity."""
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
        for device in self._ids:
            try:
                info = self._json("discovery", "-d", str(device), "-j")
            except (RuntimeError, ValueError) as exc:
                log.warning("gpu %d: no details from xpu-smi: %s", device, exc)
                info = {}
            self._info[device] = info if isinstance(info, dict) else {}

    def close(self) -> None:
        """Nothing to release."""

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
        )

    def node_checks(self) -> NodeChecks:
        """xpu-smi answered at the last read; the DRM device nodes exist."""
        return NodeChecks(
            driver_ok=self._driver_ok, device_nodes_ok=(self._dev_root / "dri").exists()
        )

    def self_test(self) -> dict[str, Any]:
        """``xpu-smi diag`` level 1 on every GPU."""
        tools = [
            (f"xpu-smi-diag-gpu{d}", ["xpu-smi", "diag", "-d", str(d), "-l", "1"])
            for d in self._ids
        ]
        return run_self_test(self.device_count(), tools=tools, cuda=False)
