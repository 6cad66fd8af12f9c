"""Thermal migration: pods leave GPUs hot for longer than ``migrateAfter``."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from scheduler_extender.domain import Assignment, QosClass
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.policy.document import parse_policy
from scheduler_extender.policy.rules.thermal import ThermalArgs
from scheduler_extender.remediation import thermal
from scheduler_extender.remediation.runner import Remediator
from scheduler_extender.state.cluster import ClusterState
from scheduler_extender.telemetry.clock import FakeClock
from scheduler_extender.telemetry.decode import report_from
from tests.builders import gpu, report
from tests.k8s.conftest import make_api

ARGS = ThermalArgs()  # maxTemp 85, migrateAfter 2m


def placed(name: str, qos: QosClass, index: int = 0, at: float = 0.0, node: str = "n1"):
    return Assignment(f"uid-{name}", "default", name, node, (index,), (f"GPU-{index:04d}",), 1,
                      False, qos, None, at)  # fmt: skip


def test_the_lowest_class_leaves_first_and_the_gpu_gets_time_to_cool():
    pods = {"n1": [placed("train", QosClass.TRAINING), placed("old-be", QosClass.BEST_EFFORT, at=1),
                   placed("new-be", QosClass.BEST_EFFORT, at=2), placed("other", QosClass.BEST_EFFORT, 1)]}  # fmt: skip
    hot = [thermal.HotGpu("n1", 0, 121.0)]
    (first,) = thermal.evictions(hot, pods, ARGS, {}, now=1000.0)
    assert first.pod.name == "new-be" and first.gpu == ("n1", 0)
    assert "85 °C for 121 s" in first.reason
    assert thermal.evictions(hot, pods, ARGS, {("n1", 0): 1000.0}, now=1100.0) == []
    assert len(thermal.evictions(hot, pods, ARGS, {("n1", 0): 1000.0}, now=1121.0)) == 1
    assert thermal.evictions([thermal.HotGpu("n1", 0, 119.0)], pods, ARGS, {}, 1000.0) == []
    assert thermal.evictions([thermal.HotGpu("n1", 2, 500.0)], pods, ARGS, {}, 1000.0) == []


def _state(clock: FakeClock, enabled: bool, dry_run: bool) -> ClusterState:
    policy = parse_policy({"spec": {"remediation": {"enabled": enabled, "dryRun": dry_run}}})
    state = ClusterState(clock, policy)
    state.ingest(
        report_from(report("n1", [gpu(0, temperature_c=95.0), gpu(1, temperature_c=50.0)]))
    )
    state.assign(placed("be", QosClass.BEST_EFFORT), authoritative=True)
    state.assign(placed("cool", QosClass.BEST_EFFORT, index=1), authoritative=True)
    return state


@pytest.mark.parametrize(("enabled", "dry_run", "leading", "gone"), [
    (True, False, True, True), (True, True, True, False), (False, False, True, False),
    (True, False, False, False),
], ids=["acts", "dry-run", "disabled", "not-leader"])  # fmt: skip
async def test_the_leader_evicts_through_the_eviction_api_when_enabled(
    kube, kubeconfig, enabled, dry_run, leading, gone
):
    clock = FakeClock()
    state = _state(clock, enabled, dry_run)
    kube.add_pod("be", node="n1", uid="uid-be", phase="Running")
    kube.add_pod("cool", node="n1", uid="uid-cool", phase="Running")
    registry = CollectorRegistry()
    runner = Remediator(
        state, make_api(kubeconfig), ExtenderMetrics(registry, state), lambda _s: leading
    )
    assert await runner.step() == []  # hot, but not for longer than migrateAfter yet
    clock.advance(121.0)
    state.ingest(
        report_from(report("n1", [gpu(0, temperature_c=96.0), gpu(1, temperature_c=50.0)]))
    )
    await runner.step()
    assert (kube.get("pods", "be") is None) == gone
    assert kube.get("pods", "cool") is not None  # its GPU is cool
    result = "evicted" if gone else "dry_run"
    counted = registry.get_sample_value(
        "edgegpu_extender_remediation_actions_total",
        {"action": "evict", "reason": "thermal", "result": result},
    )
    assert counted == (1.0 if enabled and leading else None)


async def test_a_disruption_budget_holds_and_the_eviction_is_tried_again(kube, kubeconfig):
    clock = FakeClock()
    state = _state(clock, enabled=True, dry_run=False)
    kube.add_pod("be", node="n1", uid="uid-be", phase="Running", labels={"app": "be"})
    kube.put("poddisruptionbudgets", {"metadata": {"name": "be", "namespace": "default"},
                                      "spec": {"selector": {"matchLabels": {"app": "be"}}},
                                      "status": {"disruptionsAllowed": 0}})  # fmt: skip
    registry = CollectorRegistry()
    runner = Remediator(
        state, make_api(kubeconfig), ExtenderMetrics(registry, state), lambda _s: True
    )
    clock.advance(121.0)
    state.ingest(report_from(report("n1", [gpu(0, temperature_c=96.0)])))
    await runner.step()
    assert kube.get("pods", "be") is not None
    assert len(await runner.step()) == 1  # blocked: due again, but backing off
    clock.advance(2.0)
    assert len(await runner.step()) == 1  # asked again after the backoff
    assert registry.get_sample_value("edgegpu_extender_remediation_actions_total",
                                     {"action": "evict", "reason": "thermal", "result": "blocked"}) == 2.0  # fmt: skip
