"""edgegpu on nodes run by the real kubelet, containerd and runc (``tests/e2e/realnode.py``).

Here the real kubelet decides: its device manager takes the agent's registration, its admission
calls the plugin's Allocate and puts the answer into a container that runc starts, its
PodResources API says who holds which device, and it kills the container when the fault loop
evicts the pod. There is no GPU: the agent's backend is simulated, and the container gets the
plugin's environment, not ``/dev/nvidia*``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from node_agent.deviceplugin.devices import gpu_of
from node_agent.deviceplugin.podresources import pod_devices
from tests.e2e.conftest import REAL_NODES, Cluster, until
from tests.e2e.realnode import real_pod
from tests.e2e.test_policy_and_auth import patch_policy
from tests.e2e.test_remediation import _policy_in_force

BLOCK = "edgegpu.io/gpu-mem-block"
T4_BLOCKS = 3
"""Blocks of one simulated Tesla T4 (15 GiB in 4 GiB blocks)."""
PRINT_ENV = "env | sort; echo ---; trap 'exit 0' TERM; while true; do sleep 1; done"
"""A container that prints its environment, then waits to be stopped."""


def envs_of(cluster: Cluster, ns: str, name: str) -> dict[str, str] | None:
    """What the container printed of its environment (through kubelet's log endpoint)."""
    out = cluster.cp.kubectl("logs", "-n", ns, name, check=False)
    if out.returncode != 0 or "---" not in out.stdout:
        return None
    lines = out.stdout.split("---", 1)[0].splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def phase(cluster: Cluster, ns: str, name: str) -> str | None:
    pod = cluster.get_pod(ns, name) or {}
    found: str | None = (pod.get("status") or {}).get("phase")
    return found


def test_the_real_kubelet_counts_the_blocks_the_agent_registers(cluster: Cluster) -> None:
    for name, gpus, _ in REAL_NODES:

        def capacity(node: str = name) -> str | None:
            doc = cluster.cp.get(f"/api/v1/nodes/{node}") or {}
            value: str | None = (doc.get("status") or {}).get("capacity", {}).get(BLOCK)
            return value if value not in (None, "0") else None

        assert until(f"{BLOCK} capacity of {name}", capacity, 60.0) == str(gpus * T4_BLOCKS)
        node = cluster.cp.get(f"/api/v1/nodes/{name}") or {}
        info = node["status"]["nodeInfo"]
        assert info["containerRuntimeVersion"].startswith("containerd://"), info
        assert info["kubeletVersion"].startswith("v1.36"), info


def test_containers_on_a_real_node_get_the_gpu_bind_chose_and_podresources_agrees(
    cluster: Cluster, ns: str, say: Callable[[str], None]
) -> None:
    node = REAL_NODES[0][0]
    started = time.monotonic()
    # Two blocks each of a three-block T4: the two pods cannot share a GPU.
    names = ["infer-0", "infer-1"]
    for name in names:
        pod = cluster.pod(name, ns, blocks=2, qos="inference",
                          node_selector={"kubernetes.io/hostname": node})  # fmt: skip
        cluster.create(real_pod(pod, PRINT_ENV))
    running = until("both pods Running on the real node",
                    lambda: all(phase(cluster, ns, n) == "Running" for n in names), 120.0)  # fmt: skip
    assert running
    seconds = time.monotonic() - started
    given: dict[str, str] = {}
    for name in names:
        pod = cluster.get_pod(ns, name) or {}
        annotations = pod["metadata"]["annotations"]
        envs = until(f"{name}'s printed environment", lambda n=name: envs_of(cluster, ns, n), 60.0)
        assert envs["NVIDIA_VISIBLE_DEVICES"] == annotations["edgegpu.io/gpu-uuid"], envs
        assert envs["EDGEGPU_GPU_UUID"] == annotations["edgegpu.io/gpu-uuid"], envs
        assert envs["EDGEGPU_MEM_LIMIT_MIB"] == str(2 * 4096), envs
        given[name] = envs["NVIDIA_VISIBLE_DEVICES"]
    assert len(set(given.values())) == 2, given

    # kubelet's PodResources: each container holds two blocks, all of its own pod's GPU.
    socket = cluster.real[node].pod_resources_socket
    listing: list[Any] | None = asyncio.run(pod_devices(socket, BLOCK)())  # type: ignore[arg-type]
    held = {f"{p.namespace}/{p.name}": p.containers for p in listing or [] if p.namespace == ns}
    assert set(held) == {f"{ns}/{n}" for n in names}, held
    for name in names:
        (devices,) = held[f"{ns}/{name}"]
        assert len(devices) == 2 and {gpu_of(d) for d in devices} == {given[name]}, devices

    # The extender's reservations say the same GPUs.
    view = cluster.extenders[0].get(f"/debug/nodes/{node}")
    uuids = {g["index"]: g["uuid"] for g in view["gpus"]}
    reserved = {r["pod"]: [uuids[i] for i in r["gpus"]] for r in view["reservations"]}
    for name in names:
        assert reserved[f"{ns}/{name}"] == [given[name]], reserved
    say(
        f"real node: 2 two-block pods created → Running on {node} in {seconds:.1f} s; each "
        f"container's NVIDIA_VISIBLE_DEVICES = its bind's GPU ({len(given)} distinct GPUs), "
        f"PodResources and the extender agree"
    )


def _deployment(cluster: Cluster, ns: str) -> dict[str, Any]:
    rack = {"edgegpu.io/rack": REAL_NODES[0][2]}
    pod = cluster.pod("worker", ns, blocks=T4_BLOCKS, qos="inference", node_selector=rack)
    template = real_pod(pod, PRINT_ENV)
    template["metadata"] = {"labels": {"app": "worker"},
                            "annotations": {"edgegpu.io/qos": "inference"}}  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "worker", "namespace": ns},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "worker"}},
                 "template": template},
    }  # fmt: skip


def _workers(cluster: Cluster, ns: str) -> list[dict[str, Any]]:
    doc = cluster.cp.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3Dworker") or {}
    return [p for p in doc.get("items") or [] if not p["metadata"].get("deletionTimestamp")]


def _running(pod: dict[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)


def test_the_fault_loop_on_a_real_node_drains_it_through_the_real_kubelet(
    cluster: Cluster, ns: str, say: Callable[[str], None]
) -> None:
    faulty, spare = REAL_NODES[0][0], REAL_NODES[1][0]
    cluster.cp.kubectl("cordon", spare)  # the workers start on the faulty node, one per GPU
    try:
        resp = cluster.cp.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments",
                                  json=_deployment(cluster, ns))  # fmt: skip
        assert resp.status_code == 201, resp.text
        pods = until(
            f"both workers' containers running on {faulty}",
            lambda: len(found := [p for p in _workers(cluster, ns)
                                  if p["spec"].get("nodeName") == faulty and _running(p)]) == 2
            and found,
            120.0,
        )  # fmt: skip
    finally:
        cluster.cp.kubectl("uncordon", spare)
    gpu0 = cluster.extenders[0].get(f"/debug/nodes/{faulty}")["gpus"][0]["uuid"]
    (first,) = [p for p in pods if p["metadata"]["annotations"]["edgegpu.io/gpu-uuid"] == gpu0]
    (other,) = [p for p in pods if p is not first]  # on GPU 1, which stays healthy
    container = first["status"]["containerStatuses"][0]["containerID"].split("//", 1)[1]
    assert container in cluster.real[faulty].tasks()
    patch_policy(cluster, {"remediation": {"enabled": True, "dryRun": False,
                                            "maxUnavailablePercent": 50}})  # fmt: skip
    agent = cluster.agents[faulty]
    try:
        until("remediation on in every replica", lambda: _policy_in_force(cluster, True), 30.0)
        agent.stop()  # the agent restarts, and GPU 0 raises XID 79 until a self-test passes
        agent.scenario = "xid-79"
        agent.start()
        t0 = time.monotonic()
        marks: dict[str, float] = {}

        def progress() -> bool:
            node = cluster.cp.get(f"/api/v1/nodes/{faulty}") or {}
            if node.get("spec", {}).get("unschedulable"):
                marks.setdefault("cordoned", time.monotonic() - t0)
            if "cordoned" in marks and container not in cluster.real[faulty].tasks():
                marks.setdefault("killed", time.monotonic() - t0)
            if cluster.get_pod(ns, first["metadata"]["name"]) is None:
                marks.setdefault("deleted", time.monotonic() - t0)
            moved = [p for p in _workers(cluster, ns)
                     if p["spec"].get("nodeName") == spare and _running(p)]  # fmt: skip
            if moved and "killed" in marks:
                marks.setdefault("replaced", time.monotonic() - t0)
            return {"cordoned", "killed", "deleted", "replaced"} <= set(marks)

        until("cordon → eviction → the real kubelet kills the container → a replacement "
              f"Running on {spare}", progress, 180.0)  # fmt: skip
        (moved,) = [p for p in _workers(cluster, ns) if p["spec"].get("nodeName") == spare]
        assert cluster.get_pod(ns, other["metadata"]["name"]), "the healthy GPU's pod evicted"
        envs = until("the replacement's printed environment",
                     lambda: envs_of(cluster, ns, moved["metadata"]["name"]), 60.0)  # fmt: skip
        assert (
            envs["NVIDIA_VISIBLE_DEVICES"]
            == moved["metadata"]["annotations"]["edgegpu.io/gpu-uuid"]
        ), envs

        def handed_back() -> bool:
            node = cluster.cp.get(f"/api/v1/nodes/{faulty}") or {}
            notes = node["metadata"].get("annotations") or {}
            return not node["spec"].get("unschedulable") and "edgegpu.io/remediation" not in notes

        until(f"{faulty} uncordoned after its self-test passed", handed_back, 180.0)
        marks["uncordoned"] = time.monotonic() - t0
        kept = cluster.get_pod(ns, other["metadata"]["name"])
        assert kept and _running(kept), "the pod on the healthy GPU was not left alone"
        say(
            f"fault loop on a real node (seconds from the faulty agent's start): cordoned "
            f"{marks['cordoned']:.1f}, container killed by kubelet {marks['killed']:.1f}, pod "
            f"gone {marks['deleted']:.1f}, replacement Running on {spare} "
            f"{marks['replaced']:.1f}, uncordoned after the self-test {marks['uncordoned']:.1f}"
        )
    finally:
        patch_policy(cluster, {"remediation": {"enabled": False, "dryRun": True,
                                                "maxUnavailablePercent": 10}})  # fmt: skip
        agent.stop()
        agent.scenario = "steady"
        agent.start()
