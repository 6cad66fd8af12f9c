"""GPU pods through the real kube-scheduler and the extender: placement, annotations, events."""

from __future__ import annotations

import time

from tests.e2e.conftest import Cluster, device_plugin, until
from tests.e2e.edgegpu import Agent, EdgegpuScheduler

COOL = {"gpu-a", "gpu-b", "gpu-c"}


def test_the_documented_install_ran_and_the_policy_is_accepted(cluster: Cluster) -> None:
    assert cluster.installed[0].startswith("kubectl apply -f manifests/crd/")
    assert any(c == "kubectl apply -k manifests/" for c in cluster.installed)

    def accepted() -> bool:
        doc = cluster.cp.get("/apis/kepler.io/v1/gpuschedulingpolicies/edge-gpu-policy") or {}
        conds = (doc.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Accepted" and c["status"] == "True" for c in conds)

    until("policy Accepted=True", accepted)
    # The policy is cluster-scoped: the install must not have stamped a namespace on it.
    doc = cluster.cp.get("/apis/kepler.io/v1/gpuschedulingpolicies/edge-gpu-policy") or {}
    assert "namespace" not in doc["metadata"]
    # The scheduler's RoleBinding to read the authentication ConfigMap stays in kube-system.
    assert cluster.cp.get(
        "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings/"
        "edgegpu-scheduler-extension-apiserver-authentication-reader"
    )


def test_pods_of_every_qos_class_bind_with_their_gpu_annotations(cluster: Cluster, ns: str) -> None:
    specs = {
        "rt": {"gpus": 1, "qos": "realtime"},
        "train": {"gpus": 1, "qos": "training"},
        "infer": {"blocks": 1, "qos": "inference"},
        "be": {"blocks": 2, "qos": "best-effort"},
    }
    for name, spec in specs.items():
        cluster.create(cluster.pod(name, ns, **spec))  # type: ignore[arg-type]
    for name in specs:
        pod = cluster.wait_bound(ns, name)
        node = pod["spec"]["nodeName"]
        notes = pod["metadata"].get("annotations") or {}
        assert node in COOL, f"{name} went to {node}"
        assert notes.get("edgegpu.io/gpu-index", "").isdigit(), notes
        assert notes.get("edgegpu.io/gpu-uuid", "").startswith("GPU-"), notes
        assert notes.get("edgegpu.io/assigned-at", "").endswith("Z"), notes
    # The fake kubelet runs bound pods, as a kubelet would.
    until("pods Running", lambda: all(
        (cluster.get_pod(ns, n) or {}).get("status", {}).get("phase") == "Running" for n in specs
    ))  # fmt: skip


def test_hot_and_unhealthy_gpus_are_avoided_with_our_reasons_in_events(
    cluster: Cluster, ns: str
) -> None:
    # Only the hot and the XID nodes are allowed: the pod cannot be placed, and says why.
    cluster.create(cluster.pod("stuck", ns, blocks=1, node_selector={"edgegpu.io/rack": "rack-b"}))
    # rack-b also holds gpu-c, a cool node: the pod must land there, never on hot-0 or xid-0.
    pod = cluster.wait_bound(ns, "stuck")
    assert pod["spec"]["nodeName"] == "gpu-c"

    # Without gpu-c (cordoned by the test), nothing in rack-b can take it.
    cluster.cp.kubectl("cordon", "gpu-c")
    try:
        # A whole-GPU pod: xid-0's device plugin has marked its blocks unhealthy, so for a
        # block pod kube-scheduler's own count would turn xid-0 away before the extender.
        cluster.create(
            cluster.pod("nowhere", ns, gpus=1, node_selector={"edgegpu.io/rack": "rack-b"})
        )

        def reasons() -> str:
            failed = [e for e in cluster.events(ns, "nowhere") if e["reason"] == "FailedScheduling"]
            return " ".join(e.get("message", "") for e in failed)

        text = until("FailedScheduling with edgegpu's reasons", reasons)
        assert "edgegpu: gpu too hot" in text
        assert "edgegpu: every gpu is unhealthy" in text
        time.sleep(1.0)
        assert not (cluster.get_pod(ns, "nowhere") or {})["spec"].get("nodeName")
    finally:
        cluster.cp.kubectl("uncordon", "gpu-c")
    # Once gpu-c takes pods again, the pending pod binds there.
    assert cluster.wait_bound(ns, "nowhere", 60.0)["spec"]["nodeName"] == "gpu-c"


def test_nodecachecapable_false_sends_and_gets_whole_nodes(cluster: Cluster, ns: str) -> None:
    full = EdgegpuScheduler(
        cluster.cp, cluster.balancer.url, name="edgegpu-full-nodes",
        overrides={"nodeCacheCapable": False},
    )  # fmt: skip
    full.start()
    try:
        pod = cluster.pod("full", ns, blocks=1)
        pod["spec"]["schedulerName"] = "edgegpu-full-nodes"
        cluster.create(pod)
        bound = cluster.wait_bound(ns, "full")
        assert bound["spec"]["nodeName"] in COOL
        assert bound["metadata"]["annotations"]["edgegpu.io/gpu-index"].isdigit()
    finally:
        full.stop()


def test_a_silent_node_is_stale_for_training_pods_until_its_agent_is_back(
    cluster: Cluster, ns: str
) -> None:
    agent = cluster.agents["gpu-c"]
    agent.stop()
    try:

        def silent() -> bool:
            return all(
                next(r for r in e.get("/debug/nodes")["nodes"] if r["node"] == "gpu-c")["stale"]
                for e in cluster.extenders
            )

        until("gpu-c stale on every replica (3 report intervals)", silent)
        # rack-b: gpu-c (now silent), hot-0 (hot), xid-0 (unhealthy). A whole-GPU pod: with
        # its agent gpu-c's device plugin went too, and with it the blocks it advertised.
        cluster.create(cluster.pod("trainer", ns, gpus=1, qos="training",
                                   node_selector={"edgegpu.io/rack": "rack-b"}))  # fmt: skip

        def stale() -> str:
            failed = [e for e in cluster.events(ns, "trainer") if e["reason"] == "FailedScheduling"]
            text = " ".join(e.get("message", "") for e in failed)
            return text if "edgegpu: gpu telemetry is stale" in text else ""

        until("FailedScheduling: gpu telemetry is stale", stale)
        assert not (cluster.get_pod(ns, "trainer") or {})["spec"].get("nodeName")
    finally:
        agent.start()
    assert cluster.wait_bound(ns, "trainer", 60.0)["spec"]["nodeName"] == "gpu-c"


def test_a_gpu_that_was_hot_stays_out_while_it_cools_down(cluster: Cluster, ns: str) -> None:
    # Last in the suite: hot-0 is left cooling down. Its agent restarts with the load gone
    # (the same GPU, same UUID): the GPU is below maxTemp but within coolDownPeriod.
    hot = cluster.agents["hot-0"]
    hot.stop()
    cooler = Agent(cluster.cp, "hot-0", 1, hot.extender_urls, seed=hot.seed,
                   interval_s=hot.interval_s,
                   extra_args=["--load-pct", "0", *device_plugin(cluster, "hot-0")])  # fmt: skip
    cooler.start()
    cluster.agents["hot-0"] = cooler

    def cooling() -> bool:  # on every replica: the scheduler may be talking to either
        for ext in cluster.extenders:
            rows = {r["node"]: r for r in ext.get("/debug/nodes")["nodes"]}
            gpu = rows["hot-0"]["gpus"][0]
            if gpu["hot"] or gpu["cool_down_until"] is None:
                return False
        return True

    until("hot-0 below maxTemp and cooling down on every replica", cooling)
    cluster.create(cluster.pod("cool-seeker", ns, blocks=1, node_selector=on("hot-0")))

    def reason() -> str:
        failed = [e for e in cluster.events(ns, "cool-seeker") if e["reason"] == "FailedScheduling"]
        return " ".join(e.get("message", "") for e in failed)

    assert "edgegpu: gpu cooling down" in until("FailedScheduling: cooling down", reason)
    assert not (cluster.get_pod(ns, "cool-seeker") or {})["spec"].get("nodeName")


def on(node: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": node}
