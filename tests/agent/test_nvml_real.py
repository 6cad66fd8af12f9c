"""Real-device checks: run on a machine with an NVIDIA GPU (``make gpu-check``), skipped elsewhere."""

import pytest

from node_agent.backends.nvml import NvmlBackend
from node_agent.errors import BackendUnavailable

pytestmark = pytest.mark.gpu


@pytest.fixture
def nvml():
    backend = NvmlBackend()
    try:
        backend.open()
    except BackendUnavailable as exc:
        pytest.skip(f"no NVIDIA GPU: {exc}")
    yield backend
    backend.close()


def test_every_gpu_reads_with_units_in_range(nvml):
    assert nvml.device_count() >= 1
    for i in range(nvml.device_count()):
        r = nvml.read(i)
        assert not r.lost
        assert r.uuid.startswith("GPU-")
        assert r.temperature_c is None or 0 < r.temperature_c < 120
        assert r.power_w is None or 0 <= r.power_w < 2000
        assert r.memory_total_mib is None or r.memory_total_mib > 1024


def test_power_limits_are_a_consistent_range(nvml):
    for i in range(nvml.device_count()):
        limits = nvml.power_limits(i)
        if limits is not None:
            assert 0 < limits.min_w <= limits.default_w <= limits.max_w
