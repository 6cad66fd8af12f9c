"""Idle memory blocks lent to a best-effort pod on the real control plane.

An inference pod holds every block of a T4 and uses 1 GiB of its 12: once idle for ``after``,
the agent's device plugin advertises 2 blocks again as lent devices, kube-scheduler's count lets
a best-effort pod in, and kubelet's device manager admits it on that GPU. When the owner's use
grows, the leader evicts the borrower. The simulated agent reports the owner's process from a
file (``--pod-processes``), as the NVML backend maps a real one to its pod.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.e2e.conftest import Cluster, extra_node, reported, until
from tests.e2e.test_policy_and_auth import patch_policy

POOL = {"edgegpu.io/e2e-pool": "lending"}
NODE = "lend-0"
BLOCKS = "edgegpu.io/gpu-mem-block"


def _lending_in_force(cluster: Cluster, on: bool) -> bool:
    for ext in cluster.extenders:
        spec = ext.get("/debug/policy")["policy"]["spec"]
        if spec["memory"]["idleRelease"]["enabled"] is not on:
            return False
        if on and not (spec["remediation"]["enabled"] and not spec["remediation"]["dryRun"]):
            return False
    return True


def _phase(cluster: Cluster, ns: str, name: str) -> str | None:
    pod = cluster.get_pod(ns, name)
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        return None
    phase: str | None = (pod.get("status") or {}).get("phase")
    return phase


def _allocatable(cluster: Cluster) -> str | None:
    node = cluster.cp.get(f"/api/v1/nodes/{NODE}") or {}
    value: str | None = (node.get("status") or {}).get("allocatable", {}).get(BLOCKS)
    return value


def test_idle_blocks_are_lent_to_a_best_effort_pod_and_taken_back(
    cluster: Cluster, ns: str, say: Callable[[str], None]
) -> None:
    processes = cluster.cp.folder / f"{NODE}-processes.json"
    processes.write_text("{}")

    def uses(uid: str, mib: float) -> None:
        processes.write_text(json.dumps({"0": [{"pod_uid": uid, "used_mib": mib}]}))

    args = ["--model", "Tesla T4", "--pod-processes", str(processes)]
    with extra_node(cluster, NODE, 1, args, labels=POOL):
        until(f"{NODE} reported to every replica", lambda: reported(cluster, NODE), 60.0)
        until(f"{NODE} advertises its 3 blocks", lambda: _allocatable(cluster) == "3", 60.0)
        try:
            patch_policy(cluster, {
                "remediation": {"enabled": True, "dryRun": False, "maxUnavailablePercent": 50},
                "memory": {"idleRelease": {"enabled": True, "after": "5s"}}})  # fmt: skip
            until("lending in force on every replica", lambda: _lending_in_force(cluster, True))
            cluster.create(cluster.pod("owner", ns, blocks=3, qos="inference", node_selector=POOL))
            until("the owner Running", lambda: _phase(cluster, ns, "owner") == "Running", 60.0)
            owner: dict[str, Any] = cluster.get_pod(ns, "owner") or {}
            uses(owner["metadata"]["uid"], 1024.0)  # 1 GiB of its 12: after 5 s it lends 2
            until("the lent blocks advertised", lambda: _allocatable(cluster) == "5", 60.0)

            cluster.create(cluster.pod("no-loan", ns, blocks=2, qos="inference",
                                       node_selector=POOL))  # fmt: skip
            cluster.create(cluster.pod("borrower", ns, blocks=2, qos="best-effort",
                                       node_selector=POOL))  # fmt: skip
            until("the borrower Running", lambda: _phase(cluster, ns, "borrower") == "Running",
                  60.0)  # fmt: skip
            gpu = owner["metadata"]["annotations"]["edgegpu.io/gpu-uuid"]
            envs = cluster.kubelet.envs[(ns, "borrower")]
            assert envs["NVIDIA_VISIBLE_DEVICES"] == gpu
            manager = cluster.kubelet.device_managers[NODE]
            given = manager.wait(lambda e: e.get("pod") == f"{ns}/borrower"
                                 and e["event"] == "allocated")["devices"]  # fmt: skip
            assert all("::lent-" in d for d in given), given
            # Lent blocks are for best-effort pods only.
            assert not (cluster.get_pod(ns, "no-loan") or {})["spec"].get("nodeName")

            uses(owner["metadata"]["uid"], 11000.0)  # the owner is busy again
            until("the borrower evicted", lambda: _phase(cluster, ns, "borrower") is None, 60.0)
            assert _phase(cluster, ns, "owner") == "Running"
            until("the lent blocks withdrawn", lambda: _allocatable(cluster) == "3", 60.0)
            events = [e for e in cluster.events(ns, "borrower") if e["reason"] == "EdgeGPUEvicted"]
            assert events and "block(s) short" in events[0]["message"], events
            say(f"\nlending: the best-effort pod ran on lent blocks {sorted(given)} of {gpu}; "
                f"evicted when the owner grew: {events[0]['message']}")  # fmt: skip
        finally:
            patch_policy(cluster, {
                "remediation": {"enabled": False, "dryRun": True, "maxUnavailablePercent": 10},
                "memory": {"idleRelease": {"enabled": False, "after": "5m"}}})  # fmt: skip
            until("lending off on every replica", lambda: _lending_in_force(cluster, False))
