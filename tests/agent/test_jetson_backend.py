"""The Jetson backend against recorded sysfs trees (tests/fixtures/jetson-*)."""

from pathlib import Path

import pytest

from node_agent.backends.jetson import JetsonBackend
from node_agent.errors import BackendUnavailable, NotSupported

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_an_orin_reads_its_gpu_zone_hwmon_rail_load_clocks_and_shared_memory():
    b = JetsonBackend(root=FIXTURES / "jetson-orin")
    b.open()
    r = b.read(0)
    assert r.model == "NVIDIA Jetson AGX Orin Developer Kit"
    assert r.uuid == "JETSON-1421222000123"
    assert r.temperature_c == 51.25
    assert r.power_w == pytest.approx(7.4)
    assert r.utilization_pct == pytest.approx(37.2)
    assert r.sm_clock_mhz == pytest.approx(611.25) and r.sm_clock_max_mhz == pytest.approx(1300.5)
    assert r.memory_total_mib == pytest.approx(31954936 / 1024)
    assert r.memory_used_mib == pytest.approx(4000000 / 1024)
    assert r.power_limit_w is None


def test_an_older_jetpack_reads_the_iio_power_rail():
    b = JetsonBackend(root=FIXTURES / "jetson-nano-jp4")
    b.open()
    r = b.read(0)
    assert r.temperature_c == 39.0
    assert r.power_w == pytest.approx(1.85)
    assert r.utilization_pct == pytest.approx(99.0)
    assert r.memory_total_mib is None  # no /proc/meminfo in this tree: unknown, not zero


def test_power_control_is_not_supported_and_says_why():
    b = JetsonBackend(root=FIXTURES / "jetson-orin")
    b.open()
    assert b.capabilities(0).power_limit is False
    with pytest.raises(NotSupported, match="nvpmodel"):
        b.set_power_limit_w(0, 10)


def test_a_machine_that_is_not_a_jetson_fails_to_open(tmp_path):
    with pytest.raises(BackendUnavailable, match="no Jetson GPU"):
        JetsonBackend(root=tmp_path).open()
