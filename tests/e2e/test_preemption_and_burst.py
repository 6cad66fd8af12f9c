"""Preemption through /preempt (whole GPUs and memory blocks), block pods that fit on no one GPU
waiting without preemption churn, and a burst of pods bound without a refusal (kube-scheduler
binds in the background while it filters on)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.e2e.conftest import Cluster, device_plugin, until
from tests.e2e.edgegpu import Agent

LOW, HIGH = "e2e-low", "e2e-high"


def priority_classes(cluster: Cluster) -> None:
    for name, value in ((LOW, 100), (HIGH, 100_000)):
        cluster.cp.request(
            "POST",
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            json={"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                  "metadata": {"name": name}, "value": value},
        )  # fmt: skip


def on(node: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": node}


def test_whole_gpu_preemption_goes_through_the_extenders_preempt(cluster: Cluster, ns: str) -> None:
    priority_classes(cluster)
    for i in range(4):  # gpu-a has 4 GPUs
        cluster.create(cluster.pod(f"low-{i}", ns, gpus=1, qos="best-effort",
                                   priority_class=LOW, node_selector=on("gpu-a")))  # fmt: skip
    for i in range(4):
        cluster.wait_bound(ns, f"low-{i}")
    cluster.create(cluster.pod("urgent", ns, gpus=1, qos="training", priority_class=HIGH,
                               node_selector=on("gpu-a")))  # fmt: skip
    pod = cluster.wait_bound(ns, "urgent", 60.0)
    assert pod["spec"]["nodeName"] == "gpu-a"
    assert any(
        p.endswith("/preempt") and name == "urgent" for p, _, name in cluster.balancer.served
    )
    gone = [i for i in range(4) if cluster.get_pod(ns, f"low-{i}") is None]
    assert len(gone) == 1, gone  # one victim was enough


def fill(cluster: Cluster, ns: str, node: str, leave: int) -> list[dict[str, Any]]:
    """One low-priority pod on each GPU of ``node``, of all its free blocks but ``leave``
    (once the pods of earlier tests are gone from it)."""

    def empty() -> list[dict[str, Any]] | None:
        pods = cluster.cp.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}") or {}
        if any("gpu-mem-block" in str(p["spec"]["containers"]) for p in pods.get("items") or []):
            return None
        rows = {r["node"]: r for r in cluster.extenders[0].get("/debug/nodes")["nodes"]}
        gpus: list[dict[str, Any]] = rows[node]["gpus"]
        return gpus if not any(g["allocated_blocks"] for g in gpus) else None

    gpus = until(f"{node} without block pods", empty, 60.0)
    for g in gpus:
        cluster.create(cluster.pod(f"fill-{g['index']}", ns, blocks=g["free_blocks"] - leave,
                                   priority_class=LOW, node_selector=on(node)))  # fmt: skip
    return [cluster.wait_bound(ns, f"fill-{g['index']}") for g in gpus]


def test_a_block_pod_preempts_a_lower_priority_block_pod(
    cluster: Cluster, ns: str, say: Callable[[str], None]
) -> None:
    # Every block gpu-c advertises is taken: kube-scheduler's own count fails the node, its
    # preemption picks a victim, and /preempt keeps it where that victim's GPU makes room.
    priority_classes(cluster)
    fills = fill(cluster, ns, "gpu-c", leave=0)
    cluster.create(cluster.pod("late", ns, blocks=1, qos="training", priority_class=HIGH,
                               node_selector=on("gpu-c")))  # fmt: skip
    late = cluster.wait_bound(ns, "late", 60.0)
    assert late["spec"]["nodeName"] == "gpu-c"
    assert any(p.endswith("/preempt") and name == "late" for p, _, name in cluster.balancer.served)

    def gone(pod: dict[str, Any]) -> bool:
        now = cluster.get_pod(ns, pod["metadata"]["name"])
        return (
            now is None
            or now["metadata"]["uid"] != pod["metadata"]["uid"]
            or bool(now["metadata"].get("deletionTimestamp"))
        )

    victims = [f for f in fills if gone(f)]
    assert len(victims) == 1, [v["metadata"]["name"] for v in victims]  # one was enough
    gpu = late["metadata"]["annotations"]["edgegpu.io/gpu-index"]
    assert gpu == victims[0]["metadata"]["annotations"]["edgegpu.io/gpu-index"]
    say(f"\nblock preemption: late (1 block, high priority) took GPU {gpu} of gpu-c from "
        f"{victims[0]['metadata']['name']} ({len(fills)} low-priority pods held every block)")  # fmt: skip


def test_a_block_pod_that_fits_on_no_one_gpu_waits_without_preemption_churn(
    cluster: Cluster, ns: str, say: Callable[[str], None]
) -> None:
    # One free block left on each GPU of gpu-c: the node has blocks enough for a 2-block pod,
    # so kube-scheduler's count passes it and its preemption finds no victim to take; the
    # extender's verdict (no room on one GPU) is final, and the pod waits for room.
    priority_classes(cluster)
    fill(cluster, ns, "gpu-c", leave=1)
    cluster.create(cluster.pod("late", ns, blocks=2, priority_class=HIGH,
                               node_selector=on("gpu-c")))  # fmt: skip
    time.sleep(10.0)
    filters = [
        1 for p, _, name in cluster.balancer.served if name == "late" and p.endswith("/filter")
    ]
    late = cluster.get_pod(ns, "late") or {}
    messages = [e.get("message", "") for e in cluster.events(ns, "late")]
    say(f"\nfilter calls for a high-priority block pod that fits on no one GPU, in 10 s: "
        f"{len(filters)}; nominated: {late.get('status', {}).get('nominatedNodeName')}; "
        f"events: {messages}")  # fmt: skip
    assert not late["spec"].get("nodeName")
    assert not late.get("status", {}).get("nominatedNodeName")
    assert not any("victim" in m and "expected" in m for m in messages), messages
    # Room freed by a finished pod is taken as soon as it is there.
    cluster.cp.request("DELETE", f"/api/v1/namespaces/{ns}/pods/fill-0")
    assert cluster.wait_bound(ns, "late", 60.0)["spec"]["nodeName"] == "gpu-c"


BURST_NODES = 7
BURST_GPUS = 8
BURST_PODS = 200


def test_a_burst_of_pods_binds_without_a_refusal(
    cluster: Cluster, ns: str, say: Callable[[str], None]
) -> None:
    taint = {"key": "e2e/burst", "value": "true", "effect": "NoSchedule"}
    urls = [e.ingest_url for e in cluster.extenders]
    agents = []
    for i in range(BURST_NODES):
        name = f"burst-{i}"
        cluster.kubelet.add_node(name, gpus=BURST_GPUS, taints=[taint],
                                 labels={"accelerator": "nvidia-tesla", "e2e/pool": "burst"})  # fmt: skip
        args = ["--load-pct", "0", "--model", "NVIDIA L4", *device_plugin(cluster, name)]
        agent = Agent(cluster.cp, name, BURST_GPUS, urls, seed=100 + i, interval_s=2.0,
                      extra_args=args)  # fmt: skip
        agent.start()
        agents.append(agent)

    def blocks() -> int:
        rows = [r for r in cluster.extenders[0].get("/debug/nodes")["nodes"]
                if r["node"].startswith("burst-") and r["reported"]]  # fmt: skip
        return sum(g["free_blocks"] for r in rows for g in r["gpus"])

    room = until("burst nodes reported", lambda: (b := blocks()) >= BURST_PODS and b, 60.0)
    before = refusals(cluster)
    created: dict[str, float] = {}
    try:
        pods = []
        for i in range(BURST_PODS):
            pod = cluster.pod(f"b-{i}", ns, blocks=1, node_selector={"e2e/pool": "burst"})
            pod["spec"]["tolerations"] = [{"key": "e2e/burst", "operator": "Exists"}]
            pods.append(pod)

        def create(pod: dict[str, Any]) -> None:
            created[pod["metadata"]["name"]] = time.monotonic()
            cluster.create(pod)

        with ThreadPoolExecutor(8) as pool:  # as fast as the API server takes them
            list(pool.map(create, pods))
        bound_at: dict[str, float] = {}
        deadline = time.monotonic() + 180.0
        while len(bound_at) < BURST_PODS and time.monotonic() < deadline:
            items = (cluster.cp.get(f"/api/v1/namespaces/{ns}/pods") or {}).get("items") or []
            now = time.monotonic()
            for p in items:
                if p["spec"].get("nodeName") and p["metadata"]["name"] not in bound_at:
                    bound_at[p["metadata"]["name"]] = now
            time.sleep(0.1)
        waits = sorted(bound_at[n] - created[n] for n in bound_at)
        refused = refusals(cluster) - before
        p50 = statistics.median(waits) if waits else float("nan")
        p99 = waits[int(0.99 * (len(waits) - 1))] if waits else float("nan")
        say(f"\nburst: {BURST_PODS} one-block pods onto {BURST_NODES} nodes x {BURST_GPUS} GPUs "
            f"({room} blocks free): {len(bound_at)} bound, create->bound p50 {p50 * 1000:.0f} ms, "
            f"p99 {p99 * 1000:.0f} ms, bind refusals {refused:.0f}")  # fmt: skip
        assert len(bound_at) == BURST_PODS
        assert refused == 0
    finally:
        cluster.delete_namespace(ns)
        for agent in agents:
            agent.stop()


def refusals(cluster: Cluster) -> float:
    """Binds the extender replicas refused for want of room (every replica, summed)."""
    total = 0.0
    for ext in cluster.extenders:
        text = ext.fetch("/metrics").text
        for line in text.splitlines():
            if line.startswith("edgegpu_extender_binds_total") and 'result="no_fit"' in line:
                total += float(line.rsplit(" ", 1)[1])
    return total
