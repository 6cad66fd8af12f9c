"""The DRA driver's view from the extender: the slice each node's reports ask for, the claims on
our devices, and what a node's agent is told of them."""

from __future__ import annotations

from typing import Any

from scheduler_extender.k8s.dra import ClaimWant, DraView, claim_of, mib_of, want_of
from scheduler_extender.k8s.sync import assignment_from_claims
from scheduler_extender.names import dra_device_name as device_name
from scheduler_extender.remediation.slices import _essence, desired_spec, quantity
from tests.builders import gpu, report


def registered(node: str, gpus: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    doc = report(node, gpus, **kw)
    doc["node_health"]["dra_plugin_registered"] = True
    return doc


async def _state(client, clock, *docs):
    for doc in docs:
        assert (await client.post("/v1/telemetry", json=doc)).status_code == 200


def _devices(app, node):
    spec = desired_spec(app.state.ctx.state, node)
    return None if spec is None else {d["name"]: d for d in spec["devices"]}


async def test_a_node_gets_a_slice_only_once_kubelet_took_its_agents_dra_plugin(client, app, clock):
    await _state(client, clock, report("a", [gpu(0)]))
    assert desired_spec(app.state.ctx.state, "a") is None
    await _state(client, clock, registered("a", [gpu(0)]))
    spec = desired_spec(app.state.ctx.state, "a")
    assert spec["driver"] == "gpu.edgegpu.io" and spec["nodeName"] == "a"
    assert spec["pool"] == {"name": "a", "resourceSliceCount": 1}


async def test_each_gpu_is_a_device_with_its_attributes_and_memory_in_whole_blocks(
    client, app, clock
):
    await _state(client, clock, registered("a", [gpu(0, memory_total_mib=15360.0), gpu(1)]))
    devices = _devices(app, "a")
    # Named after the GPU, not its index: a claim names the same GPU after a re-index.
    assert sorted(devices) == ["gpu-0000", "gpu-0001"]
    d0 = devices["gpu-0000"]
    assert d0["attributes"]["uuid"] == {"string": "GPU-0000"}
    assert d0["attributes"]["index"] == {"int": 0}
    assert d0["attributes"]["model"] == {"string": "Tesla T4"}
    assert d0["attributes"]["memoryTotalMiB"] == {"int": 15360}
    # 15360 MiB is three 4096 MiB blocks: a claim gets whole blocks, the rest is never given.
    memory = d0["capacity"]["memory"]
    assert memory["value"] == "12Gi"
    assert memory["requestPolicy"] == {"default": "12Gi",
                                       "validRange": {"min": "4Gi", "step": "4Gi"}}  # fmt: skip
    assert d0["allowMultipleAllocations"] is True
    assert "taints" not in d0


async def test_driver_and_firmware_versions_are_attributes_a_selector_can_compare(
    client, app, clock
):
    await _state(client, clock, registered("a", [
        gpu(0, driver_version="535.104.05", vbios_version="96.00.74.00.01"),
        gpu(1, driver_version="I915_23.10.32_PSB_231129.32", firmware_version="DG02_1.3172"),
        gpu(2),
    ]))  # fmt: skip
    devices = _devices(app, "a")
    nvidia, intel, unknown = (devices[f"gpu-000{i}"]["attributes"] for i in range(3))
    # semver for CEL's compareTo (leading zeros are not semver): 535.104.05 reads 535.104.5.
    assert nvidia["driverVersion"] == {"version": "535.104.5"}
    assert nvidia["driver"] == {"string": "535.104.05"}
    assert nvidia["vbiosVersion"] == {"string": "96.00.74.00.01"}
    assert "driverVersion" not in intel and intel["driver"]["string"].startswith("I915_")
    assert intel["firmwareVersion"] == {"string": "DG02_1.3172"}
    assert not {"driver", "driverVersion", "vbiosVersion", "firmwareVersion"} & set(unknown)


async def test_a_hot_gpu_is_tainted_then_cooling_down_then_untainted(client, app, clock):
    await _state(client, clock, registered("a", [gpu(0, temperature_c=90.0), gpu(1)]))
    devices = _devices(app, "a")
    assert devices["gpu-0000"]["taints"] == [{"key": "gpu.edgegpu.io/hot", "effect": "NoSchedule"}]
    assert "taints" not in devices["gpu-0001"]
    clock.advance(10)
    await _state(client, clock, registered("a", [gpu(0, temperature_c=60.0), gpu(1)]))
    assert _devices(app, "a")["gpu-0000"]["taints"] == [
        {"key": "gpu.edgegpu.io/cooling-down", "effect": "NoSchedule"}
    ]
    clock.advance(301)
    await _state(client, clock, registered("a", [gpu(0, temperature_c=60.0), gpu(1)]))
    assert "taints" not in _devices(app, "a")["gpu-0000"]


async def test_an_unhealthy_gpu_is_tainted_with_its_reason(client, app, clock):
    sick = gpu(0, health="unhealthy", health_reasons=["xid:79"])
    await _state(client, clock, registered("a", [sick]))
    assert _devices(app, "a")["gpu-0000"]["taints"] == [
        {"key": "gpu.edgegpu.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    ]


async def test_the_slice_does_not_change_with_the_readings(client, app, clock):
    await _state(client, clock, registered("a", [gpu(0, temperature_c=50.0, power_w=30.0)]))
    first = desired_spec(app.state.ctx.state, "a")
    clock.advance(5)
    await _state(client, clock, registered("a", [gpu(0, temperature_c=71.0, power_w=64.0,
                                                     memory_used_mib=9000.0)]))  # fmt: skip
    assert desired_spec(app.state.ctx.state, "a") == first


def test_what_the_api_server_adds_to_a_slice_is_not_a_change():
    ours = {"driver": "gpu.edgegpu.io", "pool": {"name": "a", "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "taints": [{"key": "k", "effect": "NoSchedule"}]}]}  # fmt: skip
    stored = {"driver": "gpu.edgegpu.io",
              "pool": {"name": "a", "resourceSliceCount": 1, "generation": 3},
              "devices": [{"name": "gpu-0", "taints": [{"key": "k", "effect": "NoSchedule",
                                                         "timeAdded": "2026-12-07T10:00:00Z"}]}]}  # fmt: skip
    assert _essence(ours) == _essence(stored)
    stored["devices"][0]["taints"] = []
    assert _essence(ours) != _essence(stored)


def test_a_device_is_named_after_its_gpus_uuid_as_a_dns_label():
    assert device_name("GPU-8f3c2a9e-4d1b-4c55-9a7e-1b2c3d4e5f60") == (
        "gpu-8f3c2a9e-4d1b-4c55-9a7e-1b2c3d4e5f60"
    )
    assert device_name("0000:01:00.0") == device_name("0000:01:00.0")
    assert device_name("0000:01:00.0").startswith("gpu-") and ":" not in device_name("0000:01:00.0")
    assert device_name("MIG-x" * 20) != device_name("MIG-y" * 20)


async def test_a_gpu_of_one_block_is_offered_whole_and_long_texts_are_cut(client, app, clock):
    one = gpu(0, memory_total_mib=7600.0, model="NVIDIA Jetson AGX Orin " + "é" * 80)
    await _state(client, clock, registered("a", [one]))
    (device,) = _devices(app, "a").values()
    # min + step must fit in the capacity: with one block there is nothing to share.
    assert device["capacity"] == {"memory": {"value": "4Gi"}}
    assert "allowMultipleAllocations" not in device
    # The API server counts bytes: 64 of UTF-8, no character split.
    assert len(device["attributes"]["model"]["string"].encode()) == 63


def test_quantities_are_written_as_the_api_server_writes_them_back():
    assert [quantity(m) for m in (12288, 4096, 1536, 2 << 20)] == ["12Gi", "4Gi", "1536Mi", "2Ti"]


def test_memory_quantities_read_as_mib():
    assert mib_of("8Gi") == 8192
    assert mib_of("4096Mi") == 4096
    assert mib_of("8589934592") == 8192
    assert mib_of("1G") == 953
    assert mib_of("lots") is None
    assert mib_of("0") is None


def _claim(
    uid: str, results: list[dict[str, Any]], reserved: tuple[str, ...] = (),
    node: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    node = node or (results[0]["pool"] if results else "a")
    where = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]}  # fmt: skip
    return {
        "metadata": {"uid": uid, "namespace": "ml", "name": f"claim-{uid}"},
        "status": {
            "allocation": {"devices": {"results": results}, "nodeSelector": where},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": u} for u in reserved],
        },
    }


def _slice(node: str, devices: list[dict[str, Any]], **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": f"{node}-gpu.edgegpu.io-x1",
                         "labels": labels or {"app.kubernetes.io/managed-by": "edgegpu"}},
            "spec": {"driver": "gpu.edgegpu.io", "nodeName": node,
                     "pool": {"name": node, "resourceSliceCount": 1}, "devices": devices}}  # fmt: skip


def test_a_node_with_two_slices_of_ours_keeps_the_oldest_until_the_other_goes():
    view = DraView()
    old = _slice("a", [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-aaaa"},
                                                         "index": {"int": 0}}}])  # fmt: skip
    old["metadata"]["creationTimestamp"] = "2026-12-01T10:00:00Z"
    # The newer one sorts first by name: the age decides, not the name.
    new = {**_slice("a", [{"name": "gpu-0", "attributes": {"index": {"int": 7}}}]),
           "metadata": {**old["metadata"], "name": "a-gpu.edgegpu.io-a0",
                        "creationTimestamp": "2026-12-01T10:00:05Z"}}  # fmt: skip
    view.replace_slices([old, new])
    assert [s["metadata"]["name"] for s in view.slices_of("a")] == [
        "a-gpu.edgegpu.io-x1", "a-gpu.edgegpu.io-a0"]  # fmt: skip
    assert view.gpu_index("a", "gpu-0") == 0  # what the kept slice says, not the extra
    view.slice_event("DELETED", new)
    assert view.of_node("a") is old and "a" not in view.deleted_at
    view.slice_event("DELETED", old)
    assert view.of_node("a") is None and "a" in view.deleted_at


def test_a_write_answer_is_kept_unless_the_watch_showed_a_newer_slice():
    view = DraView()
    created = _slice("a", [])
    created["metadata"]["resourceVersion"] = "5"
    view.written(None, created)  # the watch has not shown the create yet
    assert view.of_node("a") is created
    newer = {**created, "metadata": {**created["metadata"], "resourceVersion": "7"}}
    view.slice_event("MODIFIED", newer)
    view.written(None, created)  # a create's answer the watch has overtaken is not stored
    assert view.of_node("a") is newer
    stale = {**created, "metadata": {**created["metadata"], "resourceVersion": "6"}}
    view.written(created, stale)  # a replace of rv 5 answered after the watch showed rv 7
    assert view.of_node("a") is newer
    latest = {**created, "metadata": {**created["metadata"], "resourceVersion": "8"}}
    view.written(newer, latest)
    assert view.of_node("a") is latest


def test_a_create_answered_after_the_watch_showed_it_deleted_is_not_put_back():
    view = DraView()
    created = _slice("a", [])
    view.slice_event("ADDED", created)
    view.slice_event("DELETED", created)  # kubelet's start wiped it before our answer came
    view.written(None, created)
    assert view.of_node("a") is None and "a" in view.deleted_at


def test_a_slice_edited_to_look_like_someone_elses_leaves_our_view():
    view = DraView()
    ours = _slice("a", [])
    view.slice_event("ADDED", ours)
    view.slice_event("MODIFIED", {**ours, "metadata": {**ours["metadata"], "labels": {}}})
    assert view.of_node("a") is None and "a" in view.deleted_at


def test_what_a_gone_nodes_slices_said_is_forgotten():
    view = _view_with("a", [])
    assert view.gpu_uuid("a", "gpu-0") == "GPU-aaaa"
    view.replace_slices([])
    assert view.gpu_uuid("a", "gpu-0") == "GPU-aaaa"  # kubelet's wipe: still known
    view.forget_node("a")
    assert view.gpu_uuid("a", "gpu-0") is None


def test_only_the_slices_the_leader_made_are_taken_for_ours():
    view = DraView()
    device = [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-evil"}}}]
    foreign = _slice("a", device, **{"app.kubernetes.io/managed-by": "someone"})
    view.replace_slices([foreign])
    assert view.of_node("a") is None and view.gpu_uuid("a", "gpu-0") is None
    view.slice_event("ADDED", _slice("a", [{"name": "gpu-0",
                                          "attributes": {"uuid": {"string": "GPU-aaaa"}}}]))  # fmt: skip
    assert view.gpu_uuid("a", "gpu-0") == "GPU-aaaa"


def _result(device: str, pool: str = "a", driver: str = "gpu.edgegpu.io", **more: Any):
    return {"request": "gpu", "driver": driver, "pool": pool, "device": device, **more}


def test_a_claim_allocated_our_device_is_kept_with_its_memory_and_share():
    claim = claim_of(_claim("u1", [_result("gpu-1", shareID="s-1",
                                           consumedCapacity={"memory": "8Gi"})], ("pod-1",)))  # fmt: skip
    assert claim is not None
    assert (claim.node, claim.reserved_for) == ("a", ("pod-1",))
    (device,) = claim.devices
    assert (device.device, device.memory_mib, device.share_id) == ("gpu-1", 8192, "s-1")


def test_claims_of_other_drivers_or_not_allocated_are_not_ours():
    assert claim_of(_claim("u1", [_result("gpu-0", driver="gpu.nvidia.com")])) is None
    assert claim_of({"metadata": {"uid": "u2"}, "status": {}}) is None
    # A pool not the node the claim is usable on (a slice some node made under our driver's
    # name) is not ours.
    assert claim_of(_claim("u4", [_result("gpu-0", pool="a")], node="b")) is None


def test_an_admin_access_claim_is_told_to_its_node_and_holds_no_gpu(app):
    view = _view_with("a", [_claim("u1", [_result("gpu-0", adminAccess=True)])])
    # kubelet prepares it like any claim (a monitoring pod sees the GPU)...
    assert [d["device"] for c in view.claims_on("a") for d in c["devices"]] == ["gpu-0"]
    # ...but it takes none of the GPU from the pods that hold it.
    assert assignment_from_claims(_claim_pod("claim-u1"), view, app.state.ctx.state) is None


def test_a_claim_keeps_its_gpu_while_kubelet_wipes_and_remakes_the_slice(app):
    view = _view_with("a", [_claim("u1", [_result("gpu-1")])])
    pod = _claim_pod("claim-u1")
    view.replace_slices([])  # kubelet's start deletes the node's slices
    found = assignment_from_claims(pod, view, app.state.ctx.state)
    assert found is not None and found.gpu_uuids == ("GPU-bbbb",)
    assert view.claims_on("a")[0]["devices"][0]["uuid"] == "GPU-bbbb"


def test_a_node_is_told_its_claims_with_the_gpu_uuid_its_slice_gives_each_device():
    view = DraView()
    view.replace_slices([_slice("a", [
        {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-aaaa"}, "index": {"int": 0}}},
        {"name": "gpu-1", "attributes": {"uuid": {"string": "GPU-bbbb"}, "index": {"int": 1}}}])])  # fmt: skip
    view.replace_claims(
        [
            _claim("u1", [_result("gpu-1", consumedCapacity={"memory": "4Gi"})]),
            _claim("u2", [_result("gpu-0", pool="b")]),
        ]
    )
    assert view.claims_on("a") == [{
        "uid": "u1", "namespace": "ml", "name": "claim-u1",
        "devices": [{"request": "gpu", "pool": "a", "device": "gpu-1", "uuid": "GPU-bbbb",
                     "memory_mib": 4096, "share_id": None}],
    }]  # fmt: skip
    # b has no slice of ours: its claim is not listed rather than given a guessed GPU.
    assert view.claims_on("b") == []
    view.claim_event("DELETED", _claim("u1", []))
    assert view.claims_on("a") == []


async def test_the_claims_route_is_not_served_without_dra(client):
    resp = await client.get("/v1/nodes/a/claims")
    assert resp.status_code == 404
    assert "without DRA" in resp.json()["error"]


def _view_with(node: str, claims: list[dict[str, Any]]) -> DraView:
    view = DraView()
    device = {"capacity": {"memory": {"value": "12Gi"}}}
    view.replace_slices([_slice(node, [
        {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-aaaa"}, "index": {"int": 0}},
         **device},
        {"name": "gpu-1", "attributes": {"uuid": {"string": "GPU-bbbb"}, "index": {"int": 1}},
         **device}])])  # fmt: skip
    view.replace_claims(claims)
    return view


def _claim_pod(claim: str, node: str = "a", phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"uid": "pod-1", "namespace": "ml", "name": "p",
                         "annotations": {"edgegpu.io/qos": "training"}},
            "spec": {"nodeName": node, "resourceClaims": [{"name": "gpu",
                     "resourceClaimTemplateName": "t"}]},
            "status": {"phase": phase,
                       "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]}}  # fmt: skip


def test_a_pod_holding_a_whole_gpu_through_its_claim_is_an_assignment_of_that_gpu(app):
    state = app.state.ctx.state
    view = _view_with("a", [_claim("u1", [_result("gpu-1", consumedCapacity={"memory": "12Gi"})])])
    found = assignment_from_claims(_claim_pod("claim-u1"), view, state)
    assert found is not None
    assert (found.node, found.gpu_indices, found.gpu_uuids) == ("a", (1,), ("GPU-bbbb",))
    assert (found.whole, found.mem_blocks, found.qos.name) == (True, 0, "TRAINING")


def test_a_claim_of_part_of_a_gpus_memory_holds_that_many_blocks(app):
    state = app.state.ctx.state
    view = _view_with("a", [_claim("u1", [_result("gpu-0", consumedCapacity={"memory": "8Gi"})])])
    found = assignment_from_claims(_claim_pod("claim-u1"), view, state)
    assert found is not None and (found.whole, found.mem_blocks) == (False, 2)


def test_a_finished_pod_or_a_claim_of_another_node_holds_nothing(app):
    state = app.state.ctx.state
    view = _view_with("a", [_claim("u1", [_result("gpu-0", pool="b")])])
    assert assignment_from_claims(_claim_pod("claim-u1"), view, state) is None
    view = _view_with("a", [_claim("u1", [_result("gpu-0")])])
    assert assignment_from_claims(_claim_pod("claim-u1", phase="Succeeded"), view, state) is None
    assert assignment_from_claims(_claim_pod("claim-u9"), view, state) is None


def test_what_a_claim_asks_of_our_driver_is_read_from_its_request():
    def want(request: dict[str, Any]) -> Any:
        return want_of({"spec": {"devices": {"requests": [{"name": "gpu", **request}]}}})

    ours = {"deviceClassName": "gpu.edgegpu.io"}
    assert want({"exactly": ours}) == ClaimWant(1, None)
    assert want({"exactly": {**ours, "count": 2}}) == ClaimWant(2, None)
    shared = {**ours, "capacity": {"requests": {"memory": "6Gi"}}}
    assert want({"exactly": shared}) == ClaimWant(1, 6144)
    # firstAvailable: the first subrequest of ours, the one the scheduler tries first.
    other = {"name": "nic", "deviceClassName": "nic.example.com"}
    assert want({"firstAvailable": [other, {"name": "big", **shared}]}) == ClaimWant(1, 6144)
    for nothing in ({"exactly": {**ours, "adminAccess": True}},
                    {"exactly": {"deviceClassName": "gpu.nvidia.com"}}):  # fmt: skip
        assert want(nothing) is None, nothing
    assert want_of({"spec": {"devices": {"requests": "x"}}}) is None
    # All of the node's GPUs, or a count the API server would refuse: one whole GPU at least.
    for one in ({"exactly": {**ours, "allocationMode": "All"}}, {"exactly": {**ours, "count": 0}}):
        assert want(one) == ClaimWant(1, None), one
    # Every request of ours counts: an admin one first hides nothing, and memory beside whole
    # GPUs is whole GPUs.
    doc = {"spec": {"devices": {"requests": [
        {"name": "look", "exactly": {**ours, "adminAccess": True}},
        {"name": "mem", "exactly": shared}, {"name": "big", "exactly": {**ours, "count": 8}}]}}}  # fmt: skip
    assert want_of(doc) == ClaimWant(9, None)
    # A quantity too long for a float is no quantity (not an error in the claims' watch).
    assert want({"exactly": {**ours, "capacity": {"requests": {"memory": "9" * 400}}}}) == (
        ClaimWant(1, None)
    )
    assert mib_of("9" * 400) is None


def test_only_claims_not_allocated_yet_ask_for_gpus():
    view = DraView()
    asks = {"metadata": {"namespace": "ml", "name": "claim-u1", "uid": "u1"},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.edgegpu.io"}}]}}}  # fmt: skip
    view.replace_claims([asks])
    pod = _claim_pod("claim-u1")
    assert view.wants_of(pod) == [ClaimWant(1, None)]
    view.claim_event("MODIFIED", {**asks, **_claim("u1", [_result("gpu-0")])})
    assert view.wants_of(pod) == []
    view.claim_event("DELETED", asks)
    assert view.wants_of(pod) == []
