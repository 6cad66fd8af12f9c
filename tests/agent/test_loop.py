"""The agent loop end to end: simulated GPUs, the real extender app, failing links."""

import asyncio
import random

import httpx
import orjson
import pytest
from prometheus_client import CollectorRegistry

from node_agent.backends.nvml import NvmlBackend
from node_agent.backends.simulated import SimulatedBackend
from node_agent.loop import Agent
from node_agent.protection.health import HealthArgs
from node_agent.protection.policy import within_flags
from node_agent.protection.power import PowerArgs
from node_agent.telemetry.exporter import AgentMetrics
from node_agent.uplink.pusher import FlappingLinkTransport, Pusher
from scheduler_extender.api.app import create_app
from tests.builders import args_names, pod
from tests.fakes.fake_pynvml import FakeGpu, FakePynvml


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make_agent(clock, backend=None, pusher=None, **kw):
    backend = backend or SimulatedBackend(clock=clock, gpus=2, seed=1, node="n1")
    backend.open()
    return Agent(
        backend,
        node="n1",
        interval_s=1.0,
        metrics=AgentMetrics(CollectorRegistry(), "n1"),
        health_args=HealthArgs(),
        power_args=kw.pop("power_args", PowerArgs(window_s=10.0)),
        pusher=pusher,
        clock=clock,
        **kw,
    )


async def test_reports_reach_the_real_extender_and_drive_its_filter():
    clock = Clock()
    app = create_app()
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://extender") as client:
        pusher = Pusher(["http://extender"], client, clock=clock)
        agent = make_agent(clock, pusher=pusher)
        first = await agent.round()
        second = await agent.round()
        assert set(first.push.results.values()) == {"ok"}
        assert second.report.agent.seq == first.report.agent.seq + 1
        assert second.report.agent.boot_id == first.report.agent.boot_id
        resp = await client.post("/filter", json=args_names(pod(qos="training"), ["n1"]))
        assert resp.json()["NodeNames"] == ["n1"]


async def test_a_dead_link_backs_off_within_bounds_and_sends_the_latest_state_when_back():
    clock = Clock()
    sent: list[int] = []
    down = True

    def handler(request: httpx.Request) -> httpx.Response:
        if down:
            raise httpx.ConnectError("no route to host", request=request)
        sent.append(orjson.loads(request.content)["agent"]["seq"])
        return httpx.Response(200, json={"accepted": True})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        pusher = Pusher(
            ["http://x"],
            client,
            clock=clock,
            base_backoff_s=1.0,
            max_backoff_s=8.0,
            rng=random.Random(0),
        )
        agent = make_agent(clock, pusher=pusher)
        attempts = 0
        for _ in range(60):
            out = await agent.round()
            attempts += out.push.results["http://x"] == "failed"
            clock.t += 1.0
        # Backoff grows to at most 8 s: about 60 s / 4-8 s of attempts, never one per round.
        assert 6 <= attempts <= 20
        assert pusher.backoff_s(50) <= 8.0
        down = False
        clock.t += 10.0
        out = await agent.round()
        assert out.push.results["http://x"] == "ok"
        assert sent == [out.report.agent.seq]  # the newest report only, no backlog


@pytest.mark.parametrize(
    "model", ["NVIDIA A10", "Tesla T4"], ids=["power-cap-suffices", "clocks-needed-too"]
)
async def test_local_thermal_protection_works_with_no_network_at_all(model):
    clock = Clock()

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("network unreachable", request=request)

    backend = SimulatedBackend(
        clock=clock, gpus=1, node="edge", scenario="overheat", scenario_after_s=0.0, model=model
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        agent = make_agent(
            clock, backend=backend, pusher=Pusher(["http://cloud"], client, clock=clock)
        )
        temps, actions = [], []
        for _ in range(120):  # 10 minutes at 5 s
            clock.t += 5.0
            out = await agent.round()
            assert set(out.push.results.values()) <= {"failed", "backoff"}
            temps.append(out.report.gpus[0].temperature_c)
            actions += [a for a in out.actions if a.outcome == "applied"]
        first_hot = next(i for i, t in enumerate(temps) if t >= 85.0)
        assert min(temps[first_hot:]) < 85.0  # brought back under maxTemp without the cloud
        episode = [a for a in actions if a.action.reason == "thermal"]
        caps = [a.action.watts for a in episode if a.action.kind == "set_power_limit"]
        first_restore = next((i for i, w in enumerate(caps[1:], 1) if w > caps[i - 1]), len(caps))
        assert caps[:first_restore] == sorted(caps[:first_restore], reverse=True)
        assert any(a.action.kind == "lock_clocks" for a in episode) == (model == "Tesla T4")


async def test_dry_run_plans_but_changes_nothing():
    clock = Clock()
    backend = SimulatedBackend(clock=clock, gpus=1, node="n", load_pct=1.0)
    agent = make_agent(clock, backend=backend, dry_run=True)
    outcomes = []
    for _ in range(15):
        clock.t += 1.0
        outcomes += [a.outcome for a in (await agent.round()).actions]
    assert outcomes == ["dry-run"]
    assert "applications_clocks_setting" not in backend.read(0).throttle_reasons


def dev_tree(tmp_path, gpus):
    for name in ["nvidiactl", *(f"nvidia{i}" for i in range(gpus))]:
        (tmp_path / name).touch()
    return tmp_path


async def test_each_setter_without_permission_is_reported_once_and_not_retried(tmp_path):
    clock = Clock()
    fake = FakePynvml([FakeGpu(util_pct=1)])
    fake.setters_denied = True
    backend = NvmlBackend(module=fake, dev_root=dev_tree(tmp_path, 1))
    agent = make_agent(clock, backend=backend, power_args=PowerArgs(window_s=0.0))
    outcomes = []
    for _ in range(5):
        clock.t += 1.0
        outcomes += [(a.action.kind, a.outcome) for a in (await agent.round()).actions]
    # power saving falls back to the power limit where the clocks may not be locked
    assert outcomes == [("lock_clocks", "no-permission"), ("set_power_limit", "no-permission")]
    assert [fn for fn, _ in fake.calls] == [
        "nvmlDeviceSetGpuLockedClocks", "nvmlDeviceSetPowerManagementLimit",
    ]  # fmt: skip


async def test_a_lost_gpu_and_a_broken_reading_do_not_stop_the_loop(tmp_path):
    clock = Clock()
    fake = FakePynvml([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")])
    agent = make_agent(clock, backend=NvmlBackend(module=fake, dev_root=dev_tree(tmp_path, 2)))
    fake.gpus[1].lost = True
    out = await agent.round()
    gpus = {g.index: g for g in out.report.gpus}
    assert gpus[1].health == "unhealthy" and gpus[1].health_reasons == ["nvml:gpu-lost"]
    assert gpus[0].health == "healthy"
    fake.push_xid(0, 79)
    out = await agent.round()
    assert out.report.gpus[0].health_reasons == ["xid:79"] and out.report.gpus[0].xid_last == 79

    stop = asyncio.Event()

    def boom(index):
        stop.set()
        raise RuntimeError("driver hiccup")

    agent.backend.read = boom  # type: ignore[method-assign]
    await asyncio.wait_for(agent.run(stop), timeout=5)  # survives, then stops


async def test_the_flapping_link_transport_drops_and_restores_the_link():
    clock = Clock()
    inner = httpx.MockTransport(lambda r: httpx.Response(200, json={"accepted": True}))
    link = FlappingLinkTransport(inner, clock, period_s=60.0, down_s=20.0)
    async with httpx.AsyncClient(transport=link) as client:
        pusher = Pusher(["http://x"], client, clock=clock, base_backoff_s=0.5, max_backoff_s=1.0)
        assert (await pusher.push(b"{}")).results["http://x"] == "failed"
        clock.t += 25.0
        assert (await pusher.push(b"{}")).results["http://x"] == "ok"


async def test_the_exporter_uses_the_seed_metric_names_and_labels():
    clock = Clock()
    agent = make_agent(clock)
    await agent.round()
    text = _metrics_text(agent.metrics.registry)
    for name in (
        "node_gpu_temperature_celsius", "node_gpu_power_watts", "node_gpu_power_limit_watts",
        "node_gpu_utilization_ratio", "node_gpu_memory_used_bytes", "node_gpu_sm_clock_hertz",
        "node_gpu_health", "node_gpu_cuda_context_success_ratio",
    ):  # fmt: skip
        assert f"\n{name}{{" in text, name
    line = next(
        ln for ln in text.splitlines() if ln.startswith('node_gpu_temperature_celsius{device="0"')
    )
    assert 'model="' in line and 'node="n1"' in line and 'uuid="GPU-' in line


async def test_unsupported_values_are_left_out_of_the_metrics():
    clock = Clock()
    backend = SimulatedBackend(clock=clock, gpus=1, node="n1", scenario="unsupported-fields")
    agent = make_agent(clock, backend=backend)
    await agent.round()
    text = _metrics_text(agent.metrics.registry)
    assert "\nnode_gpu_power_watts{" not in text
    assert "\nnode_gpu_temperature_celsius{" in text


def _metrics_text(registry):
    from prometheus_client import generate_latest

    return "\n" + generate_latest(registry).decode()


async def test_with_resolve_all_every_address_of_the_service_name_gets_the_report():
    seen: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.headers["host"]))
        return httpx.Response(200, json={"accepted": True})

    clock = Clock()
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        pusher = Pusher(["http://localhost:8888"], client, clock=clock, resolve_all=True)
        out = await pusher.push(b"{}")
    assert set(out.results.values()) == {"ok"}
    assert all(key.startswith("http://localhost:8888@") for key in out.results)
    assert {host for _, host in seen} == {"localhost:8888"}  # the Host header stays the name
    assert "127.0.0.1" in {addr for addr, _ in seen}


async def test_one_nonsense_reading_is_reported_as_null_and_every_other_gpu_still_goes():
    import dataclasses

    class Garbled(SimulatedBackend):
        def read(self, index):
            r = super().read(index)
            if index == 0:
                return dataclasses.replace(
                    r, temperature_c=float("nan"), power_w=float("inf"), utilization_pct=250.0
                )
            return r

    clock = Clock()
    agent = make_agent(clock, backend=Garbled(clock=clock, gpus=2, seed=1, node="n1"))
    report = (await agent.round()).report
    first, second = report.gpus
    assert (first.temperature_c, first.power_w, first.utilization_pct) == (None, None, None)
    assert first.memory_total_mib is not None  # the rest of that GPU is kept
    assert second.temperature_c is not None and second.power_w is not None


async def test_a_forged_push_that_outranks_the_agent_pins_the_node_for_one_round_only():
    """A push under the agent's boot id with a huge seq made the extender ignore
    the genuine agent until it restarted. The boot id is no longer shown by /debug, and an
    agent told its report is not newer starts a new boot id."""
    clock = Clock()
    app = create_app()
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://extender") as client:
        agent = make_agent(clock, pusher=Pusher(["http://extender"], client, clock=clock))
        first = await agent.round()
        shown = (await client.get("/debug/nodes/n1")).json()
        assert first.report.agent.boot_id not in orjson.dumps(shown).decode()
        forged = orjson.loads(first.report.to_json_bytes())
        forged["agent"]["seq"] = 2**62
        forged["gpus"] = []
        resp = await client.post(
            "/v1/telemetry", content=orjson.dumps(forged),
            headers={"content-type": "application/json"},
        )  # fmt: skip
        assert resp.json()["accepted"] is True
        ignored = await agent.round()
        assert set(ignored.push.results.values()) == {"ignored"}
        again = await agent.round()
        assert set(again.push.results.values()) == {"ok"}
        assert again.report.agent.boot_id != first.report.agent.boot_id
        assert again.report.agent.seq == 1
        resp = await client.post("/filter", json=args_names(pod(qos="training"), ["n1"]))
        assert resp.json()["NodeNames"] == ["n1"]


class _Switch(httpx.AsyncBaseTransport):
    """Sends to whichever app is current: an extender restarted between two pushes."""

    def __init__(self, app) -> None:
        self.to(app)

    def to(self, app) -> None:
        self.inner = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.inner.handle_async_request(request)


async def test_a_cool_down_survives_the_extenders_restart_through_the_agents_report():
    """A restarted extender forgot that a GPU was cooling down. The agent now says
    how long ago each GPU was last at the extender's maxTemp (``hot_s_ago``)."""
    from scheduler_extender.telemetry.clock import FakeClock

    clock, ext_clock = Clock(), FakeClock()
    backend = SimulatedBackend(
        clock=clock, gpus=1, node="n1", scenario="overheat", scenario_after_s=0.0
    )
    first = create_app(clock=ext_clock)
    switch = _Switch(first)
    async with httpx.AsyncClient(transport=switch, base_url="http://extender") as client:
        agent = make_agent(clock, backend=backend, pusher=Pusher(["http://e"], client, clock=clock))
        seen_hot = False
        for _ in range(240):
            clock.t += 5.0
            ext_clock.advance(5.0)
            out = await agent.round()
            temp = out.report.gpus[0].temperature_c
            seen_hot = seen_hot or temp >= 85.0
            if seen_hot and temp < 85.0:
                break
        assert seen_hot and temp < 85.0, temp  # local protection brought it under maxTemp
        assert agent.reporter.hot_threshold_c == 85.0  # as the extender's answer said
        switch.to(create_app(clock=FakeClock()))  # the extender restarts
        clock.t += 5.0
        out = await agent.round()
        assert 0 < out.report.gpus[0].hot_s_ago < 300
        resp = await client.post(
            "http://extender/filter", json=args_names(pod(qos="training"), ["n1"])
        )
        assert resp.json()["FailedNodes"] == {"n1": "edgegpu: gpu cooling down"}


async def test_a_hint_counted_from_below_max_temp_or_older_than_the_cool_down_is_not_taken(
    client, clock
):
    from tests.builders import gpu, report

    def hinted(hot_s_ago: float, threshold: float) -> dict:
        doc = report("n1", [gpu(0, temperature_c=60.0, hot_s_ago=hot_s_ago)])
        doc["hot_threshold_c"] = threshold
        return doc

    await client.post("/v1/telemetry", json=hinted(301.0, 85.0))
    assert (await client.post("/filter", json=args_names(pod(), ["n1"]))).json()["NodeNames"] == [
        "n1"
    ]
    await client.post("/v1/telemetry", json=hinted(10.0, 90.0))  # counted from above maxTemp
    assert (await client.post("/filter", json=args_names(pod(), ["n1"]))).json()["NodeNames"] == [
        "n1"
    ]


async def test_a_requested_self_test_runs_once_and_its_verdict_rides_the_next_reports(tmp_path):
    """The fault loop's requests: a self-test and a reboot decision, each by id."""
    clock = Clock()
    answers = {"self_test": {"id": "t1"}}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"accepted": True, "max_temp_c": 85.0, **answers})

    backend = SimulatedBackend(clock=clock, gpus=2, node="n1", scenario="xid-79",
                               scenario_after_s=0.0)  # fmt: skip
    sentinel = tmp_path / "reboot-required"
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        agent = make_agent(clock, backend=backend, reboot_sentinel=sentinel,
                           pusher=Pusher(["http://x"], client, clock=clock))  # fmt: skip
        clock.t += 1.0
        first = await agent.round()
        assert first.report.gpus[0].health == "unhealthy" and first.report.self_test is None
        for _ in range(20):  # the test runs in a thread
            await asyncio.sleep(0.01)
            if agent.remediation.self_test:
                break
        clock.t += 1.0
        second = await agent.round()
        assert second.report.self_test is not None
        assert (second.report.self_test.id, second.report.self_test.verdict) == ("t1", "pass")
        # A pass clears the XID record: the GPU is healthy again in the same report.
        assert second.report.gpus[0].health == "healthy"
        clock.t += 1.0
        third = await agent.round()  # the same id again: not run again, the verdict stays
        assert third.report.self_test == second.report.self_test
        assert not sentinel.exists()
        answers.clear()
        answers["reboot"] = {"id": "r1", "boot": agent.reporter.boot}
        await agent.round()
        assert sentinel.read_text().startswith("edgegpu remediation r1\n")


def test_the_simulated_self_test_fails_a_lost_gpu():
    clock = Clock()
    backend = SimulatedBackend(clock=clock, gpus=2, node="n1", scenario="gpu-lost",
                               scenario_after_s=0.0)  # fmt: skip
    backend.open()
    clock.t += 1.0
    backend.read(1)
    verdict = backend.self_test()
    assert verdict["verdict"] == "fail"
    assert [c["outcome"] for c in verdict["checks"]] == ["pass", "fail"]


async def test_the_policy_in_the_answer_drives_local_protection_and_bad_values_are_ignored():
    clock = Clock()
    policy: dict = {"max_temp_c": 70.0, "cool_down_s": 600.0, "power_saving": True,
                    "power_saving_threshold_pct": 40.0}  # fmt: skip

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"accepted": True, "max_temp_c": 70.0, "policy": policy})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        agent = make_agent(clock, pusher=Pusher(["http://x"], client, clock=clock),
                           power_args=PowerArgs(saving_enabled=False))  # fmt: skip
        await agent.round()
        p = agent.protection.power_args
        assert (p.max_temp_c, p.cool_down_s, p.saving_enabled, p.threshold_pct) == (
            70.0, 600.0, True, 40.0)  # fmt: skip
        assert agent.protection.health_args.max_temp_c == 70.0
        policy.update(max_temp_c="hot", cool_down_s=-1, power_saving="yes")
        await agent.round()
        assert (
            agent.protection.power_args.max_temp_c,
            agent.protection.power_args.cool_down_s,
        ) == (70.0, 600.0)
        assert agent.protection.power_args.saving_enabled is True


async def test_a_looser_policy_is_followed_only_with_accept_looser_policy():
    clock = Clock()
    policy = {"max_temp_c": 95.0, "cool_down_s": 60.0, "power_saving": False,
              "power_saving_threshold_pct": 40.0}  # fmt: skip

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"accepted": True, "policy": policy})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        for accept, expected in [(False, (85.0, 300.0, True, 70.0)),
                                 (True, (95.0, 60.0, False, 40.0))]:  # fmt: skip
            agent = make_agent(clock, pusher=Pusher(["http://x"], client, clock=clock),
                               power_args=PowerArgs(), accept_looser_policy=accept)  # fmt: skip
            await agent.round()
            p = agent.protection.power_args
            assert (p.max_temp_c, p.cool_down_s, p.saving_enabled, p.threshold_pct) == expected
            assert agent.protection.health_args.max_temp_c == expected[0]


SAVING_AT_70 = PowerArgs(max_temp_c=85.0, cool_down_s=300.0, saving_enabled=True,
                         threshold_pct=70.0)  # fmt: skip
SAVING_OFF = PowerArgs(max_temp_c=85.0, cool_down_s=300.0, saving_enabled=False,
                       threshold_pct=70.0)  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "policy", "followed", "looser"),
    [
        pytest.param(SAVING_AT_70, {"power_saving_threshold_pct": 90.0},
                     {"power_saving_threshold_pct": 90.0}, (),
                     id="a higher saving threshold saves on more gpus and is followed"),
        pytest.param(SAVING_AT_70, {"power_saving_threshold_pct": 40.0},
                     {"power_saving_threshold_pct": 70.0}, ("power_saving_threshold_pct",),
                     id="a lower saving threshold is held at the flag"),
        pytest.param(SAVING_AT_70, {"power_saving_threshold_pct": 0.0},
                     {"power_saving_threshold_pct": 70.0}, ("power_saving_threshold_pct",),
                     id="a threshold of 0 cannot switch saving off"),
        pytest.param(SAVING_OFF, {"power_saving": True, "power_saving_threshold_pct": 40.0},
                     {"power_saving": True, "power_saving_threshold_pct": 40.0}, (),
                     id="saving switched on at any threshold is stricter than saving off"),
        pytest.param(SAVING_AT_70, {"power_saving": False}, {"power_saving": True},
                     ("power_saving",), id="saving switched off is held on"),
        pytest.param(SAVING_AT_70, {"max_temp_c": 95.0, "cool_down_s": 60.0},
                     {"max_temp_c": 85.0, "cool_down_s": 300.0}, ("max_temp_c", "cool_down_s"),
                     id="a higher max temp and a shorter cool-down are held at the flags"),
        pytest.param(SAVING_AT_70, {"max_temp_c": 70.0, "cool_down_s": 900.0},
                     {"max_temp_c": 70.0, "cool_down_s": 900.0}, (),
                     id="a lower max temp and a longer cool-down are followed"),
        pytest.param(SAVING_AT_70, {"memory_block_mib": 512.0}, {"memory_block_mib": 512.0}, (),
                     id="the block size is no protection and passes"),
    ],
)  # fmt: skip
def test_the_extenders_policy_is_followed_where_stricter_than_the_flags_and_held_where_looser(
    flags: PowerArgs,
    policy: dict[str, float | bool],
    followed: dict[str, float | bool],
    looser: tuple[str, ...],
) -> None:
    assert within_flags(policy, flags) == (followed, looser)
    assert within_flags(policy, flags, accept_looser=True) == (policy, ())


async def test_a_policy_changed_on_the_extender_reaches_the_agent_with_its_next_push():
    from scheduler_extender.policy.document import parse_policy

    clock = Clock()
    app = create_app()
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://extender") as client:
        agent = make_agent(clock, pusher=Pusher(["http://extender"], client, clock=clock))
        await agent.round()
        assert agent.protection.power_args.max_temp_c == 85.0
        app.state.ctx.state.set_policy(
            parse_policy({"spec": {"thermalThrottling": {"maxTemp": 78, "coolDownPeriod": "10m"}}})
        )
        clock.t += 1.0
        await agent.round()
        assert (
            agent.protection.power_args.max_temp_c,
            agent.protection.power_args.cool_down_s,
        ) == (78.0, 600.0)
        assert agent.reporter.hot_threshold_c == 78.0


def test_gpu_memory_is_exported_per_pod():
    from node_agent.model import GpuProcess, GpuReading

    metrics = AgentMetrics(CollectorRegistry(), "n1")
    metrics.view.readings = [GpuReading(index=0, uuid="GPU-x", processes=(
        GpuProcess(1, 1000.0, "uid-a", "app"), GpuProcess(2, 24.0, "uid-a", "app"),
        GpuProcess(3, 512.0, "uid-b", "main"), GpuProcess(4, 300.0)))]  # fmt: skip
    text = _metrics_text(metrics.registry)
    rows = sorted(
        ln for ln in text.splitlines() if ln.startswith("node_gpu_pod_memory_used_bytes{")
    )
    assert len(rows) == 2
    assert 'pod_uid="uid-a"' in rows[0] and float(rows[0].rsplit(" ", 1)[1]) == 1024 * 1048576.0
    assert 'container="main"' in rows[1]


def test_energy_is_integrated_per_gpu_and_shared_by_memory_per_pod():
    from node_agent.model import GpuProcess, GpuReading
    from node_agent.telemetry.exporter import EnergyMeter

    def sample(watts, procs=()):
        return [GpuReading(index=0, uuid="GPU-x", power_w=watts, processes=tuple(procs))]

    meter = EnergyMeter()
    a, b = GpuProcess(1, 3000.0, "uid-a", "app"), GpuProcess(2, 1000.0, "uid-b", "main")
    meter.add(sample(100.0), 0.0)
    meter.add(sample(200.0, [a, b]), 10.0)  # (100 + 200) / 2 W for 10 s = 1500 J
    assert meter.gpu_j == {"GPU-x": 1500.0}
    assert meter.pod_j == {("GPU-x", "uid-a", "app"): 1125.0, ("GPU-x", "uid-b", "main"): 375.0}
    meter.add(sample(200.0, [a]), 300.0)  # a gap of 290 s: unknown power, no energy
    assert meter.gpu_j == {"GPU-x": 1500.0}
    meter.add([GpuReading(index=0, uuid="GPU-x", lost=True)], 301.0)
    meter.add(sample(50.0), 302.0)  # after a lost reading: starts again
    assert meter.gpu_j == {"GPU-x": 1500.0}


async def test_the_agent_exports_energy_counters():
    clock = Clock()
    agent = make_agent(clock)
    await agent.round()
    clock.t += 5.0
    await agent.round()
    text = _metrics_text(agent.metrics.registry)
    rows = [ln for ln in text.splitlines() if ln.startswith("edgegpu_gpu_energy_joules_total{")]
    assert len(rows) == 2 and all(float(r.rsplit(" ", 1)[1]) > 0 for r in rows)


async def test_lent_blocks_are_the_least_any_replica_lends_and_none_without_an_answer():
    clock = Clock()
    answers = {
        "a": {"accepted": True, "lend_blocks": {"GPU-1": 3, "GPU-2": 2, "GPU-3": "x", "GPU-4": -1}},
        "b": {"accepted": True, "lend_blocks": {"GPU-1": 1, "GPU-2": 2}},
    }
    down: set[str] = set()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host in down:
            raise httpx.ConnectError("no route to host", request=request)
        return httpx.Response(200, json=answers[request.url.host])

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        pusher = Pusher(["http://a", "http://b"], client, clock=clock, base_backoff_s=0.1)
        out = await pusher.push(b"{}")
        # A replica behind may still lend what the other took back: the least of the two.
        assert out.lend == {"GPU-1": 1, "GPU-2": 2}
        down.add("b")
        clock.t += 1.0
        assert (await pusher.push(b"{}")).lend == {"GPU-1": 3, "GPU-2": 2}
        down.add("a")
        clock.t += 1.0
        assert (await pusher.push(b"{}")).lend == {}  # nobody to take them back: none lent
