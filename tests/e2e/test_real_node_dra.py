"""edgegpu as a DRA driver on the real control plane and a real kubelet node.

real-1's agent serves kubelet's DRA plugin instead of the device plugin: the real kubelet
registers it, the leader publishes real-1's GPUs as a ResourceSlice, the real kube-scheduler
allocates a claim's device and binds the pod, and the real kubelet calls the plugin's
NodePrepareResources before it starts the container (and NodeUnprepareResources after). A hot
GPU's device is tainted and the scheduler gives the next claim another one. real-1 runs
containerd 2, which reads the CDI spec the plugin writes for a claim: the container gets the
GPU's environment from it (Debian's containerd 1.6 reads none).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import REAL_NODES, Cluster, until
from tests.e2e.edgegpu import NAMESPACE, Agent
from tests.e2e.realnode import RealNode, real_pod
from tests.e2e.test_policy_and_auth import patch_policy
from tests.e2e.test_real_node import PRINT_ENV, _restart, envs_of
from tests.e2e.test_remediation import _policy_in_force

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="real nodes need root (kubelet, containerd and runc run as root)"
)

DRIVER = "gpu.edgegpu.io"
WAIT = "trap 'exit 0' TERM; while true; do sleep 1; done"


def _dra_args(node: RealNode) -> list[str]:
    return ["--load-pct", "0", "--model", "Tesla T4", "--dra",
            "--kubelet-registry-dir", str(node.kubelet_dir / "plugins_registry"),
            "--cdi-dir", str(_cdi(node))]  # fmt: skip


def _cdi(node: RealNode) -> Path:
    return node.cdi_dir


@pytest.fixture
def dra_node(cluster: Cluster, say: Callable[[str], None]) -> Iterator[tuple[RealNode, Agent]]:
    """real-1, its agent serving the DRA plugin (not the device plugin) for the case."""
    name = REAL_NODES[1][0]
    node, agent = cluster.real[name], cluster.agents[name]

    def quiet() -> bool:  # an earlier case's namespace is deleted in the background
        doc = cluster.cp.get("/apis/resource.k8s.io/v1/resourceclaims") or {}
        return not any(r.get("pool") == name
                       for c in doc.get("items") or []
                       for r in (((c.get("status") or {}).get("allocation") or {})
                                 .get("devices") or {}).get("results") or [])  # fmt: skip

    until(f"no claim allocated on {name} from an earlier case", quiet, 120.0)
    plain = (agent.scenario, agent.extra_args)
    _restart(agent, "steady", _dra_args(node))
    started = time.monotonic()
    try:
        until(f"{name}'s ResourceSlice, once kubelet took the DRA plugin",
              lambda: _slice(cluster, name), 90.0)  # fmt: skip
        say(f"{name}'s slice published {time.monotonic() - started:.1f} s after its DRA "
            "agent's start")  # fmt: skip

        def untainted() -> bool:
            doc = _slice(cluster, name)
            return doc is not None and not any(d.get("taints") for d in doc["spec"]["devices"])

        # A GPU an earlier case heated (the real nodes' thermal migration) is in its 5 min
        # cool-down, which runs from when it cooled: a short one for the case, so that no GPU
        # cooling down holds a slice's taint or a node's uncordon (the policy's 5 min would
        # put it back in its cool-down if restored before the case).
        patch_policy(cluster, {"thermalThrottling": {"coolDownPeriod": "5s"}})
        try:
            until(f"{name}'s ResourceSlice, no GPU tainted", untainted, 120.0)
            yield node, agent
        finally:
            patch_policy(cluster, {"thermalThrottling": {"coolDownPeriod": "5m"}})
    finally:
        # The claim pods go while the DRA plugin is there: kubelet unprepares their claims
        # through it before their containers are gone (a node changes dialect drained).
        doc = cluster.cp.get("/api/v1/pods") or {}
        for pod in doc.get("items") or []:
            meta, spec = pod["metadata"], pod["spec"]
            bound_here = spec.get("nodeName") == name or (
                (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname") == name
            )  # a pending one would be allocated a GPU as soon as one is free
            if meta["namespace"] != NAMESPACE and spec.get("resourceClaims") and bound_here:
                cluster.cp.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/"
                                   f"{meta['name']}")  # fmt: skip
        until(f"no claim allocated on {name} once its claim pods are deleted", quiet, 120.0)
        _restart(agent, *plain)
        until(f"{name}'s slice gone once its agent serves no DRA plugin",
              lambda: _slice(cluster, name) is None, 90.0)  # fmt: skip


def _slice(cluster: Cluster, node: str) -> dict[str, Any] | None:
    """The node's ResourceSlice the leader published."""
    doc = cluster.cp.get("/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D"
                         f"{node}%2Cspec.driver%3D{DRIVER}") or {}  # fmt: skip
    ours = [s for s in doc.get("items") or []
            if s["metadata"].get("labels", {}).get("app.kubernetes.io/managed-by") == "edgegpu"]  # fmt: skip
    assert len(ours) <= 1, ours
    return ours[0] if ours else None


def _devices(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The slice's devices by their GPU's index (``gpu-0``…; a device is named by its uuid)."""
    return {f"gpu-{d['attributes']['index']['int']}": d for d in doc["spec"]["devices"]}


def _claim_pod(
    cluster: Cluster, ns: str, name: str, node: str, command: str = WAIT
) -> dict[str, Any]:
    """A pod whose one container takes a whole GPU of ours through a claim template."""
    pod = cluster.pod(name, ns, node_selector={"kubernetes.io/hostname": node})
    pod = real_pod(pod, command)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "whole-gpu"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return pod


def _template(cluster: Cluster, ns: str) -> None:
    doc = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
           "metadata": {"name": "whole-gpu", "namespace": ns},
           "spec": {"spec": {"devices": {"requests": [
               {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}}  # fmt: skip
    resp = cluster.cp.request(
        "POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates", json=doc
    )
    assert resp.status_code == 201, resp.text


def _allocated(cluster: Cluster, ns: str, pod: str) -> tuple[str, dict[str, Any]] | None:
    """The device of ours the pod's claim was allocated, and the claim; None before."""
    doc = cluster.get_pod(ns, pod) or {}
    statuses = (doc.get("status") or {}).get("resourceClaimStatuses") or []
    if not statuses or not statuses[0].get("resourceClaimName"):
        return None
    claim = cluster.cp.get(
        f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/"
        f"{statuses[0]['resourceClaimName']}"
    )
    results = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {})
    ours = [r for r in results.get("results") or [] if r["driver"] == DRIVER]
    if not ours or not claim:
        return None
    doc = _slice(cluster, ours[0]["pool"]) or {"spec": {"devices": []}}
    (index,) = [k for k, d in _devices(doc).items() if d["name"] == ours[0]["device"]]
    return index, claim


def _health(cluster: Cluster, ns: str, name: str) -> tuple[str, str | None] | None:
    """The health kubelet reports for the pod's claimed device, and its message."""
    doc = cluster.get_pod(ns, name) or {}
    for status in (doc.get("status") or {}).get("containerStatuses") or []:
        for entry in status.get("allocatedResourcesStatus") or []:
            if entry.get("name", "").startswith("claim:"):
                (resource,) = entry.get("resources") or [{}]
                return resource.get("health"), resource.get("message")
    return None


def _running(cluster: Cluster, ns: str, name: str) -> bool:
    return ((cluster.get_pod(ns, name) or {}).get("status") or {}).get("phase") == "Running"


def test_a_claim_gets_a_gpu_of_the_slice_the_leader_publishes_and_the_real_kubelet_prepares_it(
    cluster: Cluster, ns: str, dra_node: tuple[RealNode, Agent], say: Callable[[str], None]
) -> None:
    node, _ = dra_node
    published = _slice(cluster, node.name)
    assert published is not None
    view = cluster.extenders[0].get(f"/debug/nodes/{node.name}")
    uuids = {f"gpu-{g['index']}": g["uuid"] for g in view["gpus"]}
    devices = _devices(published)
    assert {n: d["attributes"]["uuid"]["string"] for n, d in devices.items()} == uuids
    # A device is named after its GPU's uuid, so that a re-index cannot move a claim.
    assert all(d["name"] == d["attributes"]["uuid"]["string"].lower() for d in devices.values())
    assert published["spec"]["nodeName"] == node.name
    # A Tesla T4's 15 GiB in whole 4 GiB blocks.
    assert all(d["capacity"]["memory"]["value"] == "12Gi" for d in devices.values()), devices
    owner = published["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", node.name)

    _template(cluster, ns)
    t1 = time.monotonic()
    cluster.create(_claim_pod(cluster, ns, "whole", node.name, PRINT_ENV))
    until("the claim pod Running on the real node", lambda: _running(cluster, ns, "whole"), 120.0)
    running = time.monotonic() - t1
    device, claim = until("its claim allocated", lambda: _allocated(cluster, ns, "whole"), 10.0)
    spec_file = _cdi(node) / f"edgegpu.io-gpu_{claim['metadata']['uid']}.json"
    spec = json.loads(spec_file.read_text())
    (cdi,) = spec["devices"]
    assert f"NVIDIA_VISIBLE_DEVICES={uuids[device]}" in cdi["containerEdits"]["env"], spec
    # containerd 2 applied the spec kubelet named: the container runs with that GPU's env.
    assert node.runtime is not None, "real-1 runs containerd 2"
    envs = until("the claim pod's printed environment", lambda: envs_of(cluster, ns, "whole"),
                 60.0)  # fmt: skip
    assert envs.get("NVIDIA_VISIBLE_DEVICES") == uuids[device], envs

    # Samples go on arriving; the slice is written again only when what it says changes.
    before = _slice(cluster, node.name)
    assert before is not None
    version = before["metadata"]["resourceVersion"]
    time.sleep(4.0)
    doc = _slice(cluster, node.name)
    assert doc is not None and doc["metadata"]["resourceVersion"] == version

    cluster.cp.request("DELETE", f"/api/v1/namespaces/{ns}/pods/whole")
    until("the claim unprepared: its CDI spec removed", lambda: not spec_file.exists(), 90.0)
    say(f"DRA on a real node: a claim pod Running {running:.1f} s after its creation, on "
        f"{device}, NVIDIA_VISIBLE_DEVICES={envs['NVIDIA_VISIBLE_DEVICES']} in its container "
        "(from the CDI spec, containerd 2)")  # fmt: skip


def test_an_xid_gpu_is_tainted_and_the_fault_loop_drains_the_claim_pod_on_it(
    cluster: Cluster, ns: str, dra_node: tuple[RealNode, Agent], say: Callable[[str], None]
) -> None:
    node, agent = dra_node
    until(f"{node.name}'s ResourceSlice", lambda: _slice(cluster, node.name), 90.0)
    _template(cluster, ns)
    for name in ("one", "two"):
        cluster.create(_claim_pod(cluster, ns, name, node.name))
    until("both claim pods Running",
          lambda: all(_running(cluster, ns, n) for n in ("one", "two")), 120.0)  # fmt: skip
    on = {until(f"{n}'s claim", lambda n=n: _allocated(cluster, ns, n), 10.0)[0]: n
          for n in ("one", "two")}  # fmt: skip
    assert set(on) == {"gpu-0", "gpu-1"}, on

    def reserved() -> dict[str, list[int]] | None:
        view = cluster.extenders[0].get(f"/debug/nodes/{node.name}")
        rows = {r["pod"]: r["gpus"] for r in view["reservations"]}
        return rows if len(rows) == 2 else None

    # The extender reads each claim pod's GPU from its claim, as it reads a bind's annotation
    # (what a replica's filter reserved for the pod before the allocation was known gives way).
    want = {f"{ns}/{on['gpu-0']}": [0], f"{ns}/{on['gpu-1']}": [1]}
    until("the extender holding both claim pods' GPUs as their claims say",
          lambda: reserved() == want, 30.0)  # fmt: skip

    _restart(agent, "xid-79", _dra_args(node))  # GPU 0 raises XID 79 until a self-test
    t0 = time.monotonic()
    marks: dict[str, float] = {}

    def tainted() -> bool:
        doc = _slice(cluster, node.name)
        taints = (_devices(doc)["gpu-0"].get("taints") or []) if doc else []
        return any(t["key"] == f"{DRIVER}/unhealthy" and t.get("value") == "xid-79"
                   for t in taints)  # fmt: skip

    until("gpu-0's device tainted unhealthy=xid-79", tainted, 120.0)
    marks["tainted"] = time.monotonic() - t0
    # kubelet streams each device's health into the pods that hold it (KEP-4680).
    until("the pod on gpu-0 Unhealthy in its status, the other Healthy",
          lambda: _health(cluster, ns, on["gpu-0"]) == ("Unhealthy", "xid:79")
          and _health(cluster, ns, on["gpu-1"]) == ("Healthy", None), 60.0)  # fmt: skip
    marks["pod status"] = time.monotonic() - t0
    patch_policy(cluster, {"remediation": {"enabled": True, "dryRun": False,
                                            "maxUnavailablePercent": 50}})  # fmt: skip
    try:
        until("remediation on in every replica", lambda: _policy_in_force(cluster, True), 30.0)
        until("the claim pod on gpu-0 evicted", lambda: cluster.get_pod(ns, on["gpu-0"]) is None,
              180.0)  # fmt: skip
        marks["evicted"] = time.monotonic() - t0
        kept = cluster.get_pod(ns, on["gpu-1"])
        assert kept is not None and not kept["metadata"].get("deletionTimestamp"), (
            "the claim pod on the healthy GPU was evicted"
        )

        def handed_back() -> bool:
            doc = cluster.cp.get(f"/api/v1/nodes/{node.name}") or {}
            notes = doc["metadata"].get("annotations") or {}
            return not doc["spec"].get("unschedulable") and "edgegpu.io/remediation" not in notes

        until(f"{node.name} uncordoned after its self-test passed", handed_back, 180.0)
        say(f"DRA fault loop (seconds from the faulty agent's start): gpu-0 tainted "
            f"{marks['tainted']:.1f}, Unhealthy in its pod's status {marks['pod status']:.1f}, "
            f"the pod evicted {marks['evicted']:.1f} (remediation turned on after the status)")  # fmt: skip
    finally:
        patch_policy(cluster, {"remediation": {"enabled": False, "dryRun": True,
                                                "maxUnavailablePercent": 10}})  # fmt: skip


def test_a_hot_gpu_is_tainted_and_the_scheduler_gives_the_next_claim_another_one(
    cluster: Cluster, ns: str, dra_node: tuple[RealNode, Agent], say: Callable[[str], None]
) -> None:
    node, agent = dra_node
    try:
        until(f"{node.name}'s ResourceSlice", lambda: _slice(cluster, node.name), 90.0)
        _restart(agent, "overheat", _dra_args(node))  # GPU 0 heats past maxTemp
        t0 = time.monotonic()

        def tainted() -> bool:
            doc = _slice(cluster, node.name)
            taints = _devices(doc)["gpu-0"].get("taints") or [] if doc else []
            return any(t["key"] == f"{DRIVER}/hot" and t["effect"] == "NoSchedule" for t in taints)

        until("gpu-0's device tainted hot", tainted, 120.0)
        tainted_s = time.monotonic() - t0
        _template(cluster, ns)
        cluster.create(_claim_pod(cluster, ns, "first", node.name))
        until("the first claim pod Running", lambda: _running(cluster, ns, "first"), 120.0)
        device, _ = until("its claim allocated", lambda: _allocated(cluster, ns, "first"), 10.0)
        assert device == "gpu-1", device
        # Only the hot GPU is left: the next claim is not allocated it.
        cluster.create(_claim_pod(cluster, ns, "second", node.name))

        def unschedulable() -> bool:
            doc = cluster.get_pod(ns, "second") or {}
            conditions = (doc.get("status") or {}).get("conditions") or []
            return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                       for c in conditions)  # fmt: skip

        until("the second claim pod unschedulable while gpu-0 is hot", unschedulable, 60.0)
        assert _allocated(cluster, ns, "second") is None
        assert not (cluster.get_pod(ns, "second") or {}).get("spec", {}).get("nodeName")
        # The extender weighs the claim pod as it weighs a device-plugin pod: a whole GPU, which
        # real-1 has not (gpu-0 hot, gpu-1 the first pod's through its claim).
        explained = cluster.extenders[0].post("/debug/explain", {
            "Pod": cluster.get_pod(ns, "second"), "NodeNames": [node.name]})  # fmt: skip
        assert explained["pod"]["through_claims"] and explained["pod"]["whole_gpus"] == 1
        (verdict,) = explained["nodes"]
        assert verdict["verdict"] != "passed", verdict
        say(
            f"DRA taints: gpu-0 tainted hot {tainted_s:.1f} s after the overheating agent's start; "
            "the next claim got gpu-1, the one after stayed unschedulable"
        )
    finally:
        # Out of its (short) cool-down before the cases after this one use real-1's GPUs.
        _restart(agent, "steady", _dra_args(node))

        def cool() -> bool:
            return all(not g["hot"] and g["cool_down_until"] is None
                       for e in cluster.extenders
                       for g in e.get(f"/debug/nodes/{node.name}")["gpus"])  # fmt: skip

        until(f"{node.name}'s GPUs out of their cool-down", cool, 120.0)


def test_a_claim_that_would_tolerate_the_gpu_taints_is_refused_outside_trusted_namespaces(
    cluster: Cluster, ns: str
) -> None:
    def template(name: str, tolerations: list[dict[str, Any]], where: str) -> Any:
        doc = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
               "metadata": {"name": name, "namespace": where},
               "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                   "deviceClassName": DRIVER, "tolerations": tolerations}}]}}}}  # fmt: skip
        return cluster.cp.request(
            "POST", f"/apis/resource.k8s.io/v1/namespaces/{where}/resourceclaimtemplates", json=doc
        )

    hot = [{"key": f"{DRIVER}/hot", "operator": "Exists", "effect": "NoSchedule"}]
    every = [{"operator": "Exists"}]
    other = [{"key": "example.com/maintenance", "operator": "Exists"}]
    for name, tolerations in (("hot", hot), ("every", every)):
        resp = template(name, tolerations, ns)
        assert resp.status_code in (403, 422), resp.text
        assert "may not tolerate its taints" in resp.text, resp.text
    assert template("other", other, ns).status_code == 201
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "c", "namespace": ns},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": DRIVER, "tolerations": hot}}]}}}  # fmt: skip
    resp = cluster.cp.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
                              json=claim)  # fmt: skip
    assert resp.status_code in (403, 422), resp.text
    # Two requests of ours in one claim: a container naming the whole claim would see one's GPUs.
    two = {**claim, "metadata": {"name": "two", "namespace": ns},
           "spec": {"devices": {"requests": [
               {"name": n, "exactly": {"deviceClassName": DRIVER}} for n in ("a", "b")]}}}  # fmt: skip
    resp = cluster.cp.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
                              json=two)  # fmt: skip
    assert resp.status_code in (403, 422) and "at most one request" in resp.text, resp.text
    # The same claim in a beta version is converted to v1 and checked as it would be there.
    beta = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim",
            "metadata": {"name": "c-beta", "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": DRIVER,
                                               "tolerations": hot}]}}}  # fmt: skip
    resp = cluster.cp.request(
        "POST", f"/apis/resource.k8s.io/v1beta1/namespaces/{ns}/resourceclaims", json=beta
    )
    if resp.status_code != 404:  # served where resource.k8s.io/v1beta1 is on
        assert resp.status_code in (403, 422), resp.text
        assert "may not tolerate its taints" in resp.text, resp.text
    # A namespace the operator trusts with them.
    resp = cluster.cp.request("PATCH", f"/api/v1/namespaces/{ns}",
                              content='{"metadata":{"labels":{"edgegpu.io/gpu-taints":"tolerated"}}}',
                              headers={"content-type": "application/merge-patch+json"})  # fmt: skip
    assert resp.status_code == 200, resp.text
    until("the trusted namespace's template admitted",
          lambda: template("hot-trusted", hot, ns).status_code == 201, 30.0)  # fmt: skip
