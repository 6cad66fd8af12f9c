"""GPU maintenances against the fake API server, through the real client and the leader's round."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scheduler_extender.domain import QosClass
from scheduler_extender.k8s.client import KubeError
from scheduler_extender.names import MAINTENANCE_STATE_LABEL, MAINTENANCE_TAINT
from scheduler_extender.remediation.runner import Remediator
from scheduler_extender.telemetry.decode import report_from
from tests.builders import gpu, report
from tests.fakes.fake_kube import FakeKube
from tests.k8s.test_fault_loop import Cluster


class Fleet(Cluster):
    """``Cluster``'s nodes, whose agents answer the maintenance's asks as told."""

    def __init__(self, kube: FakeKube, kubeconfig: Path, count: int = 3, **remediation: Any):
        self.results: dict[str, dict[str, Any]] = {}
        self.tests: dict[str, dict[str, Any]] = {}
        self.unhealthy: dict[str, list[int]] = {}
        self.asked: dict[str, set[str]] = {}
        super().__init__(kube, kubeconfig, count, **remediation)

    def push(
        self,
        node: str,
        *unhealthy: int,
        boot: str = "boot-1",
        host: str | None = None,
    ) -> None:
        self.seq += 1
        bad = set(unhealthy) | set(getattr(self, "unhealthy", {}).get(node, ()))
        gpus = [
            gpu(i, health="unhealthy", health_reasons=["xid:79"]) if i in bad else gpu(i)
            for i in range(2)
        ]
        doc = report(node, gpus, seq=self.seq)
        doc["agent"]["boot_id"] = boot
        doc["host_boot_id"] = host
        if node in getattr(self, "results", {}):
            doc["maintenance"] = self.results[node]
        if node in getattr(self, "tests", {}):
            doc["self_test"] = self.tests[node]
        self.state.ingest(report_from(doc))

    def answer(
        self,
        r: Remediator,
        node: str,
        *,
        step: str = "pass",
        verdict: str = "pass",
    ) -> dict[str, Any]:
        """The node's agent does what the leader asks it in its push answer."""
        asks = r.requests(node)
        if "maintenance" in asks:
            ask = asks["maintenance"]
            self.asked.setdefault(node, set()).add(ask["id"])
            self.results[node] = {
                "id": ask["id"],
                "step": ask["step"],
                "outcome": step,
                "detail": "exit 0",
            }
        if "self_test" in asks:
            self.tests[node] = {
                "id": asks["self_test"]["id"],
                "verdict": verdict,
                "detail": "" if verdict == "pass" else "dcgm-diag-r1: fail",
            }
        return asks

    def watch_pods(self) -> None:
        """What the pod watch does for a pod that is gone: its GPU is free."""
        for node in ("n0", "n1", "n2"):
            for a in self.state.allocations.on_node(node):
                if a.name not in self.pods():
                    self.state.release(a.pod_uid)

    def maintain(self, name: str = "upgrade", **spec: Any) -> None:
        body = {"nodeSelector": {}, "step": "driver-upgrade", **spec}
        self.kube.put("gpumaintenances", {"metadata": {"name": name}, "spec": body})

    def status(self, name: str = "upgrade") -> dict[str, Any]:
        doc = self.kube.get("gpumaintenances", name)
        assert doc is not None
        return dict(doc.get("status") or {})

    def states(self, name: str = "upgrade") -> dict[str, str]:
        return {n: e["state"] for n, e in (self.status(name).get("nodes") or {}).items()}

    def held(self, node: str) -> bool:
        live = self.node(node)
        taints = [t["key"] for t in live["spec"].get("taints") or []]
        return bool(live["spec"].get("unschedulable")) and MAINTENANCE_TAINT in taints

    def label(self, node: str) -> str | None:
        return (self.node(node)["metadata"].get("labels") or {}).get(MAINTENANCE_STATE_LABEL)

    async def rounds(
        self, r: Remediator, n: int = 1, *, step: str = "pass", verdict: str = "pass"
    ) -> None:
        for _ in range(n):
            self.clock.advance(2.0)
            self.watch_pods()
            for node in ("n0", "n1", "n2"):
                self.answer(r, node, step=step, verdict=verdict)
                self.push(node)
            await r.step()


async def test_three_nodes_are_maintained_one_at_a_time_and_uncordoned(
    kube: FakeKube, kubeconfig: Path
) -> None:
    f = Fleet(kube, kubeconfig)
    f.pod("train", "n0", 0, QosClass.TRAINING)
    f.maintain(maxUnavailable=1, validationLevel=2)
    r = f.remediator()
    held_at_once = 0
    asked_levels = set()
    for _ in range(30):
        await f.rounds(r)
        held_at_once = max(held_at_once, sum(f.held(n) for n in ("n0", "n1", "n2")))
        asked_levels |= {r.requests(n).get("self_test", {}).get("level") for n in ("n0", "n1")}
        if f.status().get("phase") == "Succeeded":
            break
    assert f.status()["phase"] == "Succeeded", f.status()
    assert f.states() == {"n0": "done", "n1": "done", "n2": "done"}
    assert held_at_once == 1
    assert "train" not in f.pods()  # drained through the Eviction API
    assert not any(f.held(n) for n in ("n0", "n1", "n2"))
    assert {f.label(n) for n in ("n0", "n1", "n2")} == {"done"}
    assert 2 in asked_levels
    assert f.events("EdgeGPUMaintenanceDone")
    assert f.status()["done"] == 3 and f.status()["total"] == 3


async def test_a_failing_validation_stops_it_with_the_third_node_untouched(
    kube: FakeKube, kubeconfig: Path
) -> None:
    f = Fleet(kube, kubeconfig)
    f.maintain(maxUnavailable=1)
    r = f.remediator()
    for _ in range(20):
        await f.rounds(r)
        if f.states().get("n1") == "validating":
            break
    assert f.states()["n0"] == "done"
    await f.rounds(r, 3, verdict="fail")
    assert f.status()["phase"] == "Failed"
    assert f.states() == {"n0": "done", "n1": "failed", "n2": "pending"}
    assert f.held("n1") and f.label("n1") == "failed"  # kept for a person
    assert not f.held("n2") and f.label("n2") is None
    assert f.events("EdgeGPUMaintenanceFailed")


async def test_a_new_leader_goes_on_from_the_status_without_asking_a_step_again(
    kube: FakeKube, kubeconfig: Path
) -> None:
    f = Fleet(kube, kubeconfig)
    f.maintain(maxUnavailable=1)
    first = f.remediator("replica-a")
    for _ in range(10):
        f.clock.advance(2.0)
        for node in ("n0", "n1", "n2"):
            f.push(node)
        await first.step()
        if "maintenance" in first.requests("n0"):
            break
    asked = first.requests("n0")["maintenance"]["id"]
    f.asked["n0"] = {asked}
    second = f.remediator("replica-b")  # the first one is gone; this one knows nothing yet
    f.clock.advance(2.0)
    await second.step()
    assert second.requests("n0")["maintenance"]["id"] == asked
    await f.rounds(second, 30)
    assert f.status()["phase"] == "Succeeded"
    assert f.asked["n0"] == {asked}  # one step request for n0, whichever leader asked


async def test_the_fault_loop_stands_aside_on_a_node_the_maintenance_holds(
    kube: FakeKube, kubeconfig: Path
) -> None:
    f = Fleet(kube, kubeconfig)
    f.maintain(nodes=["n0"], nodeSelector=None)
    r = f.remediator()
    for _ in range(5):
        f.clock.advance(2.0)
        f.push("n0")
        await r.step()
    assert f.held("n0")
    f.unhealthy["n0"] = [0]  # the driver is being replaced: the GPU looks lost
    for _ in range(10):
        f.clock.advance(2.0)
        f.push("n0")
        await r.step()
    assert f.record("n0") is None  # no fault-loop record: the maintenance's validation judges
    assert f.states()["n0"] == "step"


async def test_deleting_a_maintenance_mid_wave_lets_its_nodes_go_and_then_it_goes(
    kube: FakeKube, kubeconfig: Path
) -> None:
    f = Fleet(kube, kubeconfig)
    f.pod("infer", "n0", 0, QosClass.INFERENCE)
    kube.put(
        "poddisruptionbudgets",
        {
            "metadata": {"name": "keep", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {}}},
            "status": {"disruptionsAllowed": 0},
        },
    )
    f.maintain(maxUnavailable=1)
    r = f.remediator()
    await f.rounds(r, 3)
    assert f.states()["n0"] == "draining" and f.held("n0")  # the budget keeps the pod
    doc = kube.get("gpumaintenances", "upgrade")
    assert doc is not None and "edgegpu.io/maintenance" in doc["metadata"]["finalizers"]
    kube.objects[("gpumaintenances", "", "upgrade")]["metadata"]["deletionTimestamp"] = "now"
    await f.rounds(r, 3)
    assert kube.get("gpumaintenances", "upgrade") is None
    assert not f.held("n0") and f.label("n0") is None
    assert not f.node("n0")["spec"].get("unschedulable")


async def test_nothing_is_done_while_remediation_is_in_dry_run(
    kube: FakeKube, kubeconfig: Path
) -> None:
    f = Fleet(kube, kubeconfig, dryRun=True)
    f.maintain()
    r = f.remediator()
    await f.rounds(r, 3)
    assert f.status() == {}
    assert not f.held("n0")


async def test_an_invalid_maintenance_says_why_and_touches_nothing(
    kube: FakeKube, kubeconfig: Path
) -> None:
    f = Fleet(kube, kubeconfig)
    kube.put(
        "gpumaintenances",
        {"metadata": {"name": "upgrade"}, "spec": {"step": "x", "maxUnavailable": 0}},
    )
    r = f.remediator()
    await f.rounds(r, 2)
    status = f.status()
    assert status["phase"] == "Invalid"
    assert "maxUnavailable" in status["message"]
    assert len(f.events("EdgeGPUMaintenanceInvalid")) == 1  # said once
    assert not any(f.held(n) for n in ("n0", "n1", "n2"))
    live = kube.objects[("gpumaintenances", "", "upgrade")]
    live["spec"] = {"nodes": ["n0"], "step": "x"}  # fixed
    await f.rounds(r, 8)
    assert f.status()["phase"] == "Succeeded"


async def test_a_second_maintenance_waits_for_the_first(kube: FakeKube, kubeconfig: Path) -> None:
    f = Fleet(kube, kubeconfig)
    f.maintain("first", nodes=["n0"], nodeSelector=None)
    doc = {
        "metadata": {"name": "second", "creationTimestamp": "2026-12-02T11:00:00Z"},
        "spec": {"nodes": ["n1"], "step": "driver-upgrade"},
    }
    kube.put("gpumaintenances", doc)
    r = f.remediator()
    await f.rounds(r, 2)
    assert f.status("second")["phase"] == "Pending"
    assert "waiting for first" in f.status("second")["message"]
    await f.rounds(r, 20)
    assert f.status("first")["phase"] == "Succeeded"
    assert f.status("second")["phase"] == "Succeeded"


async def test_nothing_is_decided_before_the_caches_are_synced(
    kube: FakeKube, kubeconfig: Path
) -> None:
    f = Fleet(kube, kubeconfig)
    f.maintain()
    r = f.remediator(synced=lambda: False)
    await f.rounds(r, 3)
    assert f.status() == {}


async def test_an_uncordon_refused_in_the_last_round_is_made_after_it_finished(
    kube: FakeKube, kubeconfig: Path
) -> None:
    f = Fleet(kube, kubeconfig)
    f.maintain(nodes=["n0"], nodeSelector=None)
    r = f.remediator()
    for _ in range(10):
        await f.rounds(r)
        if f.states().get("n0") == "validating":
            break
    f.answer(r, "n0")
    f.push("n0")
    f.push("n1")
    real = r.act.patch_node
    calls = []

    async def refused(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        raise KubeError(500, "an admission webhook is down")

    r.act.patch_node = refused  # type: ignore[method-assign]
    await f.rounds(r)
    assert f.status()["phase"] == "Succeeded" and f.held("n0") and calls
    r.act.patch_node = real  # type: ignore[method-assign]
    await f.rounds(r)
    assert not f.held("n0")


async def test_a_taint_naming_a_maintenance_that_is_gone_is_removed_and_the_cordon_left(
    kube: FakeKube, kubeconfig: Path
) -> None:
    f = Fleet(kube, kubeconfig)
    live = f.live("n2")
    live["spec"]["unschedulable"] = True
    live["spec"]["taints"] = [{"key": MAINTENANCE_TAINT, "value": "long-gone",
                               "effect": "NoSchedule"}]  # fmt: skip
    r = f.remediator()
    await f.rounds(r, 2)
    node = f.node("n2")
    assert not node["spec"].get("taints") and node["spec"]["unschedulable"]
    assert f.events("EdgeGPUMaintenanceOrphaned")


async def test_a_node_silent_for_the_drain_timeout_is_skipped_as_this_leader_saw_it(
    kube: FakeKube, kubeconfig: Path
) -> None:
    f = Fleet(kube, kubeconfig)
    f.maintain(nodes=["n0", "n1"], nodeSelector=None, drainTimeout="60s")
    f.live("n0")["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    f.clock.advance(30.0)  # and its agent silent: its telemetry stale
    r = f.remediator()
    for _ in range(3):
        f.clock.advance(2.0)
        f.push("n1")
        await r.step()
    assert f.states() == {"n0": "pending", "n1": "pending"}  # n0 holds the one place
    for _ in range(3):
        f.clock.advance(30.0)
        f.push("n1")
        await r.step()
    assert f.states()["n0"] == "skipped" and f.states()["n1"] != "pending"
