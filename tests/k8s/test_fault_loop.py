"""The GPU fault loop against the fake API server, through the real client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from scheduler_extender.domain import Assignment, QosClass
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.names import HEALTH_CONDITION, REMEDIATION_ANNOTATION, UNHEALTHY_TAINT
from scheduler_extender.policy.document import parse_policy
from scheduler_extender.remediation.runner import Remediator
from scheduler_extender.state.cluster import ClusterState
from scheduler_extender.telemetry.clock import FakeClock
from scheduler_extender.telemetry.decode import report_from
from tests.builders import gpu, report
from tests.fakes.fake_kube import FakeKube
from tests.k8s.conftest import make_api

READY = [{"type": "Ready", "status": "True"}]
EVICT_OVER_BUDGET = {"spec": {
    "remediation": {"enabled": True, "dryRun": False},
    "memory": {"overBudget": "evict", "overBudgetGrace": "1m"}}}  # fmt: skip


class Cluster:
    """Nodes n0..n{count-1} with 2 GPUs, a ClusterState fed with reports, and Remediators."""

    def __init__(self, kube: FakeKube, kubeconfig: Path, count: int = 2, **remediation: Any):
        self.kube = kube
        self.kubeconfig = kubeconfig
        self.clock = FakeClock()
        kube.now = self.clock.wall  # one clock for the replica and the API server here
        doc = {"enabled": True, "dryRun": False, **remediation}
        self.state = ClusterState(self.clock, parse_policy({"spec": {"remediation": doc}}))
        self.seq = 0
        self.self_test: dict[str, str] | None = None
        for i in range(count):
            kube.add_node(f"n{i}")
            self.live(f"n{i}")["status"]["conditions"] = list(READY)
            self.push(f"n{i}")

    def push(
        self, node: str, *unhealthy: int, boot: str = "boot-1", host: str | None = None
    ) -> None:
        self.seq += 1
        gpus = [
            gpu(i, health="unhealthy", health_reasons=["xid:79"]) if i in unhealthy else gpu(i)
            for i in range(2)
        ]
        doc = report(node, gpus, seq=self.seq)
        doc["agent"]["boot_id"] = boot
        doc["host_boot_id"] = host
        if self.self_test is not None:
            doc["self_test"] = self.self_test
        self.state.ingest(report_from(doc))

    def pod(self, name: str, node: str, index: int, qos: QosClass, at: float = 0.0) -> None:
        self.kube.add_pod(name, node=node, uid=f"uid-{name}", phase="Running")
        self.state.assign(
            Assignment(f"uid-{name}", "default", name, node, (index,), (f"GPU-{index:04d}",), 1,
                       False, qos, None, at),
            authoritative=True,
        )  # fmt: skip

    def remediator(
        self, identity: str = "replica-a", leading: bool = True, synced: Any = lambda: True
    ) -> Remediator:
        kube = self.kube
        return Remediator(
            self.state,
            make_api(self.kubeconfig),
            ExtenderMetrics(CollectorRegistry(), self.state),
            lambda _s: leading,
            nodes=lambda: {k[2]: v for k, v in kube.objects.items() if k[0] == "nodes"},
            pods=lambda: {
                v["metadata"]["uid"]: v for k, v in kube.objects.items() if k[0] == "pods"
            },
            synced=synced,
            identity=identity,
        )

    def live(self, name: str) -> dict[str, Any]:
        """The server's own copy of a Node, to change behind the client's back."""
        return self.kube.objects[("nodes", "", name)]

    def node(self, name: str) -> dict[str, Any]:
        node = self.kube.get("nodes", name)
        assert node is not None
        return node

    def record(self, name: str) -> dict[str, Any] | None:
        text = (self.node(name)["metadata"].get("annotations") or {}).get(REMEDIATION_ANNOTATION)
        return None if text is None else json.loads(text)

    def condition(self, name: str) -> dict[str, Any] | None:
        for c in self.node(name)["status"].get("conditions") or []:
            if c["type"] == HEALTH_CONDITION:
                return dict(c)
        return None

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [
            e for k, e in self.kube.objects.items() if k[0] == "events" and e["reason"] == reason
        ]

    def pods(self) -> set[str]:
        return {k[2] for k in self.kube.objects if k[0] == "pods"}


async def test_xid_to_uncordon_cordons_evicts_the_faulty_gpus_pods_and_self_tests(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.pod("train", "n0", 0, QosClass.TRAINING)
    c.pod("infer", "n0", 0, QosClass.INFERENCE)
    c.pod("other-gpu", "n0", 1, QosClass.BEST_EFFORT)
    r = c.remediator()
    c.push("n0", 0)
    await r.step()
    assert not c.node("n0")["spec"].get("unschedulable")  # suspect: not yet confirmed
    c.clock.advance(6.0)
    c.push("n0", 0)
    await r.step()
    node = c.node("n0")
    assert node["spec"]["unschedulable"] is True
    assert [t["key"] for t in node["spec"]["taints"]] == [UNHEALTHY_TAINT]
    assert c.record("n0")["state"] == "draining"
    assert c.condition("n0")["status"] == "False"
    assert c.events("EdgeGPUCordoned")
    # Both pods on GPU 0 went (lowest class first), the one on the healthy GPU 1 stays.
    assert c.pods() == {"other-gpu"}
    evicted = [e["involvedObject"]["name"] for e in c.events("EdgeGPUEvicted")]
    assert evicted == ["infer", "train"]
    for name in ("infer", "train"):
        c.state.release(f"uid-{name}")  # the pod watch's DELETED event
    await r.step()
    assert c.record("n0")["state"] == "self-test"
    request = r.requests("n0")["self_test"]["id"]
    assert r.requests("n1") == {}
    c.self_test = {"id": request, "verdict": "pass", "detail": ""}
    c.push("n0")  # the agent clears its XID record on a pass
    await r.step()
    node = c.node("n0")
    assert not node["spec"].get("unschedulable") and not node["spec"]["taints"]
    assert c.record("n0") is None
    assert c.condition("n0")["status"] == "True"
    assert r.records == {}


async def test_a_restart_mid_drain_resumes_without_repeating_the_cordon(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    kube.put("poddisruptionbudgets", {"metadata": {"name": "keep", "namespace": "default"},
             "spec": {"selector": {"matchLabels": {}}}, "status": {"disruptionsAllowed": 0}})  # fmt: skip
    c.pod("held", "n0", 0, QosClass.INFERENCE)
    first = c.remediator("replica-a")
    c.push("n0", 0)
    await first.step()
    c.clock.advance(6.0)
    c.push("n0", 0)
    await first.step()
    assert c.record("n0")["state"] == "draining"
    assert c.pods() == {"held"}  # the budget allows no disruption: nothing forced
    cordons = len(kube.requests_to("/api/v1/nodes/n0$"))
    second = c.remediator("replica-b")  # a new leader, or this one restarted
    await second.step()
    assert c.pods() == {"held"}
    assert c.record("n0")["state"] == "draining"
    patches = [m for m, p in kube.requests_to("/api/v1/nodes/n0$")[cordons:] if m == "PATCH"]
    assert len(patches) == 1 and c.record("n0")["owner"] == "replica-b"  # the record, taken over
    assert c.node("n0")["spec"]["unschedulable"] is True
    kube.objects[("poddisruptionbudgets", "default", "keep")]["status"]["disruptionsAllowed"] = 1
    second.act._blocked.clear()  # its backoff after the refusal is over
    await second.step()
    assert c.pods() == set()
    assert len(c.events("EdgeGPUCordoned")) == 1


async def test_a_manual_uncordon_is_respected(kube: FakeKube, kubeconfig: Path) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    c.push("n0", 0)
    await r.step()
    c.clock.advance(6.0)
    c.push("n0", 0)
    await r.step()
    kube.put("nodes", {**c.node("n0"), "spec": {**c.node("n0")["spec"], "unschedulable": False}})
    await r.step()
    assert c.record("n0")["state"] == "released"
    assert not c.node("n0")["spec"]["taints"]
    for _ in range(3):
        c.clock.advance(30.0)
        c.push("n0", 0)
        await r.step()
    assert not c.node("n0")["spec"].get("unschedulable")
    assert len(c.events("EdgeGPUCordoned")) == 1
    c.push("n0")  # the fault is over: the record goes
    await r.step()
    assert c.record("n0") is None and c.condition("n0")["status"] == "True"


async def test_the_cap_holds_when_half_the_nodes_fault_at_once(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=10, maxUnavailablePercent=20)
    r = c.remediator()
    for _ in range(4):
        for i in range(5):
            c.push(f"n{i}", 0)
        await r.step()
        c.clock.advance(6.0)
    cordoned = [i for i in range(10) if c.node(f"n{i}")["spec"].get("unschedulable")]
    assert len(cordoned) == 2
    waiting = [n for n, rec in r.records.items() if rec.phase.value == "suspect"]
    assert len(waiting) == 3
    assert {x["node"] for x in r.view()} == {f"n{i}" for i in range(5)}


async def test_dry_run_changes_nothing_on_the_server(kube: FakeKube, kubeconfig: Path) -> None:
    c = Cluster(kube, kubeconfig, dryRun=True)
    c.pod("p", "n0", 0, QosClass.BEST_EFFORT)
    before = json.dumps(c.node("n0"), sort_keys=True)
    r = c.remediator()
    for _ in range(4):
        c.push("n0", 0)
        await r.step()
        c.clock.advance(6.0)
    assert json.dumps(c.node("n0"), sort_keys=True) == before
    assert c.pods() == {"p"}
    assert c.events("DryRunEdgeGPUCordoned")
    assert r.records["n0"].phase.value == "draining"
    assert r.requests("n0") == {}
    assert not [m for m, _ in kube.requests_to("/nodes/") if m == "PATCH"]


async def test_only_the_leader_acts_and_the_opt_out_label_holds(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.live("n1")["metadata"]["labels"]["edgegpu.io/remediation"] = "disabled"
    follower = c.remediator("replica-b", leading=False)
    leader = c.remediator("replica-a")
    for _ in range(3):
        c.push("n0", 0)
        c.push("n1", 0)
        await follower.step()
        await leader.step()
        c.clock.advance(6.0)
    assert follower.records == {} and follower.requests("n0") == {}
    assert c.node("n0")["spec"].get("unschedulable") is True
    assert c.record("n0")["owner"] == "replica-a"
    assert not c.node("n1")["spec"].get("unschedulable")


async def test_a_node_not_ready_and_silent_is_cordoned_after_unreachable_after_and_not_drained(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.pod("edge-app", "n1", 0, QosClass.INFERENCE)
    r = c.remediator()
    c.clock.advance(600.0)  # both silent
    c.live("n1")["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    for _ in range(3):
        await r.step()
        c.clock.advance(6.0)
    # Silent and NotReady for 18 s of this replica's life: an edge link that dropped.
    assert not c.node("n1")["spec"].get("unschedulable")
    c.clock.advance(300.0)  # unreachableAfter (5m)
    for _ in range(3):
        await r.step()
        c.clock.advance(6.0)
    assert not c.node("n0")["spec"].get("unschedulable")  # silent, still Ready: edge link down
    assert c.node("n1")["spec"].get("unschedulable") is True
    assert c.record("n1")["reason"] == "node:not-ready-silent"
    assert "edge-app" in c.pods()  # Kubernetes evicts by the pod's own tolerations, not us


async def test_the_push_answer_carries_the_request_and_debug_shows_the_node(
    kube: FakeKube, kubeconfig: Path
) -> None:
    from scheduler_extender.api.ingest import answer
    from scheduler_extender.remediation.faults import Phase, Record
    from scheduler_extender.telemetry.store import PutResult
    from tests.k8s.conftest import running_extender

    async with running_extender(kubeconfig, leader_elect=False, debug_endpoints="on") as (
        app,
        client,
    ):
        ctx = app.state.ctx
        ctx.state.set_policy(
            parse_policy({"spec": {"remediation": {"enabled": True, "dryRun": False}}})
        )
        assert ctx.remediator is not None
        ctx.remediator.records["n0"] = Record(Phase.SELF_TEST, "gpu0:xid:79", 1e9, 1e9, "me",
                                              (0,), request="abc")  # fmt: skip
        ctx.state.ingest(report_from(report("n0", [gpu(0)])))  # the push being answered
        await ctx.remediator.act.sync_clock("edgegpu-system", "any")  # as each round does
        status, body = answer(ctx, "n0", PutResult(True))
        assert status == 200 and json.loads(body)["self_test"] == {"id": "abc"}
        assert "self_test" not in json.loads(answer(ctx, "n1", PutResult(True))[1])
        doc = (await client.get("/debug/remediation")).json()
        assert doc["enabled"] and not doc["dryRun"]
        (row,) = doc["nodes"]
        assert row["node"] == "n0" and row["state"] == "self-test" and row["next"]


async def drain(c: Cluster, r: Remediator, node: str = "n0", gpu: int = 0) -> None:
    """An XID on ``gpu`` of ``node``, confirmed: the node is cordoned and drained."""
    c.push(node, gpu)
    await r.step()
    c.clock.advance(6.0)
    c.push(node, gpu)
    await r.step()


async def to_self_test(c: Cluster, r: Remediator, host: str = "host-1") -> str:
    c.push("n0", 0, host=host)
    await r.step()
    c.clock.advance(6.0)
    c.push("n0", 0, host=host)
    await r.step()
    await r.step()
    assert c.record("n0")["state"] == "self-test"
    return str(r.requests("n0")["self_test"]["id"])


async def test_a_failed_self_test_asks_the_booted_node_to_reboot_and_not_again_once_back(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    request = await to_self_test(c, r)
    c.self_test = {"id": request, "verdict": "fail", "detail": "dcgmi diag: fail"}
    c.push("n0", 0, host="host-1")
    await r.step()
    assert c.record("n0")["state"] == "reboot-requested"
    assert "reboot" in r.requests("n0")
    c.self_test = None
    c.push("n0", 0, boot="boot-2", host="host-2")  # back after the reboot: its first push
    assert r.requests("n0") == {}  # not asked to reboot again
    await r.step()
    assert c.record("n0")["state"] == "verifying"
    assert set(r.requests("n0")) == {"self_test"}


async def test_switching_dry_run_off_cordons_rather_than_releasing(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, dryRun=True)
    r = c.remediator()
    for _ in range(3):
        c.push("n0", 0)
        await r.step()
        c.clock.advance(6.0)
    assert r.records["n0"].phase.value == "draining"  # planned only
    c.state.set_policy(parse_policy({"spec": {"remediation": {"enabled": True, "dryRun": False}}}))
    for _ in range(2):
        c.push("n0", 0)
        await r.step()
        c.clock.advance(6.0)
    assert c.node("n0")["spec"].get("unschedulable") is True
    assert c.record("n0")["state"] in ("draining", "self-test")


async def test_nothing_is_read_back_or_done_before_the_node_watch_has_listed(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    first = c.remediator()
    await to_self_test(c, first)
    listed = [False]
    second = c.remediator("replica-b", synced=lambda: listed[0])
    c.push("n0")  # the fault has cleared meanwhile
    await second.step()
    assert second.records == {} and c.record("n0")["owner"] == "replica-a"
    listed[0] = True
    await second.step()
    assert second.records["n0"].phase.value == "self-test"  # resumed, not forgotten


async def test_a_condition_that_cannot_be_written_does_not_stop_the_loop(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    kube.refuse[("PATCH", "/api/v1/nodes/n0/status$")] = 403
    request = await to_self_test(c, r)
    assert c.node("n0")["spec"]["unschedulable"] is True
    c.self_test = {"id": request, "verdict": "pass", "detail": ""}
    c.push("n0")
    await r.step()
    assert not c.node("n0")["spec"].get("unschedulable") and c.record("n0") is None
    assert len(c.events("EdgeGPUCordoned")) == 1


async def test_a_pod_over_its_blocks_is_warned_at_once_and_evicted_after_the_grace(
    kube: FakeKube, kubeconfig: Path
) -> None:
    """The budget is enforced by watching; the pods within theirs are untouched."""
    c = Cluster(kube, kubeconfig)
    c.state.set_policy(parse_policy(EVICT_OVER_BUDGET))
    c.pod("big", "n0", 0, QosClass.INFERENCE)
    c.pod("small", "n0", 0, QosClass.BEST_EFFORT)
    procs = [{"pid": 1, "pod_uid": "uid-big", "used_mib": 6000.0},
             {"pid": 2, "pod_uid": "uid-small", "used_mib": 1000.0}]  # fmt: skip
    r = c.remediator()

    def sample() -> None:
        c.seq += 1
        doc = report("n0", [gpu(0, memory_used_mib=7000.0, processes=procs), gpu(1)], seq=c.seq)
        c.state.ingest(report_from(doc))

    sample()
    await r.step()
    (warned,) = c.events("EdgeGPUOverBudget")
    assert warned["involvedObject"]["name"] == "big" and "6000 MiB" in warned["message"]
    assert c.pods() == {"big", "small"}
    c.clock.advance(30.0)
    sample()
    await r.step()
    assert c.pods() == {"big", "small"} and len(c.events("EdgeGPUOverBudget")) == 1
    c.clock.advance(31.0)
    sample()
    await r.step()
    assert c.pods() == {"small"}


def test_an_old_sample_is_no_ground_for_an_over_budget_eviction(
    kube: FakeKube, kubeconfig: Path
) -> None:
    from scheduler_extender.remediation.memory import over_budget

    c = Cluster(kube, kubeconfig, count=1)
    c.pod("big", "n0", 0, QosClass.INFERENCE)
    procs = [{"pid": 1, "pod_uid": "uid-big", "used_mib": 6000.0}]
    c.state.ingest(report_from(report("n0", [gpu(0, processes=procs), gpu(1)], seq=99)))
    assert set(over_budget(c.state)) == {"uid-big"}
    c.clock.advance(60.0)  # the edge link dropped: the last sample stays, and ages
    assert over_budget(c.state) == {}
