"""The GPU fault loop on the real control plane: XID 79 under a Deployment.

kube-controller-manager's ReplicaSet controller replaces the evicted pods; the fake kubelet
runs them; the simulated agent reports the fault, runs the self-test the extender asks for,
and its pass ends the workflow.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.conftest import Cluster, extra_node, reported, until
from tests.e2e.edgegpu import Agent
from tests.e2e.test_policy_and_auth import patch_policy
from tests.e2e.test_resilience import lease_holder

POOL = {"edgegpu.io/e2e-pool": "fault-loop"}


def _policy_in_force(cluster: Cluster, enabled: bool) -> bool:
    return all(
        e.get("/debug/policy")["policy"]["spec"]["remediation"]["enabled"] is enabled
        and e.get("/debug/policy")["policy"]["spec"]["remediation"]["dryRun"] is not enabled
        for e in cluster.extenders
    )


@pytest.fixture
def pool(cluster: Cluster) -> Iterator[Callable[[str], Agent]]:
    """Adds one-GPU nodes only the test's pods select (``extra_node``), gone afterwards."""
    with contextlib.ExitStack() as nodes:

        def add(name: str) -> Agent:
            return nodes.enter_context(extra_node(cluster, name, 1, [], labels=POOL))

        try:
            yield add
        finally:
            patch_policy(cluster, {"remediation": {"enabled": False, "dryRun": True,
                                                    "maxUnavailablePercent": 10}})  # fmt: skip


def _deployment(cluster: Cluster, ns: str, replicas: int) -> dict[str, Any]:
    template = cluster.pod("worker", ns, blocks=1, qos="inference", node_selector=POOL)
    template["metadata"] = {"labels": {"app": "worker"}, "annotations": {"edgegpu.io/qos": "inference"}}  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "worker", "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "worker"}},
            "template": template,
        },
    }


def _pods(cluster: Cluster, ns: str) -> list[dict[str, Any]]:
    doc = cluster.cp.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3Dworker") or {}
    return list(doc.get("items") or [])


def _running_on(pods: list[dict[str, Any]], node: str) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in pods
        if p["spec"].get("nodeName") == node
        and (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]


def test_xid_79_under_a_deployment_recovers_on_healthy_nodes_and_the_node_comes_back(
    cluster: Cluster, ns: str, pool: Callable[[str], Agent], say: Callable[[str], None]
) -> None:
    replicas = 2
    fault = pool("fault-0")
    until("fault-0 reported to every replica",
          lambda: reported(cluster, "fault-0"), 60.0)  # fmt: skip
    resp = cluster.cp.request(
        "POST",
        f"/apis/apps/v1/namespaces/{ns}/deployments",
        json=_deployment(cluster, ns, replicas),
    )
    assert resp.status_code == 201, resp.text
    until("every replica Running on fault-0",
          lambda: len(_running_on(_pods(cluster, ns), "fault-0")) == replicas, 60.0)  # fmt: skip
    first = set(_running_on(_pods(cluster, ns), "fault-0"))
    pool("spare-0")
    until("spare-0 reported to every replica",
          lambda: reported(cluster, "spare-0"), 60.0)  # fmt: skip
    patch_policy(cluster, {"remediation": {"enabled": True, "dryRun": False,
                                            "maxUnavailablePercent": 50}})  # fmt: skip
    until("remediation enabled on every replica", lambda: _policy_in_force(cluster, True), 30.0)

    fault.stop()  # the agent restarts, and GPU 0 raises XID 79
    fault.scenario = "xid-79"
    fault.start()
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    owners: list[Any] = []

    def mark(what: str, done: bool) -> bool:
        if done and what not in marks:
            marks[what] = time.monotonic() - t0
        return done

    def progress() -> bool:
        gpu = cluster.extenders[0].get("/debug/nodes/fault-0")["gpus"][0]
        mark("a", gpu["health"] == "unhealthy")
        node = cluster.cp.get("/api/v1/nodes/fault-0") or {}
        mark("b", bool(node.get("spec", {}).get("unschedulable")))
        note = (node.get("metadata", {}).get("annotations") or {}).get("edgegpu.io/remediation")
        if note and not owners:
            owners.append(json.loads(note)["owner"])
            owners.append(lease_holder(cluster))
            owners.append(
                [e.name for e in cluster.extenders if e.get("/debug/remediation")["nodes"]]
            )
        pods = _pods(cluster, ns)
        left = [p for p in pods if p["metadata"]["name"] in first
                and not p["metadata"].get("deletionTimestamp")]  # fmt: skip
        mark("c", "b" in marks and not left)
        mark("d", "c" in marks and len(_running_on(pods, "spare-0")) == replicas)
        return "d" in marks

    until("the fault's pods evicted and replaced on spare-0", progress, 120.0)

    def uncordoned() -> bool:
        node = cluster.cp.get("/api/v1/nodes/fault-0") or {}
        notes = node["metadata"].get("annotations") or {}
        return not node["spec"].get("unschedulable") and "edgegpu.io/remediation" not in notes

    until("fault-0 uncordoned after its self-test passed", uncordoned, 120.0)
    marks["e"] = time.monotonic() - t0

    def condition() -> dict[str, Any]:  # written after the uncordon, by a call of its own
        node = cluster.cp.get("/api/v1/nodes/fault-0") or {}
        return next(c for c in node["status"]["conditions"] if c["type"] == "EdgeGPUHealthy")

    until("fault-0's EdgeGPUHealthy condition True again",
          lambda: condition()["status"] == "True", 30.0)  # fmt: skip
    node = cluster.cp.get("/api/v1/nodes/fault-0") or {}
    reasons = {e["reason"] for e in cluster.events("default", "fault-0")}
    say(
        "fault loop, XID 79 under a Deployment of 2 (seconds from the faulty agent's start): "
        f"(a) GPU filtered {marks['a']:.1f}, (b) node cordoned {marks['b']:.1f}, "
        f"(c) last pod evicted {marks['c']:.1f}, (d) replacements Running elsewhere "
        f"{marks['d']:.1f}, (e) uncordoned after a passing self-test {marks['e']:.1f}"
    )
    owner, holder, acting = owners  # only the Lease holder acted, and only it shows the node
    assert owner == holder and acting == [holder], owners
    assert {"EdgeGPUCordoned", "EdgeGPUSelfTestRequested", "EdgeGPUUncordoned"} <= reasons, reasons
    assert not [
        t for t in node["spec"].get("taints") or [] if t["key"] == "edgegpu.io/gpu-unhealthy"
    ]
    # The targets, from the fault report: cordon ≤ 10 s, evicted ≤ 30 s, replaced ≤ 60 s.
    assert marks["b"] - marks["a"] <= 10.0, json.dumps(marks)
    assert marks["c"] - marks["a"] <= 30.0 and marks["d"] - marks["a"] <= 60.0, json.dumps(marks)
