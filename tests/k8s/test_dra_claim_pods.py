"""Pods that ask for GPUs through ResourceClaims of gpu.edgegpu.io go through the same policy as
device-plugin pods (thermal, memory blocks, QoS), and are bound without a GPU of the extender's
choosing: kube-scheduler allocated theirs into the claims."""

from __future__ import annotations

from typing import Any

from scheduler_extender.telemetry.decode import report_from
from tests.builders import args_names, gpu, report
from tests.k8s.conftest import eventually, running_extender


def _claim(name: str, request: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", **request}]}}}  # fmt: skip


def _claim_pod(name: str, claim: str) -> dict[str, Any]:
    """A pod of a claim template: its claim's name in its status, as the scheduler sees it."""
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"schedulerName": "edgegpu-scheduler",
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
                     "containers": [{"name": "app", "image": "app:1",
                                     "resources": {"claims": [{"name": "gpu"}]}}]},
            "status": {"phase": "Pending",
                       "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]}}  # fmt: skip


WHOLE = {"exactly": {"deviceClassName": "gpu.edgegpu.io"}}


async def _setup(kube: Any, app: Any) -> None:
    await eventually(lambda: app.state.ctx.ready)
    state = app.state.ctx.state
    state.ingest(report_from(report("hot", [gpu(0, temperature_c=95.0),
                                            gpu(1, temperature_c=94.0)])))  # fmt: skip
    state.ingest(report_from(report("cool", [gpu(0), gpu(1)])))
    for node in ("hot", "cool"):
        kube.add_node(node)


async def _filtered(kube: Any, app: Any, client: Any, claim: str, name: str) -> dict[str, Any]:
    """A pod of a claim of a whole GPU, in the extender's caches, filtered onto "cool"."""
    await _setup(kube, app)
    kube.put("resourceclaims", _claim(claim, WHOLE))
    pod = _claim_pod(name, claim)
    kube.put("pods", pod)
    sync = app.state.ctx.sync
    await eventually(lambda: sync.dra.wants_of(pod) and ("default", name) in sync.pods)
    resp = (await client.post("/filter", json=args_names(pod, ["hot", "cool"]))).json()
    assert resp["NodeNames"] == ["cool"]
    assert app.state.ctx.state.reserved(f"uid-{name}")
    return pod


async def test_a_claim_pod_is_kept_off_hot_gpus_and_bound_without_a_gpu_annotation(
    kube, kubeconfig
):
    async with running_extender(kubeconfig, dra=True) as (app, client):
        pod = await _filtered(kube, app, client, "train-gpu", "train")
        sync = app.state.ctx.sync
        explained = (await client.post("/debug/explain", json=args_names(pod, ["hot"]))).json()
        (hot,) = explained["nodes"]
        assert hot["verdict"] != "passed" and "hot" in hot["reason"], hot
        # kube-scheduler writes the allocation (the device its allocator chose) before bind.
        claim = kube.get("resourceclaims", "train-gpu")
        claim["status"] = {"allocation": {
            "devices": {"results": [{"request": "gpu", "driver": "gpu.edgegpu.io",
                                     "pool": "cool", "device": "gpu-whatever"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["cool"]}]}]}}}  # fmt: skip
        kube.put("resourceclaims", claim)
        await eventually(lambda: sync.dra.claims_of(pod) and not sync.dra.wants_of(pod))
        assert (await client.post("/bind", json={
            "PodName": "train", "PodNamespace": "default", "PodUID": "uid-train",
            "Node": "cool"})).json() == {"Error": ""}  # fmt: skip
        stored = kube.get("pods", "train")
        assert stored["spec"]["nodeName"] == "cool"
        # Which GPU is the claim's (the scheduler's allocation), not a guess of ours.
        assert not any(
            k.startswith("edgegpu.io/gpu") for k in stored["metadata"].get("annotations", {})
        )
        assert not app.state.ctx.state.reserved("uid-train")


async def test_a_claim_of_part_of_a_gpus_memory_is_weighed_in_whole_blocks(kube, kubeconfig):
    async with running_extender(kubeconfig, dra=True) as (app, client):
        await _setup(kube, app)
        kube.put("resourceclaims", _claim("infer-gpu", {"exactly": {
            "deviceClassName": "gpu.edgegpu.io", "capacity": {"requests": {"memory": "6Gi"}}}}))  # fmt: skip
        pod = _claim_pod("infer", "infer-gpu")
        sync = app.state.ctx.sync
        await eventually(lambda: sync.dra.wants_of(pod))
        explained = (await client.post("/debug/explain", json=args_names(pod, ["cool"]))).json()
        assert explained["pod"]["mem_blocks"] == 2  # 6 GiB in 4 GiB blocks
        assert explained["pod"]["through_claims"] is True
        # Once allocated, a claim takes no more: a pod sharing it is placed where it is.
        claim = kube.get("resourceclaims", "infer-gpu")
        claim["status"] = {"allocation": {"devices": {"results": []}}}
        kube.put("resourceclaims", claim)
        await eventually(lambda: not sync.dra.wants_of(pod))


async def test_a_claim_pod_bound_before_its_allocation_reached_the_watch_gets_no_gpu_of_ours(
    kube, kubeconfig
):
    async with running_extender(kubeconfig, dra=True) as (app, client):
        await _filtered(kube, app, client, "lag-gpu", "lag")
        # The claim still looks unallocated here (the watch lags the scheduler's PreBind).
        assert (await client.post("/bind", json={
            "PodName": "lag", "PodNamespace": "default", "PodUID": "uid-lag",
            "Node": "cool"})).json() == {"Error": ""}  # fmt: skip
        stored = kube.get("pods", "lag")
        assert stored["spec"]["nodeName"] == "cool"
        assert not any(
            k.startswith("edgegpu.io/gpu") for k in stored["metadata"].get("annotations", {})
        )
        assert app.state.ctx.state.allocations.get("uid-lag") is None
