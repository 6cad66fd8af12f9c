"""The node agent trusts nothing it cannot check: push answers, reboot asks, kubelet's requests,
and the extender's certificate, each tried as an attacker would send them.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client import CollectorRegistry

from node_agent.backends.simulated import SimulatedBackend
from node_agent.cli import command_line, extender_ca, extender_client, extender_pusher
from node_agent.config import AgentSettings
from node_agent.deviceplugin import api_pb2
from node_agent.deviceplugin.devices import Assigned, GpuBlocks
from node_agent.deviceplugin.plugin import BlockPlugin
from node_agent.loop import Agent
from node_agent.protection.health import HealthArgs
from node_agent.protection.power import PowerArgs
from node_agent.telemetry.exporter import AgentMetrics
from node_agent.uplink.answer import read_answer
from node_agent.uplink.pusher import Pusher
from node_agent.uplink.replicas import MAX_ANSWER_BYTES
from tests.agent.test_device_plugin import Context, Refused

NAN_ANSWER = b'{"accepted": true, "max_temp_c": NaN}'


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


Handler = Callable[[httpx.Request], httpx.Response]


def answering(*bodies: dict[str, Any] | bytes) -> Handler:
    """A replica that answers every push with ``bodies`` in turn, then the last one again."""
    left = list(bodies)

    def handler(request: httpx.Request) -> httpx.Response:
        body = left.pop(0) if len(left) > 1 else left[0]
        if isinstance(body, bytes):
            return httpx.Response(200, content=body)
        return httpx.Response(200, json=body)

    return handler


def make_agent(
    client: httpx.AsyncClient,
    clock: Clock,
    urls: tuple[str, ...] = ("http://x",),
    **kw: Any,
) -> Agent:
    backend = SimulatedBackend(clock=clock, gpus=2, seed=1, node="n1")
    backend.open()
    power_args = kw.pop("power_args", PowerArgs())
    return Agent(
        backend,
        node="n1",
        interval_s=1.0,
        metrics=AgentMetrics(CollectorRegistry(), "n1"),
        health_args=HealthArgs(max_temp_c=power_args.max_temp_c),
        power_args=power_args,
        pusher=Pusher(list(urls), client, clock=clock, base_backoff_s=0.5, max_backoff_s=0.5),
        clock=clock,
        dry_run=True,
        **kw,
    )


def ignored(agent: Agent, field: str, reason: str = "invalid") -> float:
    """How many times the agent counted ``field`` of an answer as not taken, for ``reason``."""
    value = agent.metrics.registry.get_sample_value(
        "edgegpu_agent_answer_fields_ignored_total", {"field": field, "reason": reason}
    )
    return value or 0.0


def protection(agent: Agent) -> tuple[float, float, bool, float]:
    """maxTemp, cool-down, power saving and its threshold, as local protection follows them."""
    p = agent.protection.power_args
    return p.max_temp_c, p.cool_down_s, p.saving_enabled, p.threshold_pct


async def rounds(agent: Agent, clock: Clock, n: int) -> list[dict[str, str]]:
    out = []
    for _ in range(n):
        clock.t += 1.0
        result = await agent.round()
        assert result.push is not None
        out.append(dict(result.push.results))
    return out


# -- one field of an answer cannot silence the agent ------------------------------------------
@pytest.mark.parametrize(
    "answer",
    [{"accepted": True, "max_temp_c": 1000}, {"accepted": True, "max_temp_c": -100},
     NAN_ANSWER, {"accepted": True, "max_temp_c": "hot"}, b'{"max_temp_c": 1e999}'],
    ids=["1000", "-100", "nan", "text", "infinite"],
)  # fmt: skip
async def test_an_impossible_max_temp_in_an_answer_is_ignored_counted_and_pushing_goes_on(
    answer: dict[str, Any] | bytes,
) -> None:
    clock = Clock()
    async with httpx.AsyncClient(transport=httpx.MockTransport(answering(answer))) as client:
        agent = make_agent(client, clock)
        results = await rounds(agent, clock, 3)
    assert results == [{"http://x": "ok"}] * 3  # the agent's own reports stay valid
    assert agent.reporter.hot_threshold_c == 85.0
    assert ignored(agent, "max_temp_c") == 3.0


async def test_a_replica_answering_nonsense_does_not_silence_the_agent_beside_a_sane_one() -> None:
    clock = Clock()
    answers = {"a": {"accepted": True, "max_temp_c": -100}, "b": {"accepted": True,
                                                                  "max_temp_c": 80.0}}  # fmt: skip

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answers[request.url.host])

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        agent = make_agent(client, clock, ("http://a", "http://b"))
        results = await rounds(agent, clock, 3)
    assert results == [{"http://a": "ok", "http://b": "ok"}] * 3
    assert agent.reporter.hot_threshold_c == 80.0  # the least valid maxTemp, not the nonsense


async def test_each_bad_field_of_an_answer_is_ignored_and_counted_while_the_rest_applies() -> None:
    clock = Clock()
    answer = {
        "accepted": "yes",
        "performance_gpus": [1, "0", -1, True, 10**6],
        "max_temp_c": 80.0,
        "policy": {
            "max_temp_c": 1000,
            "cool_down_s": 600,
            "power_saving": "no",
            "power_saving_threshold_pct": 90,
            "memory_block_mib": 16,
        },
        "lend_blocks": {"GPU-x": 2, "GPU-y": 10**9, "GPU-\n": 1, "GPU-z": True},
        "self_test": {"id": "has space"},
        "reboot": 5,
        "something_new": {"from": "a newer extender"},
    }
    async with httpx.AsyncClient(transport=httpx.MockTransport(answering(answer))) as client:
        agent = make_agent(client, clock)
        (result,) = await rounds(agent, clock, 1)
    assert result == {"http://x": "ok"}
    assert agent.protection.boost == frozenset({1})
    assert agent.reporter.hot_threshold_c == 80.0
    assert protection(agent) == (85, 600, True, 90)
    assert agent.blocks.block_mib == 4096  # 16 MiB blocks: under the 256 MiB least
    assert agent.blocks.lend == {"GPU-x": 2}
    assert agent.remediation.testing is None and agent.remediation.self_test is None
    for field in ("accepted", "performance_gpus", "policy.max_temp_c", "policy.power_saving",
                  "policy.memory_block_mib", "lend_blocks", "self_test", "reboot"):  # fmt: skip
        assert ignored(agent, field) == 1.0, field
    assert ignored(agent, "something_new") == 0.0


@pytest.mark.parametrize(
    ("block_mib", "taken"),
    [(16, False), (255, False), (4096.5, False), (2**40, False), (True, False), (512, True)],
)
def test_a_block_size_is_taken_only_when_it_is_a_whole_number_of_at_least_256_mib(
    block_mib: object, taken: bool
) -> None:
    answer, ignored = read_answer(json.dumps({"policy": {"memory_block_mib": block_mib}}).encode())
    assert (
        answer.policy is not None and answer.policy.said() == {"memory_block_mib": 512.0}
    ) is taken
    assert ignored == (() if taken else ("policy.memory_block_mib",))


# -- the extender's policy makes local protection stricter, never looser ----------------------
async def test_a_looser_policy_in_an_answer_cannot_turn_local_protection_off() -> None:
    clock = Clock()
    answer = {"accepted": True, "policy": {"max_temp_c": 150, "cool_down_s": 86_400,
                                           "power_saving": False,
                                           "power_saving_threshold_pct": 0}}  # fmt: skip
    async with httpx.AsyncClient(transport=httpx.MockTransport(answering(answer))) as client:
        agent = make_agent(client, clock)
        await rounds(agent, clock, 2)
    # A day's cool-down keeps protection on longer: stricter, so taken.
    assert protection(agent) == (85, 86_400, True, 70)
    assert agent.protection.health_args.max_temp_c == 85.0
    for field in ("max_temp_c", "power_saving", "power_saving_threshold_pct"):
        assert ignored(agent, f"policy.{field}", "looser") == 2.0, field
    assert ignored(agent, "policy.cool_down_s", "looser") == 0.0


async def test_a_stricter_policy_is_followed_and_a_looser_one_later_is_held_at_the_flags() -> None:
    clock = Clock()
    # Power saving engages under its threshold: a higher threshold saves more.
    stricter = {"max_temp_c": 70, "cool_down_s": 900, "power_saving": True,
                "power_saving_threshold_pct": 90}  # fmt: skip
    looser = {"max_temp_c": 95, "cool_down_s": 60, "power_saving": False,
              "power_saving_threshold_pct": 40}  # fmt: skip
    handler = answering({"policy": stricter}, {"policy": looser})
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        agent = make_agent(client, clock, power_args=PowerArgs(max_temp_c=80, cool_down_s=120,
                                                               saving_enabled=True,
                                                               threshold_pct=60))  # fmt: skip
        await rounds(agent, clock, 1)
        assert protection(agent) == (70, 900, True, 90)
        await rounds(agent, clock, 1)
        assert protection(agent) == (80, 120, True, 60)


def test_following_a_looser_policy_takes_an_explicit_flag_and_is_off_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert AgentSettings(node_name="n1").accept_looser_policy is False
    parsed = command_line().parse_or_report(["--node-name", "n1", "--accept-looser-policy"])
    assert parsed is not None and parsed[0].accept_looser_policy is True
    monkeypatch.setenv("EDGEGPU_AGENT_ACCEPT_LOOSER_POLICY", "true")
    assert AgentSettings(node_name="n1").accept_looser_policy is True


# -- answers are capped while they are read -----------------------------------------------------
class Padded(httpx.AsyncByteStream):
    """A valid answer padded with ``total`` bytes of spaces, sent lazily; counts what it sent."""

    def __init__(self, total: int, chunk: int = 65_536, delay_s: float = 0.0) -> None:
        self.total, self.chunk, self.delay_s, self.sent = total, chunk, delay_s, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        body = b'{"accepted": true}'
        self.sent += len(body)
        yield body
        while self.sent < self.total:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            self.sent += self.chunk
            yield b" " * self.chunk


async def test_an_answer_past_the_cap_is_not_read_to_its_end_and_counts_as_a_failed_push() -> None:
    clock = Clock()
    stream = Padded(150 * 1024 * 1024)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=stream)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        agent = make_agent(client, clock)
        results = await rounds(agent, clock, 1)
        assert results == [{"http://x": "failed"}]
        assert stream.sent <= MAX_ANSWER_BYTES + 2 * stream.chunk
        clock.t -= 0.9  # within the backoff
        assert await rounds(agent, clock, 1) == [{"http://x": "backoff"}]


@pytest.mark.parametrize(
    "headers",
    [{"content-length": str(150 * 1024 * 1024)}, {"content-encoding": "gzip"}],
    ids=["declared-too-long", "compressed"],
)
async def test_an_answer_declared_too_long_or_compressed_is_refused_unread(
    headers: dict[str, str],
) -> None:
    stream = Padded(4 * MAX_ANSWER_BYTES)
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("accept-encoding"))
        return httpx.Response(200, headers=headers, stream=stream)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        out = await Pusher(["http://x"], client, clock=Clock()).push(b"{}")
    assert out.results == {"http://x": "failed"}
    assert stream.sent == 0
    assert seen == ["identity"]


async def test_an_answer_dripped_in_slowly_counts_as_a_failed_push() -> None:
    stream = Padded(MAX_ANSWER_BYTES, chunk=1, delay_s=0.01)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=stream)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        pusher = Pusher(["http://x"], client, clock=Clock(), answer_timeout_s=0.3)
        started = time.monotonic()
        out = await pusher.push(b"{}")
    assert out.results == {"http://x": "failed"}
    assert time.monotonic() - started < 2.0


async def test_an_assignments_answer_past_the_cap_gives_no_assignments_from_that_replica() -> None:
    row = {"uid": "u", "namespace": "ns", "name": "p", "gpu_uuids": ["GPU-a"], "blocks": 1,
           "assigned_at": 1.0, "phase": "Pending", "containers": [1]}  # fmt: skip
    streams: list[Padded] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "big":
            streams.append(Padded(150 * 1024 * 1024))
            return httpx.Response(200, stream=streams[-1])
        return httpx.Response(200, json={"assignments": [row, {"uid": 7}, "x"]})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        pusher = Pusher(["http://big", "http://small"], client, clock=Clock())
        found = await pusher.assignments("n1")()
    assert found == [Assigned("u", "ns", "p", "GPU-a", 1, 1.0, "Pending", (1,))]
    assert streams[0].sent <= MAX_ANSWER_BYTES + 2 * 65_536


# -- a reboot ask must name this boot -----------------------------------------------------------
@pytest.mark.parametrize(
    ("ask", "reason"),
    [({"id": "r1"}, "no-boot"), ("r1", "no-boot"), ({"id": "r1", "boot": "host-0"}, "other-boot")],
    ids=["no-boot", "old-form", "other-boot"],
)
async def test_a_reboot_ask_that_does_not_name_this_boot_writes_no_sentinel_and_is_counted(
    tmp_path: Path, ask: object, reason: str
) -> None:
    clock, sentinel = Clock(), tmp_path / "reboot-required"
    handler = answering({"accepted": True, "reboot": ask})
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        agent = make_agent(client, clock, reboot_sentinel=sentinel, host_boot_id="host-1")
        await rounds(agent, clock, 2)
    assert not sentinel.exists()
    assert ignored(agent, "reboot", reason) == 2.0


async def test_the_real_extenders_reboot_ask_names_the_agents_boot_and_is_followed(
    tmp_path: Path,
) -> None:
    from scheduler_extender.api.app import create_app
    from scheduler_extender.k8s.client import KubeApi, load_api_client
    from scheduler_extender.metrics import ExtenderMetrics
    from scheduler_extender.policy.document import parse_policy
    from scheduler_extender.remediation.faults import Phase, Record
    from scheduler_extender.remediation.runner import Remediator
    from tests.fakes.fake_kube import FakeKube

    clock, sentinel = Clock(), tmp_path / "reboot-required"
    app = create_app()
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
    with FakeKube() as kube:
        api = KubeApi(load_api_client(kube.kubeconfig(tmp_path / "kubeconfig")))
        async with httpx.AsyncClient(transport=transport) as client:
            agent = make_agent(client, clock, ("http://extender",), reboot_sentinel=sentinel,
                               host_boot_id="host-1")  # fmt: skip
            await rounds(agent, clock, 1)
            ctx = app.state.ctx
            ctx.state.set_policy(parse_policy({"spec": {"remediation": {
                "enabled": True, "dryRun": False}}}))  # fmt: skip
            leader = Remediator(ctx.state, api, ExtenderMetrics(CollectorRegistry(), ctx.state))
            await leader.act.sync_clock("edgegpu-system", "any")  # as each round does
            seen = leader.faults.observe("n1", {}, ctx.state.policy.spec.remediation)
            leader.faults.records["n1"] = Record(
                Phase.REBOOT_REQUESTED, "self-test failed", 0.0, 0.0, "t", request="r1",
                boot=seen.boot or "",
            )  # fmt: skip
            ctx.remediator = leader  # its asks, as the leader's answers carry them
            await rounds(agent, clock, 1)
    assert seen.boot == "host-1"
    assert sentinel.read_text() == "edgegpu remediation r1\nboot host-1\n"


# -- the device plugin gives only what it advertised ----------------------------------------------
GPUS = [GpuBlocks("GPU-a", 3, True), GpuBlocks("GPU-b", 3, True)]


def _bound(*pods: Assigned) -> Callable[[], Any]:
    async def lookup() -> list[Assigned] | None:
        return list(pods)

    return lookup


def _allocate(*ids: str) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(ids))]
    )


@pytest.mark.parametrize(
    "ids",
    [["all::0"], ["all"], ["GPU-a::0", "all::0"], ["GPU-a::0", "GPU-a::0"], ["GPU-a::0"] * 10_000,
     ["GPU-a::7"], ["GPU-a::lent-0"]],
    ids=["all-block", "all", "one-unknown", "twice", "ten-thousand", "past-its-blocks", "not-lent"],
)  # fmt: skip
async def test_allocate_refuses_any_device_id_it_never_advertised_or_given_twice(
    ids: list[str],
) -> None:
    plugin = BlockPlugin(_bound(Assigned("u", "ns", "p", "GPU-a", 1, 1.0, "Pending")), lambda: 4096)
    await plugin.update(GPUS)
    with pytest.raises(Refused) as refused:
        await plugin.Allocate(_allocate(*ids), Context())
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_an_allocation_names_one_gpu_and_the_memory_of_the_blocks_given() -> None:
    plugin = BlockPlugin(_bound(Assigned("u", "ns", "p", "GPU-b", 2, 1.0, "Pending")), lambda: 4096)
    await plugin.update(GPUS)
    answer = await plugin.Allocate(_allocate("GPU-b::0", "GPU-b::2"), Context())
    envs = answer.container_responses[0].envs
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
    assert envs["EDGEGPU_MEM_LIMIT_MIB"] == str(2 * 4096)


async def test_a_preferred_allocation_of_a_huge_size_offers_only_advertised_blocks_at_once() -> (
    None
):
    plugin = BlockPlugin(_bound(), lambda: 4096)
    await plugin.update(GPUS)
    unknown = [f"GPU-x::{k}" for k in range(10_000)]
    request = api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=[*unknown, "GPU-a::0", "GPU-a::1", "GPU-a::1", "all::0"],
            must_include_deviceIDs=["all::1"], allocation_size=2**31 - 1)])  # fmt: skip
    started = time.perf_counter()
    answer = await plugin.GetPreferredAllocation(request, Context())
    assert time.perf_counter() - started < 1.0
    assert list(answer.container_responses[0].deviceIDs) == ["GPU-a::0", "GPU-a::1"]


# -- the extender's certificate is checked ------------------------------------------------------
def certificate(folder: Path, name: str, alt: str) -> tuple[Path, Path]:
    """A self-signed certificate (its own CA) for ``alt`` (a subjectAltName list), and its key."""
    key, crt = folder / f"{name}.key", folder / f"{name}.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout",
         str(key), "-out", str(crt), "-subj", f"/CN={name}", "-addext", f"subjectAltName={alt}"],
        check=True, capture_output=True,
    )  # fmt: skip
    return crt, key


class HttpsExtender:
    """HTTPS servers on 127.0.0.1 answering every push, each with a certificate of its own CA."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.servers: list[asyncio.Server] = []
        self.connections = 0
        """Connections accepted so far, handshake or not."""

    async def __call__(self, alt: str) -> int:
        """Starts one whose certificate names ``alt`` (``extender.crt``); returns its port."""
        crt, key = certificate(self.folder, "extender", alt)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(crt, key)

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await writer.start_tls(context)
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
                await reader.readexactly(length)
                body = b'{"accepted": true}'
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
                await writer.drain()
            except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
                pass  # a client that refused our certificate hangs up
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)  # TLS after the count
        self.servers.append(server)
        return int(server.sockets[0].getsockname()[1])


@pytest.fixture
def https_extender(tmp_path: Path) -> Iterator[HttpsExtender]:
    extender = HttpsExtender(tmp_path)
    yield extender
    for server in extender.servers:
        server.close()


async def _push_with(settings: AgentSettings) -> dict[str, str]:
    ca = extender_ca(settings)
    async with extender_client(settings, ca) as client:
        pusher = extender_pusher(settings, client, ca)
        assert pusher is not None
        return dict((await pusher.push(b"{}")).results)


async def test_the_agent_pushes_over_https_only_to_a_certificate_from_its_ca_file(
    tmp_path: Path, https_extender: HttpsExtender
) -> None:
    port = await https_extender("IP:127.0.0.1,DNS:localhost")
    url = f"https://127.0.0.1:{port}"
    other, _ = certificate(tmp_path, "another-ca", "DNS:elsewhere")
    trusted = AgentSettings(node_name="n1", extender_urls=[url], ca_file=tmp_path / "extender.crt")
    assert await _push_with(trusted) == {url: "ok"}
    wrong_ca = AgentSettings(node_name="n1", extender_urls=[url], ca_file=other)
    assert await _push_with(wrong_ca) == {url: "failed"}
    public_cas = AgentSettings(node_name="n1", extender_urls=[url])
    assert await _push_with(public_cas) == {url: "failed"}


async def test_the_certificate_must_name_the_host_of_the_url_even_with_every_address_resolved(
    tmp_path: Path, https_extender: HttpsExtender
) -> None:
    port = await https_extender("DNS:localhost")
    ca = tmp_path / "extender.crt"
    by_name = AgentSettings(node_name="n1", extender_urls=[f"https://localhost:{port}"],
                            ca_file=ca, resolve_all=True)  # fmt: skip
    assert f"https://localhost:{port}@127.0.0.1" in {
        k for k, v in (await _push_with(by_name)).items() if v == "ok"
    }
    by_address = AgentSettings(node_name="n1", extender_urls=[f"https://127.0.0.1:{port}"],
                               ca_file=ca)  # fmt: skip
    assert await _push_with(by_address) == {f"https://127.0.0.1:{port}": "failed"}


async def test_with_a_tls_server_name_an_extender_reached_by_address_is_checked_by_that_name(
    tmp_path: Path, https_extender: HttpsExtender
) -> None:
    """A NodePort or LoadBalancer address: the certificate names only the Service."""
    port = await https_extender("DNS:edgegpu-extender.edgegpu-system.svc")
    url, ca = f"https://127.0.0.1:{port}", tmp_path / "extender.crt"
    named = AgentSettings(node_name="n1", extender_urls=[url], ca_file=ca,
                          tls_server_name="edgegpu-extender.edgegpu-system.svc")  # fmt: skip
    assert await _push_with(named) == {url: "ok"}
    by_host = AgentSettings(node_name="n1", extender_urls=[url], ca_file=ca)
    assert await _push_with(by_host) == {url: "failed"}
    misnamed = AgentSettings(node_name="n1", extender_urls=[url], ca_file=ca,
                             tls_server_name="edgegpu-extender.elsewhere.svc")  # fmt: skip
    assert await _push_with(misnamed) == {url: "failed"}
    resolved = AgentSettings(node_name="n1", extender_urls=[f"https://localhost:{port}"],
                             ca_file=ca, resolve_all=True,
                             tls_server_name="edgegpu-extender.edgegpu-system.svc")  # fmt: skip
    assert (await _push_with(resolved)).get(f"https://localhost:{port}@127.0.0.1") == "ok"


def test_the_tls_server_name_is_a_flag_and_a_variable_and_must_be_a_dns_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert AgentSettings(node_name="n1").tls_server_name is None
    parsed = command_line().parse_or_report(["--node-name", "n1", "--tls-server-name", "a.b.svc"])
    assert parsed is not None and parsed[0].tls_server_name == "a.b.svc"
    monkeypatch.setenv("EDGEGPU_AGENT_TLS_SERVER_NAME", "edgegpu-extender.ns.svc")
    assert AgentSettings(node_name="n1").tls_server_name == "edgegpu-extender.ns.svc"
    for bad in ("", "a b", "https://a.svc", "a..svc", "-a.svc", "a/b", "a" * 64 + ".svc"):
        with pytest.raises(ValueError, match="tls_server_name"):
            AgentSettings(node_name="n1", tls_server_name=bad)


# -- a CA file that cannot be read stops the pushes, never the agent ---------------------------
@pytest.mark.parametrize("content", [None, b"", b"not a certificate\n"],
                         ids=["missing", "empty", "not-a-certificate"])  # fmt: skip
async def test_while_the_ca_file_cannot_be_read_no_https_push_is_tried_and_once_it_can_pushes_start(
    tmp_path: Path,
    https_extender: HttpsExtender,
    caplog: pytest.LogCaptureFixture,
    content: bytes | None,
) -> None:
    port = await https_extender("IP:127.0.0.1")
    url, ca_file = f"https://127.0.0.1:{port}", tmp_path / "ca" / "ca.crt"
    if content is not None:
        ca_file.parent.mkdir()
        ca_file.write_bytes(content)
    settings = AgentSettings(node_name="n1", extender_urls=[url], ca_file=ca_file)
    ca = extender_ca(settings)
    assert ca is not None and not ca.loaded
    async with extender_client(settings, ca) as client:
        pusher = extender_pusher(settings, client, ca)
        assert pusher is not None
        for _ in range(3):
            assert (await pusher.push(b"{}")).results == {url: "failed"}
        assert await pusher.assignments("n1")() is None
        assert https_extender.connections == 0  # not even a handshake
        said = [r for r in caplog.records if str(ca_file) in r.getMessage()]
        assert len(said) == 1 and said[0].levelname == "ERROR"
        assert "no push to an https extender" in said[0].getMessage()
        ca_file.parent.mkdir(exist_ok=True)  # kubelet fills the ConfigMap's volume in
        ca_file.write_bytes((tmp_path / "extender.crt").read_bytes())
        assert (await pusher.push(b"{}")).results == {url: "ok"}
    assert ca.loaded


async def test_a_ca_file_that_appears_late_is_checked_as_strictly_as_one_there_at_start(
    tmp_path: Path, https_extender: HttpsExtender
) -> None:
    port = await https_extender("IP:127.0.0.1")
    url, ca_file = f"https://127.0.0.1:{port}", tmp_path / "ca.crt"
    settings = AgentSettings(node_name="n1", extender_urls=[url], ca_file=ca_file)
    ca = extender_ca(settings)
    async with extender_client(settings, ca) as client:
        pusher = Pusher([url], client, clock=Clock(), ca=ca, base_backoff_s=0, max_backoff_s=0)
        other, _ = certificate(tmp_path, "another-ca", "IP:127.0.0.1")
        ca_file.write_bytes(other.read_bytes())
        assert (await pusher.push(b"{}")).results == {url: "failed"}
        assert https_extender.connections == 1  # tried, and the certificate refused


def test_an_agent_whose_ca_file_is_missing_runs_its_round_and_says_the_push_failed(
    tmp_path: Path,
) -> None:
    """Not exit status 2: the DaemonSet would restart it with no local protection at all."""
    proc = subprocess.run(
        [sys.executable, "-m", "node_agent", "--backend", "simulated", "--node-name", "n1",
         "--once", "--print", "--metrics-port", "0", "--extender-urls", "https://127.0.0.1:9",
         "--ca-file", str(tmp_path / "absent.crt")],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["node"] == "n1"  # the round ran
    said = [line for line in proc.stderr.splitlines() if "absent.crt" in line]
    assert len(said) == 1 and "no push to an https extender" in said[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("block_mib", [0, 1, 255, 2_097_152])
def test_a_block_size_flag_under_256_mib_or_over_a_tib_stops_the_agent_at_start(
    block_mib: int,
) -> None:
    """Blocks that small make more devices than kubelet's gRPC message carries."""
    with pytest.raises(ValueError, match="block_mib"):
        AgentSettings(node_name="n1", block_mib=block_mib)
    assert AgentSettings(node_name="n1", block_mib=256).block_mib == 256


@pytest.mark.parametrize("labels", [{"rack": "a\x1b]52;c;aGk=\x07"}, {"ra\nck": "a"}])
def test_a_label_with_a_control_character_stops_the_agent_at_start_not_every_report(
    labels: dict[str, str],
) -> None:
    """Else every report it builds would fail the schema, and it would never push."""
    with pytest.raises(ValueError, match="labels"):
        AgentSettings(node_name="n1", labels=labels)
