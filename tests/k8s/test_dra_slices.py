"""The leader's ResourceSlices against the fake API server, through the real client: written
when what they say changes, put back when a person edits them, made again only from a newer
report after someone deleted one, and never written by a replica that does not lead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from scheduler_extender.k8s.dra import DraView
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.policy.document import parse_policy
from scheduler_extender.remediation.runner import Remediator
from scheduler_extender.state.cluster import ClusterState
from scheduler_extender.telemetry.clock import FakeClock
from scheduler_extender.telemetry.decode import report_from
from tests.builders import gpu, report
from tests.fakes.fake_kube import FakeKube
from tests.k8s.conftest import make_api


class Fleet:
    """Nodes with two GPUs each, reporting to a ClusterState; a leader publishing slices."""

    def __init__(self, kube: FakeKube, kubeconfig: Path, *nodes: str) -> None:
        self.kube = kube
        self.clock = FakeClock()
        self.state = ClusterState(self.clock, parse_policy({"spec": {}}))
        self.view = DraView(self.clock.monotonic)
        self.leading = True
        self.synced = True
        self.seq = 0
        self.remediator = Remediator(
            self.state, make_api(kubeconfig), ExtenderMetrics(CollectorRegistry(), self.state),
            lambda _s: self.leading,
            nodes=lambda: {k[2]: v for k, v in kube.objects.items() if k[0] == "nodes"},
            synced=lambda: self.synced, dra=self.view,
        )  # fmt: skip
        for node in nodes:
            kube.add_node(node)

    def push(self, node: str, temperature_c: float = 50.0, registered: bool = True) -> None:
        self.seq += 1
        doc = report(node, [gpu(0, temperature_c=temperature_c), gpu(1)], seq=self.seq)
        doc["node_health"]["dra_plugin_registered"] = registered
        self.state.ingest(report_from(doc))

    def watch(self) -> None:
        """What the slices' watch would have shown by now."""
        self.view.replace_slices(self.slices())

    async def step(self) -> None:
        self.watch()
        assert self.remediator.slices is not None
        await self.remediator.slices.step()

    def slices(self) -> list[dict[str, Any]]:
        return [v for k, v in self.kube.objects.items() if k[0] == "resourceslices"]

    def only(self) -> dict[str, Any]:
        (one,) = self.slices()
        return one


def _taints(doc: dict[str, Any]) -> dict[int, list[str]]:
    return {d["attributes"]["index"]["int"]: [t["key"] for t in d.get("taints", [])]
            for d in doc["spec"]["devices"]}  # fmt: skip


async def test_a_slice_is_written_when_what_it_says_changes_and_not_per_sample(kube, kubeconfig):
    fleet = Fleet(kube, kubeconfig, "a")
    fleet.push("a")
    await fleet.step()
    first = fleet.only()
    assert first["spec"]["nodeName"] == "a"
    assert (
        first["metadata"]["ownerReferences"][0]["uid"] == kube.get("nodes", "a")["metadata"]["uid"]
    )
    version = first["metadata"]["resourceVersion"]
    for t in (55.0, 61.0, 70.0):
        fleet.clock.advance(5)
        fleet.push("a", temperature_c=t)
        await fleet.step()
    assert fleet.only()["metadata"]["resourceVersion"] == version
    fleet.clock.advance(5)
    fleet.push("a", temperature_c=91.0)
    await fleet.step()
    assert _taints(fleet.only()) == {0: ["gpu.edgegpu.io/hot"], 1: []}
    assert fleet.only()["spec"]["pool"]["generation"] == 1


async def test_a_slice_a_person_edited_is_put_back(kube, kubeconfig):
    fleet = Fleet(kube, kubeconfig, "a")
    fleet.push("a", temperature_c=91.0)
    await fleet.step()
    live = fleet.only()
    live["spec"]["devices"][0].pop("taints")  # someone lifts the taint by hand
    kube.put("resourceslices", live)
    await fleet.step()
    assert _taints(fleet.only())[0] == ["gpu.edgegpu.io/hot"]


async def test_a_deleted_slice_is_made_again_only_from_a_newer_report(kube, kubeconfig):
    fleet = Fleet(kube, kubeconfig, "a")
    fleet.push("a")
    await fleet.step()
    # kubelet wipes the node's slices (its start, or the plugin gone): the last report still
    # says the plugin was registered, but it is older than the deletion.
    kube.delete("resourceslices", fleet.only()["metadata"]["name"])
    fleet.clock.advance(1)
    await fleet.step()
    await fleet.step()
    assert fleet.slices() == []
    fleet.clock.advance(1)
    fleet.push("a")
    await fleet.step()
    assert len(fleet.slices()) == 1


async def test_a_stale_node_gets_no_new_slice_and_keeps_the_one_it_has(kube, kubeconfig):
    fleet = Fleet(kube, kubeconfig, "a", "b")
    fleet.push("a")
    fleet.push("b")
    await fleet.step()
    assert len(fleet.slices()) == 2
    fleet.clock.advance(3600)  # both silent: an edge link down is not the plugin going away
    await fleet.step()
    assert len(fleet.slices()) == 2
    kube.delete("resourceslices", next(s for s in fleet.slices()
                                       if s["spec"]["nodeName"] == "b")["metadata"]["name"])  # fmt: skip
    await fleet.step()
    assert [s["spec"]["nodeName"] for s in fleet.slices()] == ["a"]


async def test_a_node_whose_agent_serves_no_plugin_loses_its_slice_not_a_restarting_one(
    kube, kubeconfig
):
    fleet = Fleet(kube, kubeconfig, "a")
    fleet.push("a")
    await fleet.step()
    # A restarted agent says "not registered" until kubelet has taken its plugin again.
    fleet.push("a", registered=False)
    await fleet.step()
    fleet.clock.advance(2)
    fleet.push("a")
    await fleet.step()
    version = fleet.only()["metadata"]["resourceVersion"]
    fleet.push("a", registered=False)
    await fleet.step()
    fleet.clock.advance(29)
    fleet.push("a", registered=False)
    await fleet.step()
    assert fleet.only()["metadata"]["resourceVersion"] == version
    fleet.clock.advance(1)
    fleet.push("a", registered=False)
    await fleet.step()
    assert fleet.slices() == []


async def test_nothing_is_written_by_a_replica_that_does_not_lead_or_has_no_node_cache(
    kube, kubeconfig
):
    fleet = Fleet(kube, kubeconfig, "a")
    fleet.push("a")
    fleet.leading = False
    await fleet.step()
    assert fleet.slices() == []
    fleet.leading = True
    await fleet.step()
    assert len(fleet.slices()) == 1
    # A new leader whose Node cache is not listed yet deletes nothing it cannot see a Node for.
    fleet.synced = False
    kube.objects.pop(("nodes", "", "a"))
    await fleet.step()
    assert len(fleet.slices()) == 1


async def test_a_slice_someone_made_for_a_node_under_our_name_is_not_taken_for_ours(
    kube, kubeconfig
):
    fleet = Fleet(kube, kubeconfig, "a")
    # A node's kubelet credentials may write slices for itself under any name and driver.
    kube.put("resourceslices", {
        "metadata": {"name": "a-gpu.edgegpu.io-x"},
        "spec": {"driver": "gpu.edgegpu.io", "nodeName": "a", "pool": {"name": "a"},
                 "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-evil"}}}]},
    })  # fmt: skip
    fleet.push("a")
    await fleet.step()
    ours = [s for s in fleet.slices()
            if s["metadata"].get("labels", {}).get("app.kubernetes.io/managed-by") == "edgegpu"]  # fmt: skip
    assert len(ours) == 1 and len(fleet.slices()) == 2
    assert fleet.view.gpu_uuid("a", "gpu-0") is None


async def test_a_second_slice_of_a_node_is_deleted_and_the_first_kept(kube, kubeconfig):
    fleet = Fleet(kube, kubeconfig, "a")
    fleet.push("a")
    await fleet.step()
    first = fleet.only()
    # A create whose answer was lost (a timeout) and made again: two slices in one pool.
    extra = {**first, "metadata": {**first["metadata"], "name": "a-gpu.edgegpu.io-00000",
                                   "uid": "extra", "creationTimestamp": "2026-12-02T10:00:09Z"}}  # fmt: skip
    extra["metadata"].pop("resourceVersion", None)
    kube.put("resourceslices", extra)
    await fleet.step()
    assert fleet.only()["metadata"]["name"] == first["metadata"]["name"]


async def test_a_created_slice_the_watch_has_not_shown_yet_is_not_made_again(kube, kubeconfig):
    fleet = Fleet(kube, kubeconfig, "a")
    fleet.push("a")
    fleet.watch()
    assert fleet.remediator.slices is not None
    for _ in range(3):  # the watch lags: only the create's answer says the slice is there
        fleet.clock.advance(2)
        fleet.push("a")
        await fleet.remediator.slices.step()
    assert len(fleet.slices()) == 1


async def test_the_write_cap_reaches_every_node_across_rounds(kube, kubeconfig, monkeypatch):
    monkeypatch.setattr("scheduler_extender.remediation.slices.MAX_WRITES", 1)
    fleet = Fleet(kube, kubeconfig, "a", "b")
    fleet.push("a", temperature_c=91.0)
    fleet.push("b")
    await fleet.step()
    for _ in range(2):
        # Someone keeps lifting a's taint: a needs a write every round, and b still gets one.
        live = next(x for x in fleet.slices() if x["spec"]["nodeName"] == "a")
        live["spec"]["devices"][0].pop("taints", None)
        kube.put("resourceslices", live)
        await fleet.step()
    assert sorted(s["spec"]["nodeName"] for s in fleet.slices()) == ["a", "b"]


async def test_a_grace_counted_while_another_replica_led_starts_again(kube, kubeconfig):
    fleet = Fleet(kube, kubeconfig, "a")
    fleet.push("a")
    await fleet.step()
    fleet.push("a", registered=False)
    await fleet.step()  # the plugin's grace starts here
    fleet.clock.advance(20)
    fleet.leading = False
    await fleet.step()
    fleet.clock.advance(20)
    fleet.leading = True
    fleet.push("a", registered=False)
    await fleet.step()  # leading again: the grace starts again, not 40 s old
    assert len(fleet.slices()) == 1
    fleet.clock.advance(30)
    fleet.push("a", registered=False)
    await fleet.step()
    assert fleet.slices() == []


async def test_a_slice_edited_away_from_our_label_is_deleted_and_ours_made_again(kube, kubeconfig):
    fleet = Fleet(kube, kubeconfig, "a")
    fleet.push("a", temperature_c=91.0)
    await fleet.step()
    edited = fleet.only()
    edited["metadata"]["labels"] = {}  # it would publish a's GPUs without the hot taint
    edited["spec"]["devices"][0].pop("taints")
    kube.put("resourceslices", edited)
    fleet.view.slice_event("MODIFIED", kube.get("resourceslices", edited["metadata"]["name"], ""))
    await fleet.remediator.slices.step()  # type: ignore[union-attr]
    assert fleet.slices() == []
    fleet.clock.advance(1)
    fleet.push("a", temperature_c=91.0)
    await fleet.step()
    assert _taints(fleet.only())[0] == ["gpu.edgegpu.io/hot"]
    assert fleet.only()["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "edgegpu"
