"""The NVML backend against a fake pynvml at the library boundary."""

from pathlib import Path

import pytest

from node_agent.backends.nvml import NvmlBackend, throttle_reasons
from node_agent.errors import BackendUnavailable, NotSupported, PermissionDenied
from tests.fakes.fake_pynvml import FakeGpu, FakePynvml

PROC = Path(__file__).parent.parent / "fixtures" / "proc"


def backend(fake, **kw):
    b = NvmlBackend(module=fake, proc_root=PROC, **kw)
    b.open()
    return b


def test_milliwatts_and_bytes_are_converted_at_the_edge():
    fake = FakePynvml(
        [FakeGpu(power_mw=123_456, limit_mw=700_000, mem_total=80 * 1024**3, mem_used=2 * 1024**3)]
    )
    r = backend(fake).read(0)
    assert r.power_w == pytest.approx(123.456)
    assert r.power_limit_w == 700.0
    assert r.memory_total_mib == 80 * 1024
    assert r.memory_used_mib == 2048
    assert (r.model, r.temperature_c, r.utilization_pct, r.sm_clock_mhz) == (
        "NVIDIA H200",
        45.0,
        30.0,
        1980.0,
    )


def test_driver_vbios_and_inforom_versions_are_read_and_reported():
    fake = FakePynvml([FakeGpu(), FakeGpu(not_supported={"nvmlDeviceGetInforomImageVersion"})])
    b = backend(fake)
    first, second = b.read(0), b.read(1)
    assert (first.driver_version, first.vbios_version, first.inforom_version) == (
        "570.86.15", "96.00.74.00.01", "G525.0200.00.05",
    )  # fmt: skip
    assert second.inforom_version is None and second.vbios_version == "96.00.74.00.01"
    fake.driver_version = "575.51.03"  # upgraded under a running agent
    assert b.read(0).driver_version == "575.51.03"


def test_not_supported_fields_read_as_none_never_as_made_up_numbers():
    gpu = FakeGpu(
        not_supported={
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetCurrentClocksEventReasons",
        }
    )
    r = backend(FakePynvml([gpu])).read(0)
    assert r.power_w is None and r.ecc_uncorrected is None
    assert r.throttle_reasons == ()
    assert r.temperature_c == 45.0


def test_the_fan_speed_is_read_where_the_board_has_a_fan():
    b = backend(FakePynvml([FakeGpu(uuid="GPU-a", fan_pct=85), FakeGpu(uuid="GPU-b")]))
    assert b.read(0).fan_speed_pct == 85.0
    assert b.read(1).fan_speed_pct is None  # passively cooled: NVML has no fan to read


def test_a_gpu_lost_mid_run_affects_that_gpu_only():
    fake = FakePynvml([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")])
    b = backend(fake)
    assert not b.read(1).lost
    fake.gpus[1].lost = True
    assert b.read(1).lost
    assert b.read(0).uuid == "GPU-a" and not b.read(0).lost


def test_a_lost_gpu_keeps_the_uuid_it_last_read_with_so_its_claims_and_pods_stay_its():
    fake = FakePynvml([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")])
    b = backend(fake)
    assert b.read(1).uuid == "GPU-b"
    fake.gpus[1].lost = True
    gone = b.read(1)
    assert gone.lost and gone.uuid == "GPU-b"


def test_xid_events_are_drained_without_blocking():
    fake = FakePynvml([FakeGpu(), FakeGpu()])
    b = backend(fake)
    assert b.poll_xids(1.0) == []
    fake.push_xid(1, 79)
    fake.push_xid(0, 13)
    events = b.poll_xids(2.0)
    assert [(e.index, e.xid) for e in events] == [(1, 79), (0, 13)]
    assert b.capabilities(0).xid_events


def test_no_event_support_means_no_xids_not_a_crash():
    fake = FakePynvml()
    fake.events_supported = False
    b = backend(fake)
    assert b.poll_xids(1.0) == [] and not b.capabilities(0).xid_events


def test_no_permission_on_a_setter_is_reported_as_such():
    fake = FakePynvml()
    fake.setters_denied = True
    b = backend(fake)
    with pytest.raises(PermissionDenied, match="root"):
        b.set_power_limit_w(0, 500.0)


def test_a_setter_the_gpu_cannot_do_is_not_supported():
    b = backend(FakePynvml([FakeGpu(not_supported={"nvmlDeviceSetGpuLockedClocks"})]))
    with pytest.raises(NotSupported):
        b.lock_clocks_mhz(0, 800)


def test_power_limits_are_set_in_milliwatts_and_read_back_in_watts():
    fake = FakePynvml()
    b = backend(fake)
    limits = b.power_limits(0)
    assert (limits.min_w, limits.max_w, limits.default_w) == (200.0, 700.0, 700.0)
    b.set_power_limit_w(0, 450.5)
    assert fake.gpus[0].limit_mw == 450_500
    assert b.read(0).power_limit_w == 450.5


def test_locked_clocks_are_set_and_reset():
    fake = FakePynvml()
    b = backend(fake)
    b.lock_clocks_mhz(0, 800)
    assert fake.gpus[0].locked_clocks == (0, 800)
    b.reset_clocks(0)
    assert fake.gpus[0].locked_clocks is None


def test_processes_are_mapped_to_pods_through_their_cgroup():
    gpu = FakeGpu(processes=[(4242, 512 * 1024 * 1024), (4343, None), (1, 1024)])
    procs = backend(FakePynvml([gpu])).read(0).processes
    assert procs[0].pod_uid == "5f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
    assert procs[0].container == "a" * 64
    assert procs[0].used_mib == 512
    assert procs[1].pod_uid == "11111111-2222-3333-4444-555555555555" and procs[1].used_mib is None
    assert procs[2].pod_uid is None


def test_throttle_bits_become_reason_names():
    assert throttle_reasons(0x4 | 0x40) == ("sw_power_cap", "hw_thermal_slowdown")


def test_a_machine_without_the_driver_fails_to_open_with_advice():
    fake = FakePynvml(init_error=12)  # NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(BackendUnavailable, match="NVIDIA driver"):
        NvmlBackend(module=fake).open()


def test_node_checks_see_the_driver_and_the_device_nodes(tmp_path):
    (tmp_path / "nvidiactl").touch()
    (tmp_path / "nvidia0").touch()
    sock = tmp_path / "nvidia-gpu.sock"
    b = backend(FakePynvml([FakeGpu()]), dev_root=tmp_path, device_plugin_socket=sock)
    checks = b.node_checks()
    assert (checks.driver_ok, checks.device_nodes_ok, checks.device_plugin_ok) == (
        True,
        True,
        False,
    )
    (tmp_path / "nvidia0").unlink()
    assert b.node_checks().device_nodes_ok is False


def test_the_error_classes_look_like_pynvmls():
    fake = FakePynvml()
    err = fake.NVMLError(3)
    assert isinstance(err, fake.NVMLError_NotSupported) and err.value == 3
    assert isinstance(fake.NVMLError_GpuIsLost(), fake.NVMLError)
