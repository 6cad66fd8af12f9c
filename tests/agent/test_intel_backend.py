"""The Intel backend against xpu-smi's JSON output (tests/fixtures/xpu-smi)."""

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from node_agent.backends.intel import IntelBackend, XpuSmiError, run_xpu_smi
from node_agent.errors import BackendUnavailable, NotSupported, PermissionDenied
from node_agent.loop import Agent
from node_agent.protection.health import HealthArgs
from node_agent.protection.power import PowerArgs
from node_agent.telemetry.exporter import AgentMetrics

FIXTURES = Path(__file__).parent.parent / "fixtures" / "xpu-smi"


class XpuSmi:
    """xpu-smi as the backend runs it: each command answers from its fixture, or fails.

    A JSON answer with an ``error`` exits non-zero, as xpu-smi does; ``refuse`` is the error a
    power-limit setting gets (None: it succeeds).
    """

    def __init__(
        self,
        failing: set[str] | None = None,
        refuse: str | None = None,
        temperature_c: float | None = None,
    ) -> None:
        self.failing = failing or set()
        self.refuse = refuse
        self.temperature_c = temperature_c
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> str:
        self.calls.append(list(args))
        name = args[0] if "-d" not in args else f"{args[0]}-{args[args.index('-d') + 1]}"
        if name in self.failing:
            raise XpuSmiError(f"xpu-smi {' '.join(args)}: exit 1: Level Zero Initialization Error")
        answer: Any
        if "--powerlimit" in args:
            answer = (
                {"error": self.refuse}
                if self.refuse
                else {"status": "OK", "return": "Succeed to set the power limit on GPU 0."}
            )
        else:
            answer = json.loads((FIXTURES / f"{name}.json").read_text())
        if name == "stats-0" and self.temperature_c is not None:
            for metric in answer["device_level"]:
                if metric["metrics_type"] == "XPUM_STATS_GPU_CORE_TEMPERATURE":
                    metric["value"] = self.temperature_c
        if isinstance(answer, dict) and answer.get("error"):
            raise XpuSmiError(f"xpu-smi {' '.join(args)}: exit 1", answer["error"])
        return json.dumps(answer)


def backend(xpu: XpuSmi, tmp_path: Path, *, root: bool = True) -> IntelBackend:
    (tmp_path / "dri").mkdir(exist_ok=True)
    b = IntelBackend(run=xpu, dev_root=tmp_path, root=root)
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
    assert r.pci_bus_id == "0000:4d:00.0"
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


def test_the_power_limit_is_read_and_set_in_whole_watts(tmp_path: Path) -> None:
    xpu = XpuSmi()
    b = backend(xpu, tmp_path)
    limits = b.power_limits(0)
    assert limits is not None and (limits.min_w, limits.max_w, limits.default_w) == (1, 150, 150)
    assert b.capabilities(0).power_limit and not b.capabilities(0).locked_clocks
    assert b.read(0).power_limit_w == 120.0
    b.set_power_limit_w(0, 99.6)
    assert xpu.calls[-1] == ["config", "-d", "0", "--powerlimit", "100", "-j"]
    assert b.read(0).power_limit_w == 100.0
    assert sum(c[0] == "config" and "--powerlimit" not in c for c in xpu.calls) == 1  # read once


def test_a_gpu_without_a_readable_limit_is_not_controlled(tmp_path: Path) -> None:
    xpu = XpuSmi()
    b = backend(xpu, tmp_path)
    assert b.power_limits(1) is None and not b.capabilities(1).power_limit
    with pytest.raises(NotSupported):
        b.set_power_limit_w(1, 100.0)
    assert not any("--powerlimit" in c for c in xpu.calls)
    assert b.read(1).power_limit_w is None
    with pytest.raises(NotSupported, match="clock locking"):
        b.lock_clocks_mhz(0, 1000.0)


def test_a_refused_setting_is_permission_denied_unless_root(tmp_path: Path) -> None:
    refusal = "unsupported feature or setting failure"
    with pytest.raises(PermissionDenied, match="needs root"):
        backend(XpuSmi(refuse=refusal), tmp_path, root=False).set_power_limit_w(0, 100.0)
    with pytest.raises(NotSupported, match="unsupported feature"):
        backend(XpuSmi(refuse=refusal), tmp_path, root=True).set_power_limit_w(0, 100.0)
    b = backend(XpuSmi(refuse="Invalid power limit value"), tmp_path, root=True)
    with pytest.raises(XpuSmiError, match="Invalid power limit"):
        b.set_power_limit_w(0, 100.0)
    assert b.read(0).power_limit_w == 120.0  # a refused setting changes nothing


def test_run_xpu_smi_reports_the_json_error_of_a_failed_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = tmp_path / "xpu-smi"
    tool.write_text(
        '#!/bin/sh\nif [ "$1" = config ]; then\n'
        '  echo \'{"error": "unsupported feature or insufficient privilege", "errno": 1}\'\n'
        "  exit 1\nfi\necho '{\"device_list\": []}'\n"
    )
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert json.loads(run_xpu_smi(["discovery", "-j"])) == {"device_list": []}
    with pytest.raises(XpuSmiError, match="exit 1: unsupported feature") as info:
        run_xpu_smi(["config", "-d", "0", "-j"])
    assert info.value.error == "unsupported feature or insufficient privilege"


@pytest.mark.parametrize("dry_run", [True, False])
async def test_the_agent_caps_a_hot_intel_gpu_or_only_plans_it(
    dry_run: bool, tmp_path: Path
) -> None:
    xpu = XpuSmi(temperature_c=92.0)
    agent = Agent(backend(xpu, tmp_path), node="intel-0", interval_s=5.0,
                  metrics=AgentMetrics(CollectorRegistry(), "intel-0"), health_args=HealthArgs(),
                  power_args=PowerArgs(), dry_run=dry_run)  # fmt: skip
    out = await agent.round()
    planned = [a for a in out.actions if a.action.kind == "set_power_limit"]
    assert [a.action.index for a in planned] == [0]  # GPU 1 reads no temperature and no limit
    sets = [c for c in xpu.calls if "--powerlimit" in c]
    if dry_run:
        assert planned[0].outcome == "dry-run" and sets == []
    else:
        assert planned[0].outcome == "applied"
        assert sets == [
            ["config", "-d", "0", "--powerlimit", str(round(planned[0].action.watts or 0)), "-j"]
        ]
    assert out.report.gpus[0].vendor == "intel"


def test_no_gpu_means_no_backend() -> None:
    with pytest.raises(BackendUnavailable, match="no GPUs"):
        IntelBackend(run=XpuSmi(failing={"discovery"})).open()


def test_the_self_test_reads_every_gpu_then_runs_xpu_smi_diag_on_each(tmp_path: Path) -> None:
    b = backend(XpuSmi(), tmp_path)
    verdict = b.self_test()  # xpu-smi is not installed here: every diag is skipped
    assert [(c["name"], c["outcome"]) for c in verdict["checks"]] == [
        ("library-gpu0", "pass"),
        ("library-gpu1", "pass"),
        ("xpu-smi-diag-gpu0", "skipped"),
        ("xpu-smi-diag-gpu1", "skipped"),
    ]
    assert verdict["verdict"] == "pass"


def test_driver_and_firmware_versions_come_from_discovery_and_are_read_again_at_a_self_test(
    tmp_path: Path,
) -> None:
    xpu = XpuSmi()
    b = backend(xpu, tmp_path)
    first, second = b.read(0), b.read(1)
    assert (first.driver_version, first.firmware_version) == (
        "I915_23.10.32_PSB_231129.32",
        "DG02_1.3172",
    )
    assert second.firmware_version is None
    uuid = second.uuid
    xpu.failing.add("discovery-1")  # details cannot be read again: the ones read stay
    b.self_test()
    assert b.read(1).uuid == uuid
    assert sum(1 for call in xpu.calls if call[:3] == ["discovery", "-d", "0"]) == 2
