"""The AMD backend against a fake ``amdsmi`` at the library boundary."""

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from node_agent.backends.amd import AmdBackend
from node_agent.errors import BackendUnavailable, NotSupported, PermissionDenied
from node_agent.loop import Agent
from node_agent.protection.health import HealthArgs
from node_agent.protection.power import PowerArgs
from node_agent.telemetry.exporter import AgentMetrics
from tests.fakes.fake_amdsmi import FakeAmdGpu, build

PROC = Path(__file__).parent.parent / "fixtures" / "proc"


def backend(*gpus: FakeAmdGpu) -> AmdBackend:
    b = AmdBackend(module=build(list(gpus)), proc_root=PROC)
    b.open()
    return b


def test_units_are_converted_at_the_edge_and_the_vendor_is_said() -> None:
    r = backend(FakeAmdGpu("GPU-amd-0")).read(0)
    assert (r.uuid, r.vendor, r.model) == ("GPU-amd-0", "amd", "AMD Instinct MI210")
    assert r.temperature_c == 45.0  # the edge sensor
    assert (r.power_w, r.power_limit_w) == (120.0, 300.0)  # W, and µW → W
    assert (r.memory_total_mib, r.memory_used_mib) == (65520.0, 2048.0)
    assert r.pci_bus_id == "0000:03:00.0"  # where the device plugin finds its device nodes
    assert (r.utilization_pct, r.sm_clock_mhz, r.sm_clock_max_mhz) == (37.0, 1500.0, 1700.0)
    assert r.ecc_uncorrected == 0 and not r.lost


def test_not_supported_reads_as_none_and_no_edge_sensor_means_the_hotspot() -> None:
    gpu = FakeAmdGpu("GPU-amd-0", unsupported={"edge", "activity", "ecc", "clock"},
                     socket_power_w="N/A")  # fmt: skip
    r = backend(gpu).read(0)
    assert r.temperature_c == 58.0  # hotspot (junction), as on Instinct MI300
    assert (r.utilization_pct, r.ecc_uncorrected, r.sm_clock_mhz, r.power_w) == (
        None, None, None, None)  # fmt: skip
    assert r.power_limit_w == 300.0


def test_a_lost_gpu_reads_as_lost_and_the_others_still_read() -> None:
    b = backend(
        FakeAmdGpu("GPU-a", lost=True), FakeAmdGpu("GPU-b"), FakeAmdGpu("GPU-c", broken=True)
    )
    assert b.read(0).lost and b.read(0).vendor == "amd"
    assert not b.read(1).lost and b.read(1).temperature_c == 45.0
    gone = b.read(2)  # its uuid still reads, nothing else does
    assert gone.lost and gone.uuid == "GPU-c"


def test_a_lost_amd_gpu_keeps_the_uuid_it_last_read_with() -> None:
    gpu = FakeAmdGpu("GPU-a")
    b = backend(gpu)
    assert b.read(0).uuid == "GPU-a"
    gpu.lost = True
    gone = b.read(0)
    assert gone.lost and gone.uuid == "GPU-a"


def test_power_caps_are_set_in_microwatts_within_the_boards_range() -> None:
    gpu = FakeAmdGpu("GPU-a")
    b = backend(gpu)
    limits = b.power_limits(0)
    assert limits is not None and (limits.min_w, limits.max_w, limits.default_w) == (
        100.0, 300.0, 300.0)  # fmt: skip
    caps = b.capabilities(0)
    assert caps.power_limit and not caps.locked_clocks and caps.processes
    b.set_power_limit_w(0, 212.5)
    assert gpu.cap_calls == [212_500_000] and b.read(0).power_limit_w == 212.5
    with pytest.raises(NotSupported):
        b.lock_clocks_mhz(0, 800)


def test_no_permission_and_not_supported_on_the_setter_are_said_as_such() -> None:
    with pytest.raises(PermissionDenied):
        backend(FakeAmdGpu("GPU-a", no_permission=True)).set_power_limit_w(0, 200.0)
    with pytest.raises(NotSupported):
        backend(FakeAmdGpu("GPU-a", unsupported={"set_power_cap"})).set_power_limit_w(0, 200.0)
    assert backend(FakeAmdGpu("GPU-a", unsupported={"power_cap"})).power_limits(0) is None


def test_processes_are_mapped_to_pods_and_vram_bytes_become_mib() -> None:
    gpu = FakeAmdGpu("GPU-a", processes=[
        {"name": "python", "pid": 4242, "memory_usage": {"gtt_mem": 0, "cpu_mem": 0,
                                                         "vram_mem": 512 * 1024 * 1024}},
        {"name": "init", "pid": 1, "memory_usage": {"vram_mem": "N/A"}},
    ])  # fmt: skip
    procs = backend(gpu).read(0).processes
    assert procs[0].pod_uid == "5f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b" and procs[0].used_mib == 512
    assert procs[1].pod_uid is None and procs[1].used_mib is None


def test_without_amdsmi_it_refuses_to_open_with_advice() -> None:
    with pytest.raises(BackendUnavailable, match="amdsmi"):
        AmdBackend().open()


async def test_a_dry_run_plans_the_thermal_power_cap_and_sets_nothing() -> None:
    gpu = FakeAmdGpu("GPU-hot", edge_c=92, socket_power_w=290)
    b = backend(gpu)
    agent = Agent(b, node="amd-0", interval_s=5.0, metrics=AgentMetrics(CollectorRegistry(), "amd-0"),
                  health_args=HealthArgs(), power_args=PowerArgs(), dry_run=True)  # fmt: skip
    out = await agent.round()
    planned = [a for a in out.actions if a.action.kind == "set_power_limit"]
    assert planned and {a.outcome for a in planned} == {"dry-run"}
    assert gpu.cap_calls == []
    assert out.report.gpus[0].vendor == "amd"


def test_driver_and_vbios_versions_are_read_every_round_and_absent_ones_are_none() -> None:
    gpu = FakeAmdGpu(uuid="a")
    b = backend(gpu, FakeAmdGpu(uuid="b", unsupported={"driver", "vbios"}))
    first, second = b.read(0), b.read(1)
    assert (first.driver_version, first.vbios_version) == ("6.8.5", "022.040.003.043.000001")
    assert (second.driver_version, second.vbios_version) == (None, None)
    assert not second.lost  # a version that cannot be read is not a fault
    gpu.driver_version = "6.10.5"  # upgraded under a running agent
    assert b.read(0).driver_version == "6.10.5"
