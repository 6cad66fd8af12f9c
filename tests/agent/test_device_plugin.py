"""The agent's kubelet device plugin over real gRPC on unix sockets.

kubelet's side here is a Registration server and DevicePlugin client on the same wire API
(v1beta1); ``tests/e2e`` drives the plugin with a driver built on kubelet's own Go packages.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client import CollectorRegistry

from node_agent.backends.simulated import SimulatedBackend
from node_agent.deviceplugin import api_pb2, api_pb2_grpc, podresources_pb2, podresources_pb2_grpc
from node_agent.deviceplugin.devices import Assigned, GpuBlocks, gpu_of, preferred
from node_agent.deviceplugin.plugin import RESOURCE, BlockPlugin
from node_agent.deviceplugin.podresources import holders, pod_devices
from node_agent.deviceplugin.server import SOCKET, DevicePluginServer
from node_agent.loop import Agent
from node_agent.model import GpuHolder
from node_agent.protection.health import HealthArgs
from node_agent.protection.power import PowerArgs
from node_agent.telemetry.exporter import AgentMetrics
from node_agent.uplink.pusher import Pusher
from scheduler_extender.api.app import create_app
from scheduler_extender.domain import MAX_HOLDERS_PER_NODE, Assignment, QosClass
from scheduler_extender.policy.document import parse_policy
from scheduler_extender.telemetry.clock import FakeClock
from scheduler_extender.telemetry.decode import report_from
from tests.builders import gpu, report

GPUS = [GpuBlocks("GPU-a", 3, True), GpuBlocks("GPU-b", 3, True)]


class Kubelet(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    """kubelet's Registration service on ``kubelet.sock``: it records each plugin that
    registers and connects back to it, as kubelet's device manager does."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.registered: list[api_pb2.RegisterRequest] = []
        self.server: Any = None

    async def Register(self, request: api_pb2.RegisterRequest, context: Any) -> api_pb2.Empty:
        self.registered.append(request)
        return api_pb2.Empty()

    async def start(self) -> None:
        self.server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.folder / 'kubelet.sock'}")
        await self.server.start()

    async def restart(self) -> None:
        """A kubelet restart: every socket in the folder goes, a new kubelet.sock comes."""
        await self.server.stop(grace=0)
        for sock in self.folder.glob("*.sock"):
            sock.unlink()
        await self.start()

    def plugin(self) -> Any:
        channel = grpc.aio.insecure_channel(f"unix://{self.folder / SOCKET}")
        return channel, api_pb2_grpc.DevicePluginStub(channel)


class Refused(Exception):
    """What ``context.abort`` raises: the call ends with this status and message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code, self.details = code, details


class Context:
    """The servicer context of a call made without a server: ``abort`` ends it, as gRPC's."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Refused(code, details)


async def until(check: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("not in time")
        await asyncio.sleep(0.02)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "dp"
    path.mkdir()
    return path


async def _serving(folder: Path, plugin: BlockPlugin) -> tuple[Kubelet, DevicePluginServer, Any]:
    kubelet = Kubelet(folder)
    await kubelet.start()
    server = DevicePluginServer(plugin, folder, poll_s=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    await until(lambda: kubelet.registered)
    return kubelet, server, (stop, task)


async def _nothing() -> list[Assigned] | None:
    return []


async def test_registers_streams_health_changes_and_registers_again_after_a_kubelet_restart(
    folder: Path,
) -> None:
    plugin = BlockPlugin(_nothing, lambda: 4096)
    await plugin.update(GPUS)
    kubelet, server, (stop, task) = await _serving(folder, plugin)
    try:
        (req,) = kubelet.registered
        assert (req.version, req.endpoint, req.resource_name) == ("v1beta1", SOCKET, RESOURCE)
        assert req.options.get_preferred_allocation_available
        channel, stub = kubelet.plugin()
        async with channel:
            stream = stub.ListAndWatch(api_pb2.Empty())
            first = await stream.read()
            assert [(d.ID, d.health) for d in first.devices][:2] == [
                ("GPU-a::0", "Healthy"), ("GPU-a::1", "Healthy")]  # fmt: skip
            assert len(first.devices) == 6
            await plugin.update([GpuBlocks("GPU-a", 3, False), GPUS[1]])  # an XID on GPU a
            second = await stream.read()
            assert {d.health for d in second.devices if d.ID.startswith("GPU-a")} == {"Unhealthy"}
            assert {d.health for d in second.devices if d.ID.startswith("GPU-b")} == {"Healthy"}
            await plugin.update(GPUS)  # recovered, with no restart
            third = await stream.read()
            assert {d.health for d in third.devices} == {"Healthy"}
            stream.cancel()
        await kubelet.restart()
        await until(lambda: len(kubelet.registered) == 2 and server.registrations == 2)
        channel, stub = kubelet.plugin()
        async with channel:
            options = await stub.GetDevicePluginOptions(api_pb2.Empty())
            assert options.get_preferred_allocation_available
    finally:
        stop.set()
        await task
        await kubelet.server.stop(grace=0)


async def test_each_pod_bound_at_once_gets_the_gpu_the_extender_chose(folder: Path) -> None:
    assigned = [  # two one-block pods bound to this node together, to different GPUs
        Assigned("uid-2", "default", "second", "GPU-a", 1, 200.0, "Pending"),
        Assigned("uid-1", "default", "first", "GPU-b", 1, 100.0, "Pending"),
        Assigned("uid-0", "default", "running", "GPU-a", 1, 50.0, "Running"),
    ]

    async def lookup() -> list[Assigned] | None:
        return assigned

    plugin = BlockPlugin(lookup, lambda: 4096)
    await plugin.update(GPUS)
    kubelet, _, (stop, task) = await _serving(folder, plugin)
    try:
        channel, stub = kubelet.plugin()
        async with channel:
            got = []
            for _ in range(2):  # kubelet admits one pod at a time: the oldest assigned first
                available = [d.ID for d in plugin.devices()]
                pref = await stub.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(
                    container_requests=[api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available, allocation_size=1)]))  # fmt: skip
                ids = list(pref.container_responses[0].deviceIDs)
                resp = await stub.Allocate(api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]))  # fmt: skip
                got.append(dict(resp.container_responses[0].envs))
            assert [g["NVIDIA_VISIBLE_DEVICES"] for g in got] == ["GPU-b", "GPU-a"]
            assert got[0]["EDGEGPU_MEM_LIMIT_MIB"] == "4096"
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Allocate(api_pb2.AllocateRequest(container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=["GPU-a::0", "GPU-b::0"])]))  # fmt: skip
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "one GPU" in str(refused.value.details())
    finally:
        stop.set()
        await task
        await kubelet.server.stop(grace=0)


def test_preferred_blocks_stay_on_one_gpu() -> None:
    available = ["A::0", "A::1", "B::0", "B::1", "B::2"]
    assert preferred(available, [], 2, "B") == ["B::0", "B::1"]
    assert preferred(available, [], 3, "A") == ["B::0", "B::1", "B::2"]  # A has no room
    assert preferred(available, [], 2, None) == ["A::0", "A::1"]  # the tightest fit
    assert preferred(available, ["B::2"], 2, "A") == ["B::2", "B::0"]  # kubelet's must first
    assert preferred(available, [], 4, None) == ["A::0", "A::1", "B::0", "B::1"]


async def test_the_agent_tells_the_plugin_its_blocks_and_the_extender_its_assignments(
    folder: Path,
) -> None:
    """The agent's round feeds the plugin (an XID makes a GPU's blocks Unhealthy), and its
    lookup reads ``/v1/nodes/{node}/assignments`` from the real extender app."""
    clock = [1000.0]
    app = create_app()
    state = app.state.ctx.state
    state.ingest(report_from(report("n1", [gpu(0, uuid="GPU-x"), gpu(1, uuid="GPU-y")])))
    state.assign(Assignment("uid-p", "default", "p", "n1", (1,), ("GPU-y",), 2, False,
                            QosClass.INFERENCE, None, 5.0), authoritative=True)  # fmt: skip
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://extender") as client:
        pusher = Pusher(["http://extender"], client, clock=lambda: clock[0])
        backend = SimulatedBackend(clock=lambda: clock[0], gpus=2, node="n1", scenario="xid-79",
                                   scenario_after_s=0.0, model="Tesla T4")  # fmt: skip
        backend.open()
        agent = Agent(backend, node="n1", interval_s=1.0,
                      metrics=AgentMetrics(CollectorRegistry(), "n1"), health_args=HealthArgs(),
                      power_args=PowerArgs(), clock=lambda: clock[0])  # fmt: skip
        agent.blocks.plugin = BlockPlugin(pusher.assignments("n1"), lambda: agent.blocks.block_mib)
        clock[0] += 1.0
        await agent.round()
        devices = agent.blocks.plugin.devices()
        assert len(devices) == 2 * (15360 // 4096)
        assert {d.health for d in devices[:3]} == {"Unhealthy"}  # GPU 0 raised XID 79
        assert {d.health for d in devices[3:]} == {"Healthy"}
        (found,) = await pusher.assignments("n1")() or []
        assert (found.name, found.gpu_uuid, found.blocks, found.phase) == ("p", "GPU-y", 2, None)
        other = httpx.ASGITransport(app=app, client=("10.1.2.3", 1))
        async with httpx.AsyncClient(transport=other, base_url="http://extender") as remote:
            refused = await remote.get("/v1/nodes/n1/assignments")
            assert refused.status_code == 403  # no agent authentication: loopback only


async def test_the_plugin_advertises_the_blocks_the_extender_lends_while_it_lends_them(
    tmp_path: Path,
) -> None:
    """memory.idleRelease: the push answer's ``lend_blocks`` become extra devices of that GPU
    (``<uuid>::lent-<k>``), so kubelet's count lets best-effort borrowers in; they go when the
    extender no longer lends them."""
    fake = FakeClock()
    clock = [1000.0]
    policy = parse_policy({"spec": {"remediation": {"enabled": True, "dryRun": False},
                                    "memory": {"idleRelease": {"enabled": True, "after": "5m"}}}})  # fmt: skip
    app = create_app(clock=fake, policy=policy)
    state = app.state.ctx.state
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://extender") as client:
        pusher = Pusher(["http://extender"], client, clock=lambda: clock[0])
        procs = tmp_path / "processes.json"
        procs.write_text('{"1": [{"pod_uid": "uid-p", "used_mib": 1000}]}')
        backend = SimulatedBackend(clock=lambda: clock[0], gpus=2, node="n1", load_pct=0.0,
                                   model="Tesla T4", pod_processes=procs)  # fmt: skip
        backend.open()
        agent = Agent(backend, node="n1", interval_s=1.0, pusher=pusher,
                      metrics=AgentMetrics(CollectorRegistry(), "n1"), health_args=HealthArgs(),
                      power_args=PowerArgs(), clock=lambda: clock[0])  # fmt: skip
        agent.blocks.plugin = BlockPlugin(pusher.assignments("n1"), lambda: agent.blocks.block_mib)

        async def lent_devices() -> list[str]:
            clock[0] += 1.0
            fake.advance(1.0)
            await agent.round()
            assert agent.blocks.plugin is not None
            return [d.ID for d in agent.blocks.plugin.devices() if "::lent-" in d.ID]

        await lent_devices()
        (uuid,) = state.gpu_uuids("n1", [1])
        state.assign(Assignment("uid-p", "default", "p", "n1", (1,), (uuid,), 2, False,
                                QosClass.INFERENCE, None, 5.0), authoritative=True)  # fmt: skip
        assert await lent_devices() == []  # idle (1000 of 8192 MiB), not for 5 minutes yet
        fake.advance(300.0)
        # The answer lends 1 block (8192 - 1000 MiB idle): kubelet hears it in the same round.
        assert await lent_devices() == [f"{uuid}::lent-0"]
        assert len(agent.blocks.plugin.devices()) == 2 * 3 + 1
        procs.write_text('{"1": [{"pod_uid": "uid-p", "used_mib": 7000}]}')  # busy again
        assert await lent_devices() == []


def test_the_generated_modules_are_those_of_the_proto(tmp_path: Path) -> None:
    """``make proto`` was run after the last change to api.proto."""
    from grpc_tools import protoc

    root = Path(__file__).resolve().parents[2]
    protos = ["node_agent/deviceplugin/api.proto", "node_agent/deviceplugin/podresources.proto"]
    assert protoc.main(["protoc", f"-I{root}", f"--python_out={tmp_path}",
                        f"--grpc_python_out={tmp_path}", *(str(root / p) for p in protos)]) == 0  # fmt: skip
    for name in (
        "api_pb2.py",
        "api_pb2_grpc.py",
        "podresources_pb2.py",
        "podresources_pb2_grpc.py",
    ):
        fresh = (tmp_path / "node_agent" / "deviceplugin" / name).read_text()
        assert fresh == (root / "node_agent" / "deviceplugin" / name).read_text(), name


async def test_a_lost_nvidia_gpu_keeps_its_blocks_unhealthy(
    tmp_path: Path,
) -> None:
    from node_agent.backends.nvml import NvmlBackend
    from tests.fakes.fake_pynvml import FakeGpu, FakePynvml

    for dev in ("nvidiactl", "nvidia0", "nvidia1"):
        (tmp_path / dev).touch()
    fake = FakePynvml([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")])
    nvml = NvmlBackend(module=fake, dev_root=tmp_path)
    agent = Agent(nvml, node="n1", interval_s=1.0, metrics=AgentMetrics(CollectorRegistry(), "n1"),
                  health_args=HealthArgs(), power_args=PowerArgs(), dry_run=True)  # fmt: skip
    nvml.open()
    agent.blocks.plugin = BlockPlugin(_nothing, lambda: agent.blocks.block_mib)
    await agent.round()
    before = [(d.ID, d.health) for d in agent.blocks.plugin.devices()]
    fake.gpus[1].lost = True
    await agent.round()
    after = {d.ID: d.health for d in agent.blocks.plugin.devices()}
    assert set(after) == {i for i, _ in before}  # the same devices: none vanished
    assert {h for i, h in after.items() if i.startswith("GPU-b::")} == {"Unhealthy"}
    assert {h for i, h in after.items() if i.startswith("GPU-a::")} == {"Healthy"}


@pytest.mark.parametrize(
    ("model", "nodes"),
    [
        ("AMD Instinct MI210", ["/dev/kfd", "/dev/dri/card1", "/dev/dri/renderD128"]),
        ("Intel Data Center GPU Flex 170", ["/dev/dri/card1", "/dev/dri/renderD128"]),
    ],
)
async def test_amd_and_intel_gpus_give_the_container_their_device_nodes(
    tmp_path: Path, model: str, nodes: list[str]
) -> None:
    backend = SimulatedBackend(clock=lambda: 0.0, gpus=2, node="n2", model=model, load_pct=0.0)
    backend.open()
    agent = Agent(backend, node="n2", interval_s=1.0, metrics=AgentMetrics(CollectorRegistry(), "n2"),
                  health_args=HealthArgs(), power_args=PowerArgs(), dry_run=True)  # fmt: skip
    agent.blocks.sys_root = tmp_path / "sys"
    uuid = backend.read(0).uuid

    async def lookup() -> list[Assigned] | None:
        return [Assigned("uid-p", "default", "p", uuid, 2, 1.0, "Pending")]

    agent.blocks.plugin = BlockPlugin(lookup, lambda: 4096)
    await agent.round()
    # Without its device nodes in sysfs a GPU offers no blocks: the container could not use it.
    assert agent.blocks.plugin.devices() == []
    drm = agent.blocks.sys_root / "bus/pci/devices/0000:01:00.0/drm"  # GPU 0's PCI address
    for name in ("card1", "renderD128", "version"):
        (drm / name).mkdir(parents=True)
    await agent.round()
    ids = [d.ID for d in agent.blocks.plugin.devices()]
    assert ids and {gpu_of(i) for i in ids} == {uuid}
    answer = await agent.blocks.plugin.Allocate(
        api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=ids[:2])]), Context())  # fmt: skip
    (resp,) = answer.container_responses
    assert [(d.host_path, d.container_path, d.permissions) for d in resp.devices] == [
        (n, n, "rw") for n in nodes
    ]
    assert dict(resp.envs) == {"EDGEGPU_GPU_UUID": uuid, "EDGEGPU_MEM_LIMIT_MIB": "8192"}


async def test_each_container_of_a_pod_is_matched_once() -> None:
    assigned = [
        Assigned("uid-two", "default", "two", "GPU-b", 2, 100.0, "Pending", (1, 1)),
        Assigned("uid-one", "default", "one", "GPU-a", 1, 200.0, "Pending"),
    ]

    async def lookup() -> list[Assigned] | None:
        return assigned

    plugin = BlockPlugin(lookup, lambda: 4096)
    await plugin.update(GPUS)
    got = []
    for _ in range(3):
        request = api_pb2.PreferredAllocationRequest(container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=[d.ID for d in plugin.devices()], allocation_size=1)])  # fmt: skip
        resp = await plugin.GetPreferredAllocation(request, None)
        got.append(resp.container_responses[0].deviceIDs[0].split("::")[0])
    assert got == ["GPU-b", "GPU-b", "GPU-a"]  # both containers of "two", then "one"


class PodResources(podresources_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """kubelet's PodResources List at the gRPC boundary: the containers given devices."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, list[str]]] = {}

    async def List(self, request: Any, context: Any) -> Any:
        return podresources_pb2.ListPodResourcesResponse(pod_resources=[
            podresources_pb2.PodResources(namespace=ns, name=name, containers=[
                podresources_pb2.ContainerResources(name=c, devices=[
                    podresources_pb2.ContainerDevices(resource_name=RESOURCE, device_ids=ids)])
                for c, ids in containers.items()])
            for (ns, name), containers in self.pods.items()])  # fmt: skip

    @contextlib.asynccontextmanager
    async def serving(self, socket: Path) -> AsyncIterator[None]:
        """Served on the unix ``socket`` while the block runs."""
        server = grpc.aio.server()
        podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{socket}")
        await server.start()
        try:
            yield
        finally:
            await server.stop(None)


async def test_after_an_agent_restart_kubelets_record_keeps_a_matched_pod_from_matching_again(
    tmp_path: Path,
) -> None:
    # "first" was admitted before the restart, and still starts (Pending); "second" came after
    # it. The restarted plugin has no memory of matching "first": kubelet's record tells it.
    lookup = _bound(Assigned("uid-1", "default", "first", "GPU-a", 1, 100.0, "Pending"),
                    Assigned("uid-2", "default", "second", "GPU-b", 1, 200.0, "Pending"))  # fmt: skip
    kubelet = PodResources()
    kubelet.pods[("default", "first")] = {"app": ["GPU-a::0"]}
    socket = tmp_path / "pod-resources.sock"
    async with kubelet.serving(socket):
        for held, want in ((holders(socket, RESOURCE), "GPU-b"), (None, "GPU-a")):
            plugin = BlockPlugin(lookup, lambda: 4096, held=held)  # a fresh start each time
            await plugin.update(GPUS)
            request = api_pb2.PreferredAllocationRequest(container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=[d.ID for d in plugin.devices()], allocation_size=1)])  # fmt: skip
            resp = await plugin.GetPreferredAllocation(request, None)
            assert resp.container_responses[0].deviceIDs[0].split("::")[0] == want
    # kubelet out of reach: matched by the extender's assignments alone, as before.
    assert await holders(tmp_path / "none.sock", RESOURCE)() is None


async def test_the_pod_kubelet_admits_gets_its_gpu_though_an_older_pod_of_that_size_waits(
    tmp_path: Path,
) -> None:
    # Both bound within a moment; kubelet admits "second" first (its bind was written first).
    # kubelet lists a pod from the start of its admission, before it has devices.
    lookup = _bound(Assigned("uid-1", "default", "first", "GPU-a", 1, 100.0, "Pending"),
                    Assigned("uid-2", "default", "second", "GPU-b", 1, 100.1, "Pending"))  # fmt: skip
    kubelet = PodResources()
    kubelet.pods[("default", "second")] = {"app": []}
    socket = tmp_path / "pod-resources.sock"
    async with kubelet.serving(socket):
        plugin = BlockPlugin(lookup, lambda: 4096, held=holders(socket, RESOURCE))
        await plugin.update(GPUS)
        pref = await plugin.GetPreferredAllocation(_prefer(plugin, 1), Context())
        ids = list(pref.container_responses[0].deviceIDs)
        assert gpu_of(ids[0]) == "GPU-b"
        answer = await plugin.Allocate(_allocate(*ids), Context())
        assert answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
        kubelet.pods[("default", "second")] = {"app": ids}
        kubelet.pods[("default", "first")] = {"app": []}
        pref = await plugin.GetPreferredAllocation(_prefer(plugin, 1), Context())
        assert gpu_of(pref.container_responses[0].deviceIDs[0]) == "GPU-a"


async def test_a_pod_kubelet_has_listed_for_long_without_blocks_is_not_taken_for_the_one_admitted(
    tmp_path: Path,
) -> None:
    # "stuck" holds its GPU on an init container (kubelet's list leaves those out) and stays
    # Pending: listed without blocks long before "new" comes, it is not the pod admitted now.
    lookup = _bound(Assigned("uid-1", "default", "stuck", "GPU-a", 1, 100.0, "Pending"),
                    Assigned("uid-2", "default", "new", "GPU-b", 1, 200.0, "Pending"))  # fmt: skip
    now = [1000.0]
    kubelet = PodResources()
    kubelet.pods[("default", "stuck")] = {"app": []}
    socket = tmp_path / "pod-resources.sock"
    async with kubelet.serving(socket):
        plugin = BlockPlugin(lookup, lambda: 4096, clock=lambda: now[0],
                             held=holders(socket, RESOURCE))  # fmt: skip
        await plugin.update(GPUS)
        await plugin.GetPreferredAllocation(_prefer(plugin, 3), Context())  # another admission
        now[0] += 600.0
        kubelet.pods[("default", "new")] = {"app": []}
        pref = await plugin.GetPreferredAllocation(_prefer(plugin, 1), Context())
        assert gpu_of(pref.container_responses[0].deviceIDs[0]) == "GPU-b"


async def test_the_agent_reports_which_gpus_blocks_each_pod_holds_as_kubelet_says(
    tmp_path: Path,
) -> None:
    backend = SimulatedBackend(clock=time.monotonic, gpus=2, node="n1")
    backend.open()
    agent = Agent(backend, node="n1", interval_s=1.0,
                  metrics=AgentMetrics(CollectorRegistry(), "n1"), health_args=HealthArgs(),
                  power_args=PowerArgs())  # fmt: skip
    a, b = (backend.read(i).uuid for i in range(2))
    kubelet = PodResources()
    # An init container's blocks are given again to the app container: counted once.
    kubelet.pods[("default", "web-0")] = {"init": [f"{b}::0", f"{b}::1"],
                                          "app": [f"{b}::0", f"{b}::1"]}  # fmt: skip
    kubelet.pods[("batch", "borrower")] = {"app": [f"{a}::lent-0", f"{a}::2"]}
    kubelet.pods[("batch", "split")] = {"one": [f"{a}::0"], "two": [f"{b}::2"]}
    socket = tmp_path / "pod-resources.sock"
    agent.blocks.pod_devices = pod_devices(socket, RESOURCE)
    # No device plugin on this node: kubelet is not asked, and nothing is known.
    assert (await agent.round()).report.holders is None
    agent.blocks.plugin = BlockPlugin(_nothing, lambda: agent.blocks.block_mib)
    async with kubelet.serving(socket):
        report = (await agent.round()).report
    assert [(h.namespace, h.name, h.gpu_uuid, h.blocks) for h in report.holders or ()] == [
        ("batch", "borrower", a, 2),
        ("batch", "split", a, 1),
        ("batch", "split", b, 1),
        ("default", "web-0", b, 2),
    ]
    # What the agent sends is what the extender decodes.
    decoded = report_from(report.model_dump(mode="json", by_alias=True)).holders or ()
    assert [(h.namespace, h.name, h.gpu_uuid, h.blocks) for h in decoded] == [
        (h.namespace, h.name, h.gpu_uuid, h.blocks) for h in report.holders or ()
    ]
    # kubelet out of reach: not known (null), never an empty list that says "nobody".
    assert (await agent.round()).report.holders is None


def test_a_holder_the_contract_refuses_is_left_out_not_the_report() -> None:
    backend = SimulatedBackend(clock=time.monotonic, gpus=1, node="n1")
    backend.open()
    agent = Agent(backend, node="n1", interval_s=1.0,
                  metrics=AgentMetrics(CollectorRegistry(), "n1"), health_args=HealthArgs(),
                  power_args=PowerArgs())  # fmt: skip
    snap = agent.sample()
    healths, _ = agent.protection.decide(snap)
    uuid = snap.readings[0].uuid
    agent.blocks.holders = [GpuHolder("default", "ok", uuid, 1), GpuHolder("default", "bad\x1b", uuid, 1),
                     GpuHolder("default", "none", uuid, 0)]  # fmt: skip
    report = agent.build_report(snap, healths)
    assert [h.name for h in report.holders or ()] == ["ok"]
    agent.blocks.holders = [
        GpuHolder("default", f"p{i}", uuid, 1) for i in range(MAX_HOLDERS_PER_NODE + 5)
    ]
    assert len(agent.build_report(snap, healths).holders or ()) == MAX_HOLDERS_PER_NODE


async def test_a_lookup_that_hangs_does_not_hold_kubelet_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from node_agent.deviceplugin import plugin as module

    async def hangs() -> list[Assigned] | None:
        await asyncio.sleep(3600)
        return []

    monkeypatch.setattr(module, "LOOKUP_TIMEOUT_S", 0.05)
    plugin = BlockPlugin(hangs, lambda: 4096)
    await plugin.update(GPUS)
    request = api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=[d.ID for d in plugin.devices()], allocation_size=2)])  # fmt: skip
    resp = await asyncio.wait_for(plugin.GetPreferredAllocation(request, None), 5.0)
    assert len(resp.container_responses[0].deviceIDs) == 2


async def test_a_socket_it_cannot_serve_does_not_end_the_agent(tmp_path: Path) -> None:
    long = tmp_path / ("x" * 120)  # past the 107 characters a unix socket path may have
    long.mkdir()
    kubelet = Kubelet(tmp_path)  # kubelet.sock in a short path, our socket in the long one
    (long / "kubelet.sock").symlink_to(tmp_path / "kubelet.sock")
    await kubelet.start()
    server = DevicePluginServer(BlockPlugin(_nothing, lambda: 4096), long, poll_s=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    await asyncio.sleep(0.3)
    assert not task.done()  # it logs and tries again; the agent goes on
    stop.set()
    await asyncio.wait_for(task, 10.0)
    await kubelet.server.stop(grace=0)


async def test_an_agent_sees_the_assignments_of_its_own_node_only(tmp_path: Path) -> None:
    from scheduler_extender.k8s.auth import StaticTokenAuth

    tokens = tmp_path / "tokens"
    tokens.write_text("token-n1 n1\n")
    app = create_app(auth=StaticTokenAuth(tokens))
    transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://extender") as client:
        mine = await client.get("/v1/nodes/n1/assignments",
                                headers={"authorization": "Bearer token-n1"})  # fmt: skip
        theirs = await client.get("/v1/nodes/n2/assignments",
                                  headers={"authorization": "Bearer token-n1"})  # fmt: skip
        nobody = await client.get("/v1/nodes/n1/assignments")
    assert mine.status_code == 200 and mine.json()["assignments"] == []
    assert theirs.status_code == 403 and "n1" in theirs.json()["error"]
    assert nobody.status_code == 401


async def test_a_slow_driver_read_does_not_hold_up_kubelets_calls() -> None:
    import time

    class Slow(SimulatedBackend):
        def read(self, index: int):  # type: ignore[no-untyped-def]
            time.sleep(0.5)  # a driver call that takes its time
            return super().read(index)

    backend = Slow(clock=time.monotonic, gpus=1, node="n1")
    backend.open()
    agent = Agent(backend, node="n1", interval_s=1.0, metrics=AgentMetrics(CollectorRegistry(), "n1"),
                  health_args=HealthArgs(), power_args=PowerArgs(), dry_run=True)  # fmt: skip
    agent.blocks.plugin = BlockPlugin(_nothing, lambda: 4096)
    await agent.blocks.plugin.update(GPUS)
    sampling = asyncio.create_task(agent.round())
    await asyncio.sleep(0.05)
    request = api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=[d.ID for d in agent.blocks.plugin.devices()], allocation_size=1)])  # fmt: skip
    started = time.monotonic()
    await agent.blocks.plugin.GetPreferredAllocation(request, None)
    assert time.monotonic() - started < 0.3 and not sampling.done()
    await sampling


def _allocate(*ids: str) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(ids))]
    )


def _prefer(plugin: BlockPlugin, size: int) -> api_pb2.PreferredAllocationRequest:
    return api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=[d.ID for d in plugin.devices()], allocation_size=size)])  # fmt: skip


def _bound(*pods: Assigned) -> Any:
    async def lookup() -> list[Assigned] | None:
        return list(pods)

    return lookup


async def _no_extender() -> list[Assigned] | None:
    return None


@pytest.mark.parametrize(
    ("ids", "why"),
    [
        (["all::0"], "not devices this plugin advertised: all::0"),
        (["GPU-a::3"], "not devices this plugin advertised: GPU-a::3"),  # GPU-a has 3 blocks
        (["GPU-a::0"] * 10_000, "10000 device IDs, more than the 6 advertised"),
        (["GPU-a::0", "GPU-a::1", "GPU-a::0"], "device IDs given more than once"),
        ([], "no device IDs"),
    ],
)
async def test_allocate_refuses_device_ids_it_never_advertised_or_given_twice(
    ids: list[str], why: str
) -> None:
    plugin = BlockPlugin(_bound(Assigned("u", "default", "p", "GPU-a", 1, 1.0, "Pending")),
                         lambda: 4096)  # fmt: skip
    await plugin.update(GPUS)
    with pytest.raises(Refused) as refused:
        await plugin.Allocate(_allocate(*ids), Context())
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert why in refused.value.details


async def test_allocate_refuses_blocks_of_another_gpu_than_the_one_chosen_at_bind() -> None:
    plugin = BlockPlugin(_bound(Assigned("u", "ns", "p", "GPU-b", 2, 1.0, "Pending")), lambda: 4096)
    await plugin.update(GPUS)
    with pytest.raises(Refused) as refused:
        await plugin.Allocate(_allocate("GPU-a::0", "GPU-a::1"), Context())
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details == (
        "pod ns/p (container 0) was bound to GPU GPU-b, but kubelet chose 2 blocks of GPU GPU-a"
    )


async def test_allocate_checks_the_pod_the_preferred_allocation_was_made_for() -> None:
    """kubelet asks for a preferred allocation, then allocates for the same container: the
    blocks it chose must be on that pod's GPU, even where another pending pod's GPU has them."""
    plugin = BlockPlugin(_bound(Assigned("u1", "ns", "first", "GPU-b", 1, 1.0, "Pending"),
                                Assigned("u2", "ns", "second", "GPU-a", 1, 2.0, "Pending")),
                         lambda: 4096)  # fmt: skip
    await plugin.update(GPUS)
    pref = await plugin.GetPreferredAllocation(_prefer(plugin, 1), Context())
    assert gpu_of(pref.container_responses[0].deviceIDs[0]) == "GPU-b"
    with pytest.raises(Refused) as refused:  # kubelet filled it from GPU-a all the same
        await plugin.Allocate(_allocate("GPU-a::0"), Context())
    assert "pod ns/first" in refused.value.details
    # The next pod is matched on its own and gets its GPU.
    await plugin.GetPreferredAllocation(_prefer(plugin, 1), Context())
    answer = await plugin.Allocate(_allocate("GPU-a::0"), Context())
    assert answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"


@pytest.mark.parametrize(
    ("lookup", "code", "why"),
    [
        (_no_extender, grpc.StatusCode.UNAVAILABLE, "no extender answered"),
        (_nothing, grpc.StatusCode.FAILED_PRECONDITION,
         "no pod bound here by the extender waits for a container of 2 blocks"),
        (_bound(Assigned("u", "ns", "p", "GPU-a", 1, 1.0, "Pending")),
         grpc.StatusCode.FAILED_PRECONDITION, "waits for a container of 2 blocks"),
        (_bound(Assigned("u", "ns", "p", "GPU-a", 2, 1.0, "Running")),
         grpc.StatusCode.FAILED_PRECONDITION, "waits for a container of 2 blocks"),
    ],
)  # fmt: skip
async def test_allocate_fails_rather_than_guess_when_the_gpu_chosen_at_bind_is_not_known(
    lookup: Any, code: grpc.StatusCode, why: str
) -> None:
    plugin = BlockPlugin(lookup, lambda: 4096)
    await plugin.update(GPUS)
    await plugin.GetPreferredAllocation(_prefer(plugin, 2), Context())  # no GPU to steer to
    with pytest.raises(Refused) as refused:
        await plugin.Allocate(_allocate("GPU-a::0", "GPU-a::1"), Context())
    assert refused.value.code == code
    assert why in refused.value.details and "not given on a guess" in refused.value.details


async def test_allocate_asks_again_for_a_pod_the_extenders_watch_has_not_seen_yet() -> None:
    """A pod given its node by hand (or bound by another replica) is listed once the extenders'
    watch sees it: Allocate asks again for a while before it refuses."""
    answers: list[list[Assigned]] = [[], [], [Assigned("u", "ns", "p", "GPU-a", 2, 1.0, "Pending")]]

    async def late() -> list[Assigned] | None:
        return answers.pop(0) if len(answers) > 1 else answers[0]

    plugin = BlockPlugin(late, lambda: 4096, settle_s=0.2)
    await plugin.update(GPUS)
    answer = await plugin.Allocate(_allocate("GPU-a::0", "GPU-a::1"), Context())
    assert answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    gone = BlockPlugin(_nothing, lambda: 4096, settle_s=0.2)
    await gone.update(GPUS)
    with pytest.raises(Refused):  # one that never shows up is still refused
        await gone.Allocate(_allocate("GPU-a::0", "GPU-a::1"), Context())


async def test_an_init_containers_blocks_given_again_to_the_app_container_are_allowed() -> None:
    """kubelet reuses an init container's devices for the app container with no preferred
    allocation before; blocks never given are matched to a pod as ever."""
    plugin = BlockPlugin(_bound(Assigned("u", "ns", "p", "GPU-b", 2, 1.0, "Pending")), lambda: 4096)
    await plugin.update(GPUS)
    await plugin.GetPreferredAllocation(_prefer(plugin, 2), Context())
    await plugin.Allocate(_allocate("GPU-b::0", "GPU-b::1"), Context())  # the init container
    again = await plugin.Allocate(_allocate("GPU-b::0", "GPU-b::1"), Context())  # the app's
    assert again.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
    with pytest.raises(Refused):
        await plugin.Allocate(_allocate("GPU-b::2"), Context())


def test_preferred_allocation_is_linear_in_the_number_of_device_ids() -> None:
    import time

    # 64 GPUs of 1,000 blocks, and a request no one GPU can hold: filled from every GPU.
    available = [f"GPU-{g}::{k}" for g in range(64) for k in range(1000)]
    started = time.perf_counter()
    chosen = preferred(available, [], 32_000, "GPU-3")
    assert time.perf_counter() - started < 1.0  # the quadratic fill took minutes
    assert len(chosen) == len(set(chosen)) == 32_000


async def test_a_preferred_allocation_request_naming_more_ids_than_the_cap_is_refused() -> None:
    from node_agent.deviceplugin.plugin import MAX_REQUEST_IDS

    plugin = BlockPlugin(_nothing, lambda: 4096)
    await plugin.update(GPUS)
    request = api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=["GPU-a::0"] * MAX_REQUEST_IDS,
            must_include_deviceIDs=["GPU-a::0"], allocation_size=1)])  # fmt: skip
    with pytest.raises(Refused) as refused:
        await plugin.GetPreferredAllocation(request, Context())
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_the_first_list_and_watch_answer_waits_for_the_first_sample() -> None:
    plugin = BlockPlugin(_nothing, lambda: 4096)
    stream = plugin.ListAndWatch(api_pb2.Empty(), Context())
    first = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    assert not first.done()  # kubelet is told nothing rather than "no devices"
    await plugin.update(GPUS)  # the agent's first round
    assert len((await asyncio.wait_for(first, 5.0)).devices) == 6
    await stream.aclose()
    empty = BlockPlugin(_nothing, lambda: 4096)
    stream = empty.ListAndWatch(api_pb2.Empty(), Context())
    await empty.update([])  # a node whose first sample found no GPU is told so
    assert list((await asyncio.wait_for(anext(stream), 5.0)).devices) == []
    await stream.aclose()


async def test_the_assignments_of_every_replica_are_merged_and_a_silent_one_costs_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The replica that bound a pod lists it at once; another learns of it by its watch. A
    replica that does not answer in time leaves the others' answers."""
    from node_agent.uplink import assignments

    monkeypatch.setattr(assignments, "ASSIGNMENTS_TIMEOUT_S", 0.1)

    def row(uid: str, gpu_uuid: str) -> dict[str, Any]:
        return {"uid": uid, "namespace": "ns", "name": uid, "gpu_uuids": [gpu_uuid], "blocks": 1,
                "assigned_at": 1.0, "phase": "Pending", "containers": [1]}  # fmt: skip

    listed = {"a": [row("old", "GPU-a")], "b": [row("old", "GPU-a"), row("new", "GPU-b")]}

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "c":
            await asyncio.sleep(10)  # a replica out of reach, its packets dropped
        return httpx.Response(200, json={"assignments": listed[request.url.host]})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        pusher = Pusher(["http://a", "http://b", "http://c"], client, clock=lambda: 0.0)
        found = await asyncio.wait_for(pusher.assignments("n1")(), 5.0)
        assert sorted((a.uid, a.gpu_uuid) for a in found or []) == [
            ("new", "GPU-b"), ("old", "GPU-a")]  # fmt: skip
        only = Pusher(["http://c"], client, clock=lambda: 0.0)
        assert await asyncio.wait_for(only.assignments("n1")(), 5.0) is None
