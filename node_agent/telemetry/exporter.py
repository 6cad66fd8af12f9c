"""Prometheus metrics of the node agent, with the names of DESIGN.md §6.

``node_gpu_temperature_celsius{device="0",…}`` is the name the seed's alert rule uses. A value
the backend cannot read is left out, never exported as 0. Imports prometheus-client, ``model``
and the extender's field table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from node_agent.model import GpuHealth, GpuReading, NodeChecks
from scheduler_extender.telemetry.fields import GPU_FIELDS

HEALTH_VALUE = {"healthy": 0.0, "degraded": 1.0, "unhealthy": 2.0}
_LABELS = ["device", "uuid", "model", "node"]


MAX_STEP_S = 60.0
"""A gap between two samples longer than this (an agent stall) adds no energy: power between
them is unknown."""


@dataclass(slots=True)
class EnergyMeter:
    """Joules each GPU has drawn since the agent started, and each pod's share of them.

    Trapezoidal integration of the sampled power. A pod's share of an interval is its share of
    the memory that the GPU's processes hold (NVML gives no per-process power; memory is the
    share every backend reports): a GPU with no process mapped to a pod attributes its energy to
    no pod, so the pods' sum can be less than the GPU's.
    """

    gpu_j: dict[str, float] = field(default_factory=dict)
    """By GPU uuid."""
    pod_j: dict[tuple[str, str, str], float] = field(default_factory=dict)
    """By (GPU uuid, pod uid, container)."""
    _last: dict[str, tuple[float, float]] = field(default_factory=dict)

    def add(self, readings: list[GpuReading], now: float) -> None:
        """Account one sample of every GPU taken at ``now`` (monotonic seconds)."""
        for r in readings:
            if r.lost or r.power_w is None:
                self._last.pop(r.uuid, None)
                continue
            last = self._last.get(r.uuid)
            self._last[r.uuid] = (now, r.power_w)
            if last is None or not 0 < now - last[0] <= MAX_STEP_S:
                continue
            joules = (now - last[0]) * (last[1] + r.power_w) / 2.0
            self.gpu_j[r.uuid] = self.gpu_j.get(r.uuid, 0.0) + joules
            held = [
                (p.pod_uid, p.container or "", p.used_mib or 0.0) for p in r.processes if p.pod_uid
            ]
            total = sum(mib for _, _, mib in held)
            for uid, container, mib in held:
                if total > 0 and mib > 0:
                    key = (r.uuid, uid, container)
                    self.pod_j[key] = self.pod_j.get(key, 0.0) + joules * mib / total


@dataclass(slots=True)
class LatestView:
    """What the exporter shows: the last sampling round."""

    node: str
    readings: list[GpuReading] = field(default_factory=list)
    health: dict[int, GpuHealth] = field(default_factory=dict)
    checks: NodeChecks = field(default_factory=NodeChecks)
    saving: dict[int, bool] = field(default_factory=dict)
    thermal_cap_w: dict[int, float | None] = field(default_factory=dict)
    xid_last: dict[int, int | None] = field(default_factory=dict)
    energy: EnergyMeter = field(default_factory=EnergyMeter)


_GAUGES = tuple((f.metric, f) for f in GPU_FIELDS if f.metric is not None)
"""The readings exported as gauges, as the field table names them."""


class _GpuCollector(Collector):
    def __init__(self, view: LatestView) -> None:
        self.view = view

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        view = self.view
        families = {name: GaugeMetricFamily(name, f.help, labels=_LABELS) for name, f in _GAUGES}
        health = GaugeMetricFamily(
            "node_gpu_health", "GPU health: 0 healthy, 1 degraded, 2 unhealthy.", labels=_LABELS
        )
        saving = GaugeMetricFamily(
            "node_gpu_power_saving_active",
            "1 while power saving holds the GPU's clocks or limit.",
            labels=_LABELS,
        )
        capped = GaugeMetricFamily(
            "node_gpu_thermal_cap_watts",
            "Power limit set by local thermal protection (absent = none).",
            labels=_LABELS,
        )
        info = GaugeMetricFamily(
            "node_gpu_info", "1 for each GPU, with its vendor.", labels=[*_LABELS, "vendor"]
        )
        by_pod = GaugeMetricFamily(
            "node_gpu_pod_memory_used_bytes",
            "GPU memory in use by a pod's processes, bytes (pods the agent could map).",
            labels=[*_LABELS, "pod_uid", "container"],
        )
        for r in view.readings:
            labels = [str(r.index), r.uuid, r.model or "", view.node]
            info.add_metric([*labels, r.vendor or ""], 1.0)
            per_pod: dict[tuple[str, str], float] = {}
            for p in r.processes:
                if p.pod_uid and p.used_mib is not None:
                    key = (p.pod_uid, p.container or "")
                    per_pod[key] = per_pod.get(key, 0.0) + p.used_mib
            for (uid, container), mib in sorted(per_pod.items()):
                by_pod.add_metric([*labels, uid, container], mib * 1048576.0)
            for name, f in _GAUGES:
                value = f.read(r)
                if value is not None:
                    families[name].add_metric(labels, value * f.scale)
            h = view.health.get(r.index)
            if h is not None:
                health.add_metric(labels, HEALTH_VALUE[h.level])
            saving.add_metric(labels, 1.0 if view.saving.get(r.index) else 0.0)
            cap = view.thermal_cap_w.get(r.index)
            if cap is not None:
                capped.add_metric(labels, cap)
        yield from families.values()
        yield health
        yield saving
        yield capped
        yield by_pod
        yield info
        gpu_energy = CounterMetricFamily(
            "edgegpu_gpu_energy_joules", "Energy the GPU drew since the agent started.",
            labels=_LABELS,
        )  # fmt: skip
        pod_energy = CounterMetricFamily(
            "edgegpu_pod_gpu_energy_joules",
            "A pod's share of its GPU's energy, by the memory its processes hold on it.",
            labels=[*_LABELS, "pod_uid", "container"],
        )
        labels_of = {
            r.uuid: [str(r.index), r.uuid, r.model or "", view.node] for r in view.readings
        }
        for uuid, joules in sorted(view.energy.gpu_j.items()):
            if uuid in labels_of:
                gpu_energy.add_metric(labels_of[uuid], joules)
        for (uuid, uid, container), joules in sorted(view.energy.pod_j.items()):
            if uuid in labels_of:
                pod_energy.add_metric([*labels_of[uuid], uid, container], joules)
        yield gpu_energy
        yield pod_energy
        ratio = GaugeMetricFamily(
            "node_gpu_cuda_context_success_ratio",
            "Share of recent CUDA context create/destroy probes that succeeded.",
            labels=["node"],
        )
        if view.checks.cuda_ctx_success_ratio is not None:
            ratio.add_metric([view.node], view.checks.cuda_ctx_success_ratio)
        yield ratio


DCGM_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id"]
"""dcgm-exporter's labels: NVIDIA's dashboards and alerts select and group by them."""
DCGM_GAUGES: tuple[tuple[str, str, Callable[[GpuReading], float | None]], ...] = (
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda r: r.temperature_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda r: r.power_w),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", lambda r: r.power_limit_w),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda r: r.utilization_pct),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda r: r.memory_used_mib),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).",
     lambda r: None if r.memory_total_mib is None or r.memory_used_mib is None
     else max(r.memory_total_mib - r.memory_used_mib, 0.0)),
    ("DCGM_FI_DEV_FB_TOTAL", "Total framebuffer memory (in MiB).", lambda r: r.memory_total_mib),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda r: r.sm_clock_mhz),
    ("DCGM_FI_DEV_FAN_SPEED", "Fan speed for the device in percent 0-100.",
     lambda r: r.fan_speed_pct),
)  # fmt: skip
"""dcgm-exporter's names and units for what the agent reads (``--dcgm-names``)."""


class _DcgmCollector(Collector):
    """The same readings under dcgm-exporter's names, units and labels."""

    def __init__(self, view: LatestView) -> None:
        self.view = view

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        view = self.view
        gauges = [(GaugeMetricFamily(name, text, labels=DCGM_LABELS), read)
                  for name, text, read in DCGM_GAUGES]  # fmt: skip
        xid = GaugeMetricFamily(
            "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.",
            labels=DCGM_LABELS,
        )  # fmt: skip
        # A gauge, so that the name stays dcgm-exporter's (a counter family would add _total).
        energy = GaugeMetricFamily(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "Total energy consumption since the agent started (in mJ).",
            labels=DCGM_LABELS,
        )
        xids = view.xid_last
        for r in view.readings:
            labels = [str(r.index), r.uuid, f"nvidia{r.index}", r.model or "", view.node,
                      r.pci_bus_id or ""]  # fmt: skip
            for family, read in gauges:
                value = read(r)
                if value is not None:
                    family.add_metric(labels, value)
            xid.add_metric(labels, float(xids.get(r.index) or 0))
            joules = view.energy.gpu_j.get(r.uuid)
            if joules is not None:
                energy.add_metric(labels, joules * 1000.0)
        for family, _ in gauges:
            yield family
        yield xid
        yield energy


class AgentMetrics:
    """Every collector of the agent, on an injected registry."""

    def __init__(self, registry: CollectorRegistry, node: str, dcgm_names: bool = False) -> None:
        self.registry = registry
        self.view = LatestView(node=node)
        registry.register(_GpuCollector(self.view))
        if dcgm_names:
            registry.register(_DcgmCollector(self.view))
        self.pushes = Counter(
            "edgegpu_agent_pushes_total",
            "Telemetry pushes by extender URL and result.",
            ["url", "result"],
            registry=registry,
        )
        self.power_actions = Counter(
            "edgegpu_agent_power_actions_total",
            "Power changes by action, reason and outcome (applied, dry-run, not-supported, ...).",
            ["device", "action", "reason", "outcome"],
            registry=registry,
        )
        self.sample_seconds = Histogram(
            "edgegpu_agent_sample_seconds",
            "Time to sample every GPU once.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )
        self.answer_fields_ignored = Counter(
            "edgegpu_agent_answer_fields_ignored_total",
            "Fields of the extenders' push answers the agent did not take, by field and reason: "
            "invalid (malformed or out of range), looser (weaker local protection than the "
            "agent's own settings), no-boot or other-boot (a reboot ask not naming this boot).",
            ["field", "reason"],
            registry=registry,
        )
        self.cycle_errors = Counter(
            "edgegpu_agent_cycle_errors_total",
            "Sampling rounds that hit an unexpected error.",
            registry=registry,
        )
