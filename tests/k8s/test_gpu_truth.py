"""Assignments follow the GPU each pod really holds, as its node's agent reports it.

The agent reads kubelet's PodResources and reports ``holders``; the extender corrects the
assignments of its node's pods from them, so the fault loop (and every other path reading
``state.allocations``) acts on the pod that is on the faulty GPU.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from scheduler_extender.domain import Assignment, QosClass
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.telemetry.decode import report_from
from tests.builders import gpu, report
from tests.fakes.fake_kube import FakeKube
from tests.k8s.test_fault_loop import Cluster, drain

CORRECTED = "edgegpu_extender_assignments_corrected_total"


def holder(name: str, index: int, blocks: int = 1, namespace: str = "default") -> dict[str, Any]:
    return {"namespace": namespace, "name": name, "gpu_uuid": f"GPU-{index:04d}", "blocks": blocks}


def push_holders(c: Cluster, node: str, holders: list[dict[str, Any]] | None) -> None:
    """A healthy report of ``node``'s 2 GPUs that says which pods hold which GPU's blocks."""
    c.seq += 1
    doc = report(node, [gpu(0), gpu(1)], seq=c.seq)
    doc["holders"] = holders
    c.state.ingest(report_from(doc))


def where(c: Cluster, name: str) -> tuple[str, tuple[int, ...], tuple[str, ...]] | None:
    a = c.state.allocations.get(f"uid-{name}")
    return None if a is None else (a.node, a.gpu_indices, a.gpu_uuids)


async def test_a_pod_holding_another_gpu_than_bind_chose_is_the_one_evicted_for_that_gpu(
    kube: FakeKube, kubeconfig: Path
) -> None:
    # Two pods of the same size admitted in the other order than they were bound: each holds
    # the GPU bind chose for the other.
    c = Cluster(kube, kubeconfig)
    c.pod("first", "n0", 0, QosClass.INFERENCE)
    c.pod("second", "n0", 1, QosClass.INFERENCE)
    metrics = ExtenderMetrics(CollectorRegistry(), c.state)
    push_holders(c, "n0", [holder("first", 1), holder("second", 0)])
    assert where(c, "first") == ("n0", (1,), ("GPU-0001",))
    assert where(c, "second") == ("n0", (0,), ("GPU-0000",))
    assert metrics.registry.get_sample_value(CORRECTED) == 2.0
    push_holders(c, "n0", [holder("first", 1), holder("second", 0)])  # already the truth
    assert metrics.registry.get_sample_value(CORRECTED) == 2.0
    # GPU 1 faults (reports that say nothing of holders: the correction stays).
    r = c.remediator()
    await drain(c, r, "n0", gpu=1)
    assert c.record("n0")["state"] == "draining"
    assert c.pods() == {"second"}  # the pod on GPU 1 went; the one on healthy GPU 0 runs
    assert [e["involvedObject"]["name"] for e in c.events("EdgeGPUEvicted")] == ["first"]


async def test_a_report_naming_a_pod_of_another_node_changes_nothing(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.pod("far", "n1", 0, QosClass.INFERENCE)
    metrics = ExtenderMetrics(CollectorRegistry(), c.state)
    # n0's agent says n1's pod holds GPU 1 (of n0): not n0's to say.
    push_holders(c, "n0", [holder("far", 1)])
    assert where(c, "far") == ("n1", (0,), ("GPU-0000",))
    assert metrics.registry.get_sample_value(CORRECTED) == 0.0
    # So a fault of n1's GPU 1 leaves the pod on n1's GPU 0 alone.
    r = c.remediator()
    await drain(c, r, "n1", gpu=1)
    assert c.record("n1")["state"] == "draining"
    assert "far" in c.pods()
    assert c.events("EdgeGPUEvicted") == []


def test_a_corrected_assignment_stays_corrected_when_the_pod_watch_reads_bind_again(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.pod("p", "n0", 0, QosClass.TRAINING)
    bound = c.state.allocations.get("uid-p")
    assert bound is not None
    push_holders(c, "n0", [holder("p", 1, blocks=1)])
    c.state.assign(bound, authoritative=True)  # a pod event: the annotations say GPU 0
    assert where(c, "p") == ("n0", (1,), ("GPU-0001",))
    assert c.state.performance_gpus("n0") == [1]  # the training pod's GPU keeps its clocks
    # The pod goes; a new pod of the same uid is a new assignment.
    c.state.release("uid-p")
    c.state.assign(bound, authoritative=True)
    assert where(c, "p") == ("n0", (0,), ("GPU-0000",))


def test_what_a_report_cannot_vouch_for_is_left_as_bind_chose(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.pod("unknown-gpu", "n0", 0, QosClass.INFERENCE)
    c.pod("whole", "n0", 0, QosClass.REALTIME)
    whole = c.state.allocations.get("uid-whole")
    assert whole is not None
    c.state.assign(replace(whole, whole=True, mem_blocks=0), authoritative=True)
    c.pod("twin", "n0", 0, QosClass.INFERENCE)
    c.state.assign(  # a pod of the same name, not yet gone (a StatefulSet's next pod)
        Assignment("uid-twin-2", "default", "twin", "n0", (0,), ("GPU-0000",), 1, False,
                   QosClass.INFERENCE, None, 1.0),
        authoritative=True,
    )  # fmt: skip
    metrics = ExtenderMetrics(CollectorRegistry(), c.state)
    push_holders(c, "n0", None)  # not known: an older agent, or kubelet out of reach
    push_holders(c, "n0", [])  # nobody holds blocks: nothing to correct either
    push_holders(
        c,
        "n0",
        [
            {**holder("unknown-gpu", 1), "gpu_uuid": "GPU-not-in-this-report"},
            holder("whole", 1),  # whole GPUs are not the device plugin's
            holder("twin", 1),
        ],
    )
    assert where(c, "unknown-gpu") == ("n0", (0,), ("GPU-0000",))
    assert where(c, "whole") == ("n0", (0,), ("GPU-0000",))
    assert where(c, "twin") == ("n0", (0,), ("GPU-0000",))
    assert metrics.registry.get_sample_value(CORRECTED) == 0.0


def test_a_report_of_the_first_moments_after_a_bind_does_not_move_the_pod(
    kube: FakeKube, kubeconfig: Path
) -> None:
    # A StatefulSet's web-0 bound to GPU 0 while kubelet still lists its predecessor on GPU 1.
    c = Cluster(kube, kubeconfig)
    c.pod("web-0", "n0", 0, QosClass.INFERENCE, at=c.clock.wall())
    push_holders(c, "n0", [holder("web-0", 1)])
    assert where(c, "web-0") == ("n0", (0,), ("GPU-0000",))
    c.clock.advance(11.0)  # two report intervals on: kubelet's word counts
    push_holders(c, "n0", [holder("web-0", 1)])
    assert where(c, "web-0") == ("n0", (1,), ("GPU-0001",))


def test_a_block_pod_listed_on_two_gpus_is_left_as_bind_chose(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.pod("split", "n0", 0, QosClass.INFERENCE)
    push_holders(c, "n0", [holder("split", 0), holder("split", 1)])
    assert where(c, "split") == ("n0", (0,), ("GPU-0000",))
