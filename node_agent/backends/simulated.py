"""A deterministic, seeded simulated backend with a first-order thermal model.

Power follows utilisation and the applied clock / power limit; temperature follows power with a
time constant. Scripted scenarios make the faults an operator must trust the agent with happen
on cue (``scenario_after_s`` after ``open``) and hold them until the agent restarts, or, for
``xid-79``, until a passing self-test resets the GPU. Used by ``make run``, the tests and the
benchmarks. Imports ``model``, ``errors`` and ``selftest``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from node_agent.backends.selftest import Check, verdict_of
from node_agent.errors import BackendUnavailable, NotSupported
from node_agent.model import (
    Capabilities,
    GpuProcess,
    GpuReading,
    NodeChecks,
    PowerLimits,
    XidEvent,
)

log = logging.getLogger("node_agent.simulated")

SCENARIOS: Final = (
    "steady",
    "overheat",
    "cabinet-overheat",
    "gpu-lost",
    "xid-79",
    "ecc",
    "unsupported-fields",
    "flapping-link",
    "fails-validation",
)


def _parse_processes(text: str) -> dict[int, tuple[GpuProcess, ...]]:
    """The ``--pod-processes`` document; ``ValueError`` (and the like) when it is not valid."""
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object of GPU index → processes")
    out: dict[int, tuple[GpuProcess, ...]] = {}
    for key, entries in doc.items():
        index = int(key)
        procs = []
        for k, e in enumerate(entries):
            used = float(e["used_mib"])
            if not math.isfinite(used) or used < 0:
                raise ValueError(f"GPU {index}: used_mib {e['used_mib']!r} is not a size")
            procs.append(GpuProcess(pid=10_000 + 100 * index + k, used_mib=used,
                                    pod_uid=str(e["pod_uid"]),
                                    container=str(e.get("container", "app"))))  # fmt: skip
        out[index] = tuple(procs)
    return out


@dataclass(frozen=True, slots=True)
class GpuModel:
    """Static properties of a simulated GPU model."""

    name: str
    tdp_w: float
    idle_w: float
    min_limit_w: float
    memory_mib: float
    max_clock_mhz: float
    thermal_resistance_c_per_w: float
    """°C above ambient per watt at steady state."""
    vendor: str = "nvidia"


MODELS: Final = (
    GpuModel("Tesla T4", 70.0, 10.0, 60.0, 15360.0, 1590.0, 0.72),
    GpuModel("NVIDIA A10", 150.0, 20.0, 100.0, 23028.0, 1695.0, 0.34),
    GpuModel("NVIDIA L4", 72.0, 12.0, 40.0, 23034.0, 2040.0, 0.70),
)
"""The models a node gets when none is named."""

OTHER_MODELS: Final = (
    GpuModel("AMD Instinct MI210", 300.0, 40.0, 100.0, 65520.0, 1700.0, 0.19, "amd"),
    GpuModel("Intel Data Center GPU Flex 170", 150.0, 25.0, 80.0, 16384.0, 2050.0, 0.33, "intel"),
)
"""Models of other vendors, by name only (``--model``)."""

TIME_CONSTANT_S: Final = 40.0
"""How fast temperature follows power (a heatsink-sized thermal mass)."""

XID_REPEAT_S: Final = 60.0
"""How often the ``xid-79`` GPU raises its XID again until a self-test resets it: well inside
the agent's 300 s hold of a fatal XID, so that the GPU stays unhealthy for as long as the fault
lasts, not for a fixed time after it began."""


@dataclass(slots=True)
class _Gpu:
    index: int
    uuid: str
    model: GpuModel
    ambient_c: float
    base_util_pct: float
    amplitude_pct: float
    period_s: float
    phase: float
    temperature_c: float
    power_limit_w: float
    locked_clock_mhz: float | None = None
    ecc_uncorrected: int = 0
    lost: bool = False
    xid_next_at: float | None = None
    """When the XID is raised again (None: not raised yet)."""
    xid_reset: bool = False
    """A passing self-test reset the GPU after its XID: no XID from it since."""
    last_t: float | None = None
    rng: random.Random = field(default_factory=random.Random)


class SimulatedBackend:
    """N simulated GPUs on one node, deterministic for a given seed, node name and clock."""

    name = "simulated"

    def __init__(
        self,
        *,
        gpus: int = 4,
        seed: int = 0,
        node: str = "sim-node",
        scenario: str = "steady",
        scenario_after_s: float = 20.0,
        clock: Callable[[], float],
        load_pct: float | None = None,
        model: str | None = None,
        pod_processes: Path | None = None,
    ) -> None:
        if scenario not in SCENARIOS:
            raise BackendUnavailable(
                f"unknown scenario {scenario!r}; choose one of: {', '.join(SCENARIOS)}"
            )
        if not 1 <= gpus <= 64:
            raise BackendUnavailable("a simulated node has 1 to 64 GPUs")
        self.scenario = scenario
        self._clock = clock
        self._after_s = scenario_after_s
        self._node = node
        self._count = gpus
        digest = hashlib.sha256(f"{seed}:{node}".encode()).digest()
        self._seed = int.from_bytes(digest[:8], "big")
        self._load_pct = load_pct
        self._pod_processes = pod_processes
        self._procs: dict[int, tuple[GpuProcess, ...]] = {}
        self._procs_text: str | None = None
        self._bad_processes_file: tuple[str | None, str] | None = None
        names = [m.name for m in (*MODELS, *OTHER_MODELS)]
        if model is not None and model not in names:
            raise BackendUnavailable(
                f"unknown simulated model {model!r}; one of: {', '.join(names)}"
            )
        self._model_name = model
        self._gpus: list[_Gpu] = []
        self._start = 0.0
        self._opened = False

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """Build the GPUs; time zero for the scenario is now."""
        rng = random.Random(self._seed)
        model = MODELS[rng.randrange(len(MODELS))]
        if self._model_name is not None:
            model = next(m for m in (*MODELS, *OTHER_MODELS) if m.name == self._model_name)
        self._start = self._clock()
        self._gpus = []
        for i in range(self._count):
            ambient = rng.uniform(24.0, 34.0)
            base = self._load_pct if self._load_pct is not None else rng.uniform(5.0, 90.0)
            gpu = _Gpu(
                index=i,
                uuid="GPU-" + hashlib.sha256(f"{self._seed}:{i}".encode()).hexdigest()[:32],
                model=model,
                ambient_c=ambient,
                base_util_pct=base,
                amplitude_pct=0.0 if self._load_pct is not None else rng.uniform(0.0, 15.0),
                period_s=rng.uniform(120.0, 600.0),
                phase=rng.uniform(0.0, 2 * math.pi),
                temperature_c=ambient,
                power_limit_w=model.tdp_w,
                rng=random.Random(self._seed + i + 1),
            )
            if self._overheats(i):
                gpu.base_util_pct = 95.0
            # Start at the steady temperature of the base load, as a GPU that has been running.
            start_w = model.idle_w + (model.tdp_w - model.idle_w) * gpu.base_util_pct / 100.0
            gpu.temperature_c = ambient + model.thermal_resistance_c_per_w * start_w
            self._gpus.append(gpu)
        self._opened = True

    def _overheats(self, index: int) -> bool:
        """Whether this GPU's scenario heats it: GPU 0 (overheat) or every GPU (cabinet)."""
        return self.scenario == "cabinet-overheat" or (self.scenario == "overheat" and index == 0)

    def close(self) -> None:
        """Nothing to release."""
        self._opened = False

    def device_count(self) -> int:
        """Number of simulated GPUs."""
        return self._count

    # -- model ------------------------------------------------------------------------------
    def _elapsed(self) -> float:
        return self._clock() - self._start

    def _in_fault(self) -> bool:
        return self._elapsed() >= self._after_s

    def _advance(self, gpu: _Gpu) -> tuple[float, float, float, tuple[str, ...]]:
        """Step the model to now; returns (utilisation %, power W, SM clock MHz, reasons)."""
        now = self._clock()
        t = now - self._start
        util = gpu.base_util_pct + gpu.amplitude_pct * math.sin(
            2 * math.pi * t / gpu.period_s + gpu.phase
        )
        util = min(max(util + gpu.rng.gauss(0.0, 2.0), 0.0), 100.0)
        m = gpu.model
        clock_cap = gpu.locked_clock_mhz if gpu.locked_clock_mhz is not None else m.max_clock_mhz
        clock_frac = min(clock_cap / m.max_clock_mhz, 1.0)
        wanted = m.idle_w + (m.tdp_w - m.idle_w) * (util / 100.0) * clock_frac**1.5
        reasons: list[str] = []
        power = wanted
        clock = clock_cap if util > 1.0 else min(clock_cap, 300.0)
        if wanted > gpu.power_limit_w:
            power = gpu.power_limit_w
            clock = clock * (gpu.power_limit_w / wanted) ** (1 / 1.5)
            reasons.append("sw_power_cap")
        if gpu.locked_clock_mhz is not None:
            reasons.append("applications_clocks_setting")
        ambient = gpu.ambient_c
        if self._overheats(gpu.index) and self._in_fault():
            ambient = 48.0  # blocked airflow in the cabinet
        target = ambient + m.thermal_resistance_c_per_w * power
        dt = 0.0 if gpu.last_t is None else max(now - gpu.last_t, 0.0)
        gpu.temperature_c += (target - gpu.temperature_c) * (1.0 - math.exp(-dt / TIME_CONSTANT_S))
        gpu.last_t = now
        if gpu.temperature_c >= 83.0:
            reasons.append("sw_thermal_slowdown")
        return util, power, clock, tuple(reasons)

    def read(self, index: int) -> GpuReading:
        """Sample one GPU (advancing its model to now)."""
        gpu = self._gpus[index]
        if self.scenario == "gpu-lost" and index == self._count - 1 and self._in_fault():
            gpu.lost = True
        if gpu.lost:
            return GpuReading(
                index=index, uuid=gpu.uuid, model=gpu.model.name, vendor=gpu.model.vendor, lost=True
            )
        util, power, clock, reasons = self._advance(gpu)
        if self.scenario == "ecc" and index == 0 and self._in_fault():
            gpu.ecc_uncorrected = max(gpu.ecc_uncorrected, 2)
        m = gpu.model
        # Memory follows the work's size (its base load), not the moment's utilisation noise.
        procs = self._processes(index)
        used = 300.0 + (gpu.base_util_pct / 100.0) * 0.6 * m.memory_mib
        used = min(used + sum(p.used_mib or 0.0 for p in procs), m.memory_mib)
        unsupported = self.scenario == "unsupported-fields"
        return GpuReading(
            index=index,
            uuid=gpu.uuid,
            model=m.name,
            vendor=m.vendor,
            temperature_c=round(gpu.temperature_c, 1),
            power_w=None if unsupported else round(power, 1),
            power_limit_w=None if unsupported else gpu.power_limit_w,
            utilization_pct=round(util, 1),
            memory_total_mib=m.memory_mib,
            memory_used_mib=round(used, 0),
            sm_clock_mhz=None if unsupported else round(clock, 0),
            sm_clock_max_mhz=None if unsupported else m.max_clock_mhz,
            throttle_reasons=() if unsupported else reasons,
            ecc_uncorrected=None if unsupported else gpu.ecc_uncorrected,
            pci_bus_id=f"0000:{index + 1:02x}:00.0",
            processes=procs,
        )

    def _processes(self, index: int) -> tuple[GpuProcess, ...]:
        """Pods' GPU processes from the ``pod_processes`` file (parsed again when it changes).

        JSON: GPU index → list of ``{"pod_uid", "used_mib", "container"}``, ``used_mib`` a
        finite number ≥ 0. A missing or bad file means no processes on any GPU (said once
        per version of the file).
        """
        if self._pod_processes is None:
            return ()
        try:
            text = self._pod_processes.read_text()
        except OSError as exc:
            text, self._procs = None, {}
            self._say_once(text, str(exc))
        if text is not None and text != self._procs_text:
            try:
                self._procs = _parse_processes(text)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self._procs = {}
                self._say_once(text, str(exc))
        self._procs_text = text
        return self._procs.get(index, ())

    def _say_once(self, text: str | None, error: str) -> None:
        if self._bad_processes_file != (text, error):
            log.warning("simulated pod processes from %s: %s", self._pod_processes, error)
            self._bad_processes_file = (text, error)

    def node_checks(self) -> NodeChecks:
        """The simulated driver is always there."""
        return NodeChecks(driver_ok=True, device_nodes_ok=True, cuda_ctx_success_ratio=1.0)

    def poll_xids(self, now: float) -> list[XidEvent]:
        """XID 79 on GPU 0 in the ``xid-79`` scenario, raised until the GPU is reset.

        Raised when the fault starts and every ``XID_REPEAT_S`` after, until a passing
        self-test resets the GPU (a restarted agent starts the scenario over).
        """
        if self.scenario != "xid-79" or not self._in_fault():
            return []
        gpu = self._gpus[0]
        t = self._clock()
        if gpu.xid_reset or (gpu.xid_next_at is not None and t < gpu.xid_next_at):
            return []
        gpu.xid_next_at = t + XID_REPEAT_S
        return [XidEvent(index=0, xid=79, at=now)]

    # -- control ----------------------------------------------------------------------------
    def capabilities(self, index: int) -> Capabilities:
        """Everything (processes with a pod processes file), but in ``unsupported-fields``."""
        if self.scenario == "unsupported-fields":
            return Capabilities(xid_events=True)
        return Capabilities(
            power_limit=True,
            locked_clocks=True,
            xid_events=True,
            processes=self._pod_processes is not None,
        )

    def power_limits(self, index: int) -> PowerLimits | None:
        """The model's range: min limit .. TDP."""
        if self.scenario == "unsupported-fields":
            return None
        m = self._gpus[index].model
        return PowerLimits(min_w=m.min_limit_w, max_w=m.tdp_w, default_w=m.tdp_w)

    def _settable(self, index: int) -> _Gpu:
        if self.scenario == "unsupported-fields":
            raise NotSupported("this simulated GPU reports no power or clock control")
        return self._gpus[index]

    def set_power_limit_w(self, index: int, watts: float) -> None:
        """Apply a power limit within the model's range."""
        gpu = self._settable(index)
        m = gpu.model
        if not m.min_limit_w <= watts <= m.tdp_w:
            raise ValueError(f"{watts} W is outside {m.min_limit_w}..{m.tdp_w} W")
        gpu.power_limit_w = watts

    def lock_clocks_mhz(self, index: int, max_mhz: float) -> None:
        """Lock the SM clock."""
        self._settable(index).locked_clock_mhz = max_mhz

    def reset_clocks(self, index: int) -> None:
        """Unlock the SM clock."""
        self._settable(index).locked_clock_mhz = None

    def self_test(self, level: int = 1) -> dict[str, Any]:
        """A lost GPU or one with uncorrectable ECC errors fails; an XID alone passes.

        As on real hardware once the driver has reset the GPU after an XID: a GPU that raised
        one raises it no more after a pass. ``fails-validation``: a diagnostic fails at every
        level, while the GPUs report healthy (what a regression after a driver change looks
        like).
        """
        started = time.monotonic()
        checks = []
        if self.scenario == "fails-validation":
            checks.append(
                Check(
                    f"simulated-diag-r{level}",
                    "fail",
                    "simulated diagnostic failure (scenario fails-validation)",
                )
            )
        for gpu in self._gpus:
            bad = "lost" if gpu.lost else "uncorrectable ECC errors" if gpu.ecc_uncorrected else ""
            checks.append(Check(f"simulated-gpu{gpu.index}", "fail" if bad else "pass", bad))
            if not bad and gpu.xid_next_at is not None:
                gpu.xid_reset = True
        return verdict_of(checks, len(checks), started)
