import pytest

from node_agent.model import GpuReading, NodeChecks
from node_agent.protection.health import HealthArgs, assess

ARGS = HealthArgs()
OK = NodeChecks(driver_ok=True, device_nodes_ok=True, cuda_ctx_success_ratio=1.0)


def reading(**kw):
    return GpuReading(index=0, uuid="GPU-0", temperature_c=kw.pop("temperature_c", 50.0), **kw)


@pytest.mark.parametrize(
    ("r", "checks", "xid", "now", "level", "reasons"),
    [
        pytest.param(reading(), OK, None, 0.0, "healthy", (), id="a quiet gpu is healthy"),
        pytest.param(
            GpuReading(index=0, uuid="x", lost=True),
            OK,
            None,
            0.0,
            "unhealthy",
            ("nvml:gpu-lost",),
            id="a lost gpu is unhealthy",
        ),
        pytest.param(
            reading(),
            OK,
            (79, 100.0),
            150.0,
            "unhealthy",
            ("xid:79",),
            id="a fatal xid makes it unhealthy",
        ),
        pytest.param(
            reading(),
            OK,
            (79, 100.0),
            400.1,
            "healthy",
            (),
            id="health comes back once the xid is old",
        ),
        pytest.param(
            reading(ecc_uncorrected=1),
            OK,
            None,
            0.0,
            "unhealthy",
            ("ecc:dbe",),
            id="uncorrected ecc errors are unhealthy",
        ),
        pytest.param(
            reading(temperature_c=86.0),
            OK,
            None,
            0.0,
            "degraded",
            ("temp:over-max",),
            id="over max temperature is degraded",
        ),
        pytest.param(
            reading(),
            NodeChecks(driver_ok=False),
            None,
            0.0,
            "unhealthy",
            ("driver:not-ok",),
            id="a dead driver is unhealthy",
        ),
        pytest.param(
            reading(),
            NodeChecks(device_nodes_ok=False),
            None,
            0.0,
            "unhealthy",
            ("dev:nodes-missing",),
            id="missing device nodes are unhealthy",
        ),
        pytest.param(
            reading(),
            NodeChecks(cuda_ctx_success_ratio=0.2),
            None,
            0.0,
            "unhealthy",
            ("cuda:ctx-failed",),
            id="failing cuda contexts are unhealthy",
        ),
        pytest.param(
            reading(),
            NodeChecks(cuda_ctx_success_ratio=0.9),
            None,
            0.0,
            "degraded",
            ("cuda:ctx-flaky",),
            id="an occasional cuda failure is degraded",
        ),
        pytest.param(
            reading(throttle_reasons=("hw_slowdown",)),
            OK,
            None,
            0.0,
            "degraded",
            ("throttle:hw-slowdown",),
            id="hardware slowdown is degraded",
        ),
        pytest.param(
            reading(temperature_c=90.0, ecc_uncorrected=2),
            OK,
            None,
            0.0,
            "unhealthy",
            ("ecc:dbe", "temp:over-max"),
            id="the worst reason decides and every reason is listed",
        ),
    ],
)
def test_health_levels_and_reasons(r, checks, xid, now, level, reasons):
    h = assess(r, checks, xid, now, ARGS)
    assert (h.level, h.reasons) == (level, reasons)
