"""``--dcgm-names``: the agent's readings under dcgm-exporter's names, units and labels."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from node_agent.model import GpuReading
from node_agent.telemetry.exporter import DCGM_LABELS, AgentMetrics


def _samples(metrics: AgentMetrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = generate_latest(metrics.registry).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def _reading(**kw: object) -> GpuReading:
    fields = {"index": 1, "uuid": "GPU-abc", "model": "NVIDIA L4", "vendor": "nvidia",
              "temperature_c": 71.0, "power_w": 41.5, "power_limit_w": 72.0,
              "utilization_pct": 63.0, "memory_total_mib": 23034.0, "memory_used_mib": 9000.0,
              "sm_clock_mhz": 1800.0, "pci_bus_id": "0000:4d:00.0", **kw}  # fmt: skip
    return GpuReading(**fields)  # type: ignore[arg-type]


def test_the_readings_carry_dcgm_exporters_names_units_and_labels() -> None:
    metrics = AgentMetrics(CollectorRegistry(), "edge-4", dcgm_names=True)
    metrics.view.readings = [_reading()]
    metrics.view.xid_last = {1: 79}
    metrics.view.energy.add(metrics.view.readings, 0.0)
    metrics.view.energy.add(metrics.view.readings, 10.0)  # 41.5 W for 10 s
    got = _samples(metrics)
    labels = {"gpu": "1", "UUID": "GPU-abc", "device": "nvidia1", "modelName": "NVIDIA L4",
              "Hostname": "edge-4", "pci_bus_id": "0000:4d:00.0"}  # fmt: skip
    assert set(labels) == set(DCGM_LABELS)
    want = {
        "DCGM_FI_DEV_GPU_TEMP": 71.0, "DCGM_FI_DEV_POWER_USAGE": 41.5,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT": 72.0, "DCGM_FI_DEV_GPU_UTIL": 63.0,
        "DCGM_FI_DEV_FB_USED": 9000.0, "DCGM_FI_DEV_FB_FREE": 14034.0,
        "DCGM_FI_DEV_FB_TOTAL": 23034.0, "DCGM_FI_DEV_SM_CLOCK": 1800.0,
        "DCGM_FI_DEV_XID_ERRORS": 79.0,
    }  # fmt: skip
    for name, value in want.items():
        assert got[name] == [(labels, value)], name
    ((_, energy),) = got["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    assert energy > 0  # in mJ, under dcgm-exporter's name (no _total suffix)
    # The project's own names are still there.
    assert "node_gpu_temperature_celsius" in got


def test_a_value_not_read_is_left_out_and_the_names_are_off_by_default() -> None:
    metrics = AgentMetrics(CollectorRegistry(), "edge-4", dcgm_names=True)
    metrics.view.readings = [_reading(temperature_c=None, memory_used_mib=None)]
    got = _samples(metrics)
    assert "DCGM_FI_DEV_GPU_TEMP" not in got and "DCGM_FI_DEV_FB_FREE" not in got
    assert got["DCGM_FI_DEV_XID_ERRORS"][0][1] == 0.0
    plain = AgentMetrics(CollectorRegistry(), "edge-4")
    plain.view.readings = [_reading()]
    assert not [n for n in _samples(plain) if n.startswith("DCGM_")]
