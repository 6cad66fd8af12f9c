"""Replicas, restarts, the extender down, leader election: with the real scheduler."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.e2e.conftest import Cluster, until
from tests.e2e.edgegpu import NAMESPACE
from tests.e2e.test_policy_and_auth import patch_policy


def served_for(cluster: Cluster, pod: str, verb: str) -> list[str]:
    """The replicas that answered ``verb`` for ``pod``."""
    return [r for p, r, name in cluster.balancer.served if name == pod and p.endswith(verb)]


def test_filter_and_bind_on_different_replicas(cluster: Cluster, ns: str) -> None:
    cluster.balancer.split_bind = True
    try:
        cluster.create(cluster.pod("split", ns, blocks=1))
        pod = cluster.wait_bound(ns, "split")
    finally:
        cluster.balancer.split_bind = False
    filters, binds = served_for(cluster, "split", "/filter"), served_for(cluster, "split", "/bind")
    assert binds and filters and not set(binds) & set(filters), cluster.balancer.served[-6:]
    assert pod["metadata"]["annotations"]["edgegpu.io/gpu-uuid"].startswith("GPU-")
    events = {e["reason"] for e in cluster.events(ns, "split")}
    assert "FailedScheduling" not in events


def test_the_replica_that_filtered_dies_before_bind(cluster: Cluster, ns: str) -> None:
    killed: list[int] = []

    def crash(i: int) -> None:
        # The replica that answered filter and prioritize dies: the bind goes to the other,
        # which never saw this pod, as the Service sends it there once the endpoint is gone.
        if not killed:
            proc = cluster.extenders[i].process
            assert proc is not None
            proc.popen.kill()
            proc.popen.wait()
            killed.append(i)

    cluster.balancer.before_bind = crash
    try:
        cluster.create(cluster.pod("survivor", ns, blocks=1))
        pod = cluster.wait_bound(ns, "survivor")
    finally:
        cluster.balancer.before_bind = None
        for i in killed:
            cluster.extenders[i].stop()
            cluster.extenders[i].start()
        cluster.fresh()
    assert killed
    [binder] = served_for(cluster, "survivor", "/bind")
    assert binder != cluster.extenders[killed[0]].name
    assert pod["metadata"]["annotations"]["edgegpu.io/gpu-index"].isdigit()
    assert "FailedScheduling" not in {e["reason"] for e in cluster.events(ns, "survivor")}


def test_with_every_replica_down_gpu_pods_wait_and_bind_once_one_is_back(
    cluster: Cluster, ns: str
) -> None:
    for ext in cluster.extenders:
        ext.stop()
    try:
        cluster.create(cluster.pod("patient", ns, blocks=1))

        def failed() -> str:
            return " ".join(
                e.get("message", "")
                for e in cluster.events(ns, "patient")
                if e["reason"] == "FailedScheduling"
            )

        text = until("FailedScheduling while the extender is down", failed)
        assert "extender" in text.lower() or "connection refused" in text.lower(), text
        time.sleep(2.0)
        assert not (cluster.get_pod(ns, "patient") or {})["spec"].get("nodeName")
    finally:
        for ext in cluster.extenders:
            ext.start()
        cluster.fresh()
    assert cluster.wait_bound(ns, "patient", 90.0)["spec"]["nodeName"] in {
        "gpu-a",
        "gpu-b",
        "gpu-c",
    }


def lease_holder(cluster: Cluster) -> str:
    doc = cluster.cp.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/edgegpu-extender"
    )
    return str(((doc or {}).get("spec") or {}).get("holderIdentity") or "")


def test_leader_election_over_a_real_lease_survives_the_leader_dying(cluster: Cluster) -> None:
    names = {e.name: e for e in cluster.extenders}
    leader = until("a leader", lambda: lease_holder(cluster) in names and lease_holder(cluster))
    assert names[leader].get("/healthz") is not None
    proc = names[leader].process
    assert proc is not None
    proc.popen.kill()  # no chance to release the Lease
    proc.popen.wait()
    started = time.monotonic()
    try:
        other = until(
            "the other replica takes the Lease",
            lambda: (h := lease_holder(cluster)) != leader and h in names and h,
            40.0,
        )
        took = time.monotonic() - started
        assert took < 15.0 + 2.0 + 5.0, took  # lease duration + retry period + slack
        assert other != leader
    finally:
        names[leader].stop()
        names[leader].start()
        cluster.fresh()


def test_a_pod_on_a_gpu_hot_for_longer_than_migrate_after_is_evicted(
    cluster: Cluster, ns: str, say: Callable[[str], None]
) -> None:
    """Thermal migration: the leader evicts the lowest-class pod of a hot GPU through
    the Eviction API once it has been hot for longer than ``migrateAfter``; the next one, under
    a PodDisruptionBudget that allows no disruption, is refused every round and never forced."""
    hot = cluster.extenders[0].get("/debug/nodes/hot-0")["gpus"][0]
    assert hot["hot"], hot

    def placed(name: str, qos: str) -> None:
        pod = cluster.pod(name, ns, blocks=1, qos=qos)
        pod["spec"]["nodeName"] = "hot-0"  # placed before it overheated, as running work is
        pod["metadata"]["labels"] = {"app": name}
        pod["metadata"]["annotations"].update({
            "edgegpu.io/gpu-index": "0", "edgegpu.io/gpu-uuid": hot["uuid"],
            "edgegpu.io/assigned-at": "2026-12-05T00:00:00Z",
        })  # fmt: skip
        cluster.create(pod)

    placed("on-hot-gpu", "best-effort")
    placed("guarded", "inference")
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "guarded", "namespace": ns},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}}  # fmt: skip
    resp = cluster.cp.request("POST", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
                              json=pdb)  # fmt: skip
    assert resp.status_code == 201, resp.text
    started = time.monotonic()
    patch_policy(cluster, {"remediation": {"enabled": True, "dryRun": False},
                            "thermalThrottling": {"migrateAfter": "10s"}})  # fmt: skip
    try:
        until("the best-effort pod evicted",
              lambda: cluster.get_pod(ns, "on-hot-gpu") is None, 60.0)  # fmt: skip
        took = time.monotonic() - started
        assert cluster.get_pod(ns, "guarded") is not None  # the lowest class went first
        until("the guarded pod's eviction refused by its budget",
              lambda: sum(_evictions(e, "blocked") for e in cluster.extenders) >= 1, 60.0)  # fmt: skip
        guarded = cluster.get_pod(ns, "guarded")
        assert guarded is not None and not guarded["metadata"].get("deletionTimestamp")
        evicted = sum(_evictions(e) for e in cluster.extenders)
        say(f"thermal migration: the best-effort pod left hot-0's GPU 0 {took:.1f} s after "
            f"remediation was enabled; evictions counted by the replicas: {evicted:g}; the "
            f"inference pod under a PodDisruptionBudget stayed")  # fmt: skip
        assert evicted == 1
    finally:
        patch_policy(cluster, {"remediation": {"enabled": False, "dryRun": True},
                                "thermalThrottling": {"migrateAfter": "2m"}})  # fmt: skip


def _evictions(ext: Any, result: str = "evicted") -> float:
    text = ext.fetch("/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("edgegpu_extender_remediation_actions_total{")
        and 'reason="thermal"' in line
        and f'result="{result}"' in line
    )
