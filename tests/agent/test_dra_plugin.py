"""The agent's DRA kubelet plugin over real gRPC on a unix socket: registration as kubelet does
it, claims prepared into CDI specs and unprepared, and every way a claim cannot be prepared."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from node_agent.config import AgentSettings
from node_agent.dra import (
    dra_pb2,
    dra_pb2_grpc,
    health_pb2,
    health_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)
from node_agent.dra.health import DeviceHealth
from node_agent.dra.plugin import AllocatedClaim, ClaimDevice, DraPlugin
from node_agent.dra.server import DraServer
from node_agent.uplink import claims as uplink_claims
from node_agent.uplink.claims import claim_of

UID = "0f3c2a9e-4d1b-4c55-9a7e-1b2c3d4e5f60"
WHOLE = AllocatedClaim(
    UID, "ml", "train-gpu", (ClaimDevice("gpu", "edge-1", "gpu-1", "GPU-bbbb", None),)
)
SHARED = AllocatedClaim(
    "7d0e-share", "ml", "infer",
    (ClaimDevice("mem", "edge-1", "gpu-0", "GPU-aaaa", 8192, share_id="s-1"),),
)  # fmt: skip


class Extenders:
    """What the extender replicas list for this node; None: none answered."""

    def __init__(self, *claims: AllocatedClaim) -> None:
        self.claims: dict[str, AllocatedClaim] | None = {c.uid: c for c in claims}
        self.asked = 0

    async def __call__(self) -> dict[str, AllocatedClaim] | None:
        self.asked += 1
        return self.claims


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[DraServer, Extenders, grpc.aio.Channel]]:
    extenders = Extenders(WHOLE, SHARED)
    nodes = {"GPU-cccc": ("/dev/dri/card1", "/dev/dri/renderD129")}
    plugin = DraPlugin(extenders, tmp_path / "cdi", lambda uuid: nodes.get(uuid, ()))
    server = DraServer(plugin, tmp_path / "plugins_registry", poll_s=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    for _ in range(200):
        if server.socket.exists():
            break
        await asyncio.sleep(0.01)
    async with grpc.aio.insecure_channel(f"unix://{server.socket}") as channel:
        yield server, extenders, channel
    stop.set()
    await task


def _claim(c: AllocatedClaim) -> dra_pb2.Claim:
    return dra_pb2.Claim(namespace=c.namespace, uid=c.uid, name=c.name)


async def test_kubelet_registers_the_plugin_as_a_dra_driver_on_its_one_socket(served):
    server, _, channel = served
    assert server.socket.name == "gpu.edgegpu.io.sock"
    stub = registration_pb2_grpc.RegistrationStub(channel)
    info = await stub.GetInfo(registration_pb2.InfoRequest(), timeout=5)
    assert (info.type, info.name, list(info.supported_versions)) == (
        "DRAPlugin", "gpu.edgegpu.io", ["v1.DRAPlugin"])  # fmt: skip
    assert info.endpoint == ""  # kubelet calls the service on the registration socket
    assert server.registered is False
    await stub.NotifyRegistrationStatus(registration_pb2.RegistrationStatus(plugin_registered=True))
    assert server.registered is True
    await stub.NotifyRegistrationStatus(
        registration_pb2.RegistrationStatus(plugin_registered=False, error="version")
    )
    assert server.registered is False


async def test_a_whole_gpu_claim_gets_a_cdi_spec_naming_its_gpu(served):
    server, _, channel = served
    stub = dra_pb2_grpc.DRAPluginStub(channel)
    out = await stub.NodePrepareResources(
        dra_pb2.NodePrepareResourcesRequest(claims=[_claim(WHOLE)])
    )
    answer = out.claims[UID]
    assert answer.error == ""
    (device,) = answer.devices
    assert (list(device.request_names), device.pool_name, device.device_name) == (
        ["gpu"], "edge-1", "gpu-1")  # fmt: skip
    assert list(device.cdi_device_ids) == [f"edgegpu.io/gpu={UID}-gpu"]
    spec = json.loads(server.plugin.spec_path(UID).read_text())
    assert spec["kind"] == "edgegpu.io/gpu" and spec["cdiVersion"] == "0.6.0"
    (cdi,) = spec["devices"]
    assert cdi["name"] == f"{UID}-gpu"
    assert sorted(cdi["containerEdits"]["env"]) == [
        "EDGEGPU_GPU_UUID=GPU-bbbb", "NVIDIA_VISIBLE_DEVICES=GPU-bbbb"]  # fmt: skip


async def test_a_shared_claim_gets_its_memory_limit_and_share_id(served):
    server, _, channel = served
    stub = dra_pb2_grpc.DRAPluginStub(channel)
    out = await stub.NodePrepareResources(
        dra_pb2.NodePrepareResourcesRequest(claims=[_claim(SHARED)])
    )
    (device,) = out.claims[SHARED.uid].devices
    assert device.share_id == "s-1"
    spec = json.loads(server.plugin.spec_path(SHARED.uid).read_text())
    assert "EDGEGPU_MEM_LIMIT_MIB=8192" in spec["devices"][0]["containerEdits"]["env"]


async def _prepare(
    extenders: Extenders, channel: grpc.aio.Channel, claim: AllocatedClaim
) -> dra_pb2.NodePrepareResourcesResponse:
    """``claim`` listed by the extenders, and kubelet asking to prepare it."""
    assert extenders.claims is not None
    extenders.claims[claim.uid] = claim
    stub = dra_pb2_grpc.DRAPluginStub(channel)
    return await stub.NodePrepareResources(
        dra_pb2.NodePrepareResourcesRequest(claims=[_claim(claim)])
    )


async def test_an_amd_or_intel_gpu_is_given_by_its_device_nodes(served, tmp_path):
    server, extenders, channel = served
    claim = AllocatedClaim(
        "c-amd", "ml", "x", (ClaimDevice("gpu", "edge-1", "gpu-2", "GPU-cccc", None),)
    )
    out = await _prepare(extenders, channel, claim)
    assert out.claims["c-amd"].error == ""
    edits = json.loads(server.plugin.spec_path("c-amd").read_text())["devices"][0]["containerEdits"]
    assert edits["deviceNodes"] == [{"path": "/dev/dri/card1"}, {"path": "/dev/dri/renderD129"}]
    assert not any(e.startswith("NVIDIA_VISIBLE_DEVICES=") for e in edits["env"])


async def test_preparing_twice_and_unpreparing_twice_are_both_fine(served):
    server, _, channel = served
    stub = dra_pb2_grpc.DRAPluginStub(channel)
    request = dra_pb2.NodePrepareResourcesRequest(claims=[_claim(WHOLE)])
    first = await stub.NodePrepareResources(request)
    again = await stub.NodePrepareResources(request)
    assert first == again
    undo = dra_pb2.NodeUnprepareResourcesRequest(claims=[_claim(WHOLE)])
    for _ in range(2):
        out = await stub.NodeUnprepareResources(undo)
        assert out.claims[UID].error == ""
    assert not server.plugin.spec_path(UID).exists()
    assert list(server.plugin.cdi_dir.iterdir()) == []  # no temporary file left behind


@pytest.mark.parametrize(
    ("claim", "answers", "why"),
    [
        pytest.param(dra_pb2.Claim(namespace="ml", uid="nope-1", name="x"), True,
                     "no extender lists it", id="not allocated here"),
        pytest.param(dra_pb2.Claim(namespace="other", uid=UID, name="train-gpu"), True,
                     "no extender lists it", id="another claim's uid"),
        pytest.param(dra_pb2.Claim(namespace="ml", uid="../../etc/x", name="x"), True,
                     "not a claim uid", id="a uid that is a path"),
        pytest.param(_claim(WHOLE), False, "no extender answered", id="no extender answers"),
    ],
)  # fmt: skip
async def test_a_claim_that_cannot_be_prepared_says_why_and_writes_nothing(
    served, claim, answers, why
):
    server, extenders, channel = served
    if not answers:
        extenders.claims = None
    stub = dra_pb2_grpc.DRAPluginStub(channel)
    out = await stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[claim]))
    assert why in out.claims[claim.uid].error
    assert not out.claims[claim.uid].devices
    assert not server.plugin.cdi_dir.exists() or list(server.plugin.cdi_dir.iterdir()) == []


async def test_the_plugin_serves_again_when_its_socket_is_removed(served):
    server, _, _ = served
    server.socket.unlink()
    for _ in range(200):
        if server.socket.exists():
            break
        await asyncio.sleep(0.02)
    async with grpc.aio.insecure_channel(f"unix://{server.socket}") as channel:
        info = await registration_pb2_grpc.RegistrationStub(channel).GetInfo(
            registration_pb2.InfoRequest(), timeout=5
        )
    assert info.name == "gpu.edgegpu.io"


@pytest.mark.parametrize(
    "row",
    [
        "not a row",
        {"uid": UID, "namespace": "ml", "name": "c"},
        {"uid": UID, "namespace": "ml", "name": "c", "devices": [{"request": "gpu", "pool": "a",
         "device": "gpu-0", "uuid": "GPU-\nx"}]},
        {"uid": UID, "namespace": "ml", "name": "c", "devices": [{"request": "gpu", "pool": "a",
         "device": "GPU 0", "uuid": "GPU-aaaa"}]},
        {"uid": UID, "namespace": "ml", "name": "c", "devices": [{"request": "gpu", "pool": "a",
         "device": "gpu-0", "uuid": "GPU-aaaa", "memory_mib": -1}]},
    ],
)  # fmt: skip
def test_a_claims_row_not_as_the_extender_writes_them_is_refused(row):
    with pytest.raises(ValueError):
        claim_of(row)


def test_a_claims_row_as_the_extender_writes_it_is_read():
    row = {"uid": UID, "namespace": "ml", "name": "c", "devices": [
        {"request": "gpu", "pool": "a", "device": "gpu-0", "uuid": "GPU-aaaa", "memory_mib": 4096,
         "share_id": "s-1"}]}  # fmt: skip
    assert claim_of(row) == AllocatedClaim(
        UID, "ml", "c", (ClaimDevice("gpu", "a", "gpu-0", "GPU-aaaa", 4096, "s-1"),)
    )


def test_the_agent_refuses_to_serve_both_dialects(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "edge-1")
    with pytest.raises(ValueError, match="exclusive"):
        AgentSettings(dra=True, device_plugin=True)


async def test_kubelet_hears_each_gpus_health_at_once_and_each_change(tmp_path):
    health = {"GPU-AAAA": (True, ""), "GPU-bbbb": (False, "xid:79")}
    sampled = [time.time()]
    plugin = DraPlugin(Extenders(), tmp_path / "cdi")
    watched = DeviceHealth("edge-1", lambda: (sampled[0], dict(health)), poll_s=0.02,
                           period_s=0.1)  # fmt: skip
    server = DraServer(plugin, tmp_path / "reg", poll_s=0.05, health=watched)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    try:
        for _ in range(200):
            if server.socket.exists():
                break
            await asyncio.sleep(0.01)
        async with grpc.aio.insecure_channel(f"unix://{server.socket}") as channel:
            info = await registration_pb2_grpc.RegistrationStub(channel).GetInfo(
                registration_pb2.InfoRequest(), timeout=5
            )
            assert "v1alpha1.DRAResourceHealth" in info.supported_versions
            stream = health_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                health_pb2.NodeWatchResourcesRequest()
            )
            first = await asyncio.wait_for(stream.read(), 5)
            seen = {(d.device.pool_name, d.device.device_name): (d.health, d.message)
                    for d in first.devices}  # fmt: skip
            # Named as the extender's slice names them: after the GPU's uuid.
            assert seen == {("edge-1", "gpu-aaaa"): (health_pb2.HEALTHY, ""),
                            ("edge-1", "gpu-bbbb"): (health_pb2.UNHEALTHY, "xid:79")}  # fmt: skip
            assert all(d.health_check_timeout_seconds > 0 for d in first.devices)
            health["GPU-AAAA"] = (False, "ecc:dbe")
            changed = await asyncio.wait_for(stream.read(), 5)
            assert changed.devices[0].health == health_pb2.UNHEALTHY
            assert changed.devices[0].message == "ecc:dbe"
            # The agent stops sampling: what is sent again keeps its sample's time, so kubelet
            # reads Unknown once it is older than the timeout (not a stale Healthy).
            sampled[0] = time.time() - 3600
            again = await asyncio.wait_for(stream.read(), 5)
            assert all(d.last_updated_time <= sampled[0] + 1 for d in again.devices)
            stream.cancel()
    finally:
        stop.set()
        await task


async def test_a_request_of_two_gpus_is_one_cdi_device_naming_both(served):
    server, extenders, channel = served
    claim = AllocatedClaim("c-two", "ml", "pair", (
        ClaimDevice("train/large", "edge-1", "gpu-a", "GPU-aaaa", None),
        ClaimDevice("train/large", "edge-1", "gpu-b", "GPU-bbbb", None),
    ))  # fmt: skip
    out = await _prepare(extenders, channel, claim)
    devices = out.claims["c-two"].devices
    # A subrequest of firstAvailable is named by its request, as the containers name it.
    assert [list(d.request_names) for d in devices] == [["train"], ["train"]]
    assert [list(d.cdi_device_ids) for d in devices] == [["edgegpu.io/gpu=c-two-train"], []]
    spec = json.loads(server.plugin.spec_path("c-two").read_text())
    (cdi,) = spec["devices"]
    assert "NVIDIA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb" in cdi["containerEdits"]["env"]


async def test_a_claim_of_two_requests_is_refused_as_one_variable_cannot_list_both(served):
    server, extenders, channel = served
    claim = AllocatedClaim("c-mix", "ml", "mix", (
        ClaimDevice("train", "edge-1", "gpu-a", "GPU-aaaa", None),
        ClaimDevice("infer", "edge-1", "gpu-c", "GPU-cccc", 4096),
    ))  # fmt: skip
    out = await _prepare(extenders, channel, claim)
    assert "more than one request" in out.claims["c-mix"].error
    assert not server.plugin.spec_path("c-mix").exists()


async def test_a_claim_naming_a_gpu_this_node_has_not_is_not_prepared(tmp_path):
    plugin = DraPlugin(Extenders(WHOLE), tmp_path / "cdi", gpus=lambda: {"GPU-aaaa"})
    out = await plugin.NodePrepareResources(
        dra_pb2.NodePrepareResourcesRequest(claims=[_claim(WHOLE)]), None
    )
    assert "GPU-bbbb, no GPU of this node" in out.claims[UID].error
    assert not (tmp_path / "cdi").exists()


async def test_replicas_that_disagree_on_a_claims_devices_give_it_no_gpu(monkeypatch):
    def row(device: str, uuid: str) -> dict[str, object]:
        return {"uid": UID, "namespace": "ml", "name": "c", "devices": [
            {"request": "gpu", "pool": "a", "device": device, "uuid": uuid}]}  # fmt: skip

    # One replica lists the claim as it was before it was allocated again.
    answers = iter([[row("gpu-0", "GPU-aaaa")], [row("gpu-1", "GPU-bbbb")]])

    async def listed_rows(*_args: object) -> list[object]:
        return next(answers)

    monkeypatch.setattr(uplink_claims, "listed_rows", listed_rows)
    assert await uplink_claims.merged(None, ["r1", "r2"], "a", {}, 1 << 20) == {}  # type: ignore[arg-type]
