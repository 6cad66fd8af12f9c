"""The Intel backend against xpu-smi's JSON output (tests/fixtures/xpu-smi), issue 30."""

from collections.abc import Sequence
from pathlib import Path

import pytest

from node_agent.backends.intel import IntelBackend
from node_agent.errors import BackendUnavailable, NotSupported

FIXTURES = Path(__file__).parent.parent / "fixtures" / "xpu-smi"


class XpuSmi:
    """xpu-smi as the backend runs it: each command answers from its fixture, or fails."""

    def __init__(self, failing: set[str] | None = None) -> None:
        self.failing = failing or set()
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> str:
        self.calls.append(list(args))
        name = args[0] if "-d" not in args else f"{args[0]}-{args[args.index('-d') + 1]}"
        if name in self.failing:
            raise RuntimeError(f"xpu-smi {' '.join(args)}: exit 1: Level Zero Initialization Error")
        return (FIXTURES / f"{name}.json").read_text()


def backend(xpu: XpuSmi, tmp_path: Path) -> IntelBackend:
    (tmp_path / "dri").mkdir(exist_ok=True)
    b = IntelBackend(run=xpu, dev_root=tmp_path)
    b.open()
    return b


def test_readings_and_units_from_the_json(tmp_path: Path) -> None:
    b = backend(XpuSmi(), tmp_path)
    assert b.device_count() == 2
    r = b.read(0)
    assert (r.vendor, r.model, r.uuid) == (
        "intel", "Intel(R) Data Center GPU Flex 170", "01000000-0000-0000-0000-00000000004d")  # fmt: skip
    assert (r.temperature_c, r.power_w, r.utilization_pct, r.sm_clock_mhz) == (
        54.0,
        81.26,
        37.5,
        2050.0,
    )
    assert (r.memory_total_mib, r.memory_used_mib, r.ecc_uncorrected) == (16384.0, 2048.5, 0)
    assert b.node_checks().driver_ok and b.node_checks().device_nodes_ok


def test_metrics_it_does_not_print_read_as_none(tmp_path: Path) -> None:
    r = backend(XpuSmi(), tmp_path).read(1)
    assert (r.temperature_c, r.utilization_pct, r.sm_clock_mhz, r.ecc_uncorrected) == (
        None, None, None, None)  # fmt: skip
    assert (r.power_w, r.memory_used_mib, r.memory_total_mib) == (40.0, 300.0, 16384.0)


def test_a_gpu_whose_stats_fail_is_lost_and_the_driver_said_not_ok(tmp_path: Path) -> None:
    xpu = XpuSmi()
    b = backend(xpu, tmp_path)
    xpu.failing.add("stats-1")
    lost = b.read(1)
    assert lost.lost and lost.uuid.endswith("b2") and lost.vendor == "intel"
    assert not b.node_checks().driver_ok
    assert not b.read(0).lost and b.node_checks().driver_ok


def test_nothing_is_controlled_and_no_gpu_means_no_backend(tmp_path: Path) -> None:
    b = backend(XpuSmi(), tmp_path)
    assert b.capabilities(0).power_limit is False and b.power_limits(0) is None
    with pytest.raises(NotSupported):
        b.set_power_limit_w(0, 100.0)
    with pytest.raises(BackendUnavailable, match="no GPUs"):
        IntelBackend(run=XpuSmi(failing={"discovery"})).open()


def test_the_self_test_runs_xpu_smi_diag_on_every_gpu(tmp_path: Path) -> None:
    b = backend(XpuSmi(), tmp_path)
    verdict = b.self_test()  # xpu-smi is not installed here: every diag is skipped
    assert [c["name"] for c in verdict["checks"]] == ["xpu-smi-diag-gpu0", "xpu-smi-diag-gpu1"]
    assert verdict["verdict"] == "fail" and "nothing could be verified" in verdict["reason"]
