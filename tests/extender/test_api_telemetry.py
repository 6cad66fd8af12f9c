import httpx
import orjson
import pytest

from scheduler_extender.api.app import create_app
from scheduler_extender.config import ExtenderSettings
from tests.builders import gpu, report

JSON = {"content-type": "application/json"}


async def test_a_valid_report_is_accepted_and_shown(client):
    resp = await client.post("/v1/telemetry", json=report("edge-1", [gpu(0), gpu(1)]))
    assert resp.status_code == 200
    assert resp.json() == {
        "accepted": True,
        "performance_gpus": [],
        "max_temp_c": 85.0,
        "policy": {"max_temp_c": 85.0, "cool_down_s": 300.0, "power_saving": True,
                   "power_saving_threshold_pct": 70.0, "memory_block_mib": 4096},
    }  # fmt: skip
    nodes = (await client.get("/debug/nodes")).json()["nodes"]
    assert [n["node"] for n in nodes] == ["edge-1"]
    assert [g["index"] for g in nodes[0]["gpus"]] == [0, 1]


async def test_an_old_seq_of_the_same_boot_is_ignored_and_a_new_boot_resets_ordering(client):
    assert (await client.post("/v1/telemetry", json=report("n", seq=10))).json()["accepted"] is True
    old = await client.post(
        "/v1/telemetry", json=report("n", seq=10, gpus=[gpu(0, temperature_c=99.0)])
    )
    assert old.status_code == 200
    assert old.json()["accepted"] is False
    assert "not newer" in old.json()["reason"]
    node = (await client.get("/debug/nodes/n")).json()
    assert node["gpus"][0]["temperature_c"] == 50.0
    restarted = await client.post("/v1/telemetry", json=report("n", seq=1, boot_id="boot-2"))
    assert restarted.json()["accepted"] is True


async def test_bad_reports_get_422_with_every_problem_located(client):
    bad = report("n", [gpu(0, temperature_c="hot", health="sick")])
    bad["interval_s"] = -1
    del bad["agent"]["seq"]
    resp = await client.post("/v1/telemetry", json=bad)
    assert resp.status_code == 422
    problems = {p["loc"] for p in resp.json()["problems"]}
    assert {"interval_s", "agent.seq", "gpus.0.temperature_c", "gpus.0.health"} <= problems


async def test_reports_with_the_wrong_schema_or_duplicate_gpus_are_refused(client):
    wrong = report("n")
    wrong["schema"] = "edgegpu.io/telemetry/v0"
    assert (await client.post("/v1/telemetry", json=wrong)).status_code == 422
    dup = report("n", [gpu(0), gpu(0)])
    resp = await client.post("/v1/telemetry", json=dup)
    assert resp.status_code == 422
    assert "appears twice" in resp.text


async def test_non_json_and_non_object_bodies_are_422_not_500(client):
    for body in (b"nope", b"[]", b"", b'{"schema": 5}'):
        resp = await client.post("/v1/telemetry", content=body, headers=JSON)
        assert resp.status_code == 422, body


async def test_an_oversized_report_is_413(clock):
    app = create_app(ExtenderSettings(max_telemetry_bytes=2048), clock=clock)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
        big = orjson.dumps(report("n", [gpu(i) for i in range(20)]))
        resp = await c.post("/v1/telemetry", content=big, headers=JSON)
        assert resp.status_code == 413


async def test_without_auth_only_loopback_clients_may_push(clock):
    app = create_app(clock=clock)
    transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
        resp = await c.post("/v1/telemetry", json=report("n"))
        assert resp.status_code == 403
        assert "loopback" in resp.json()["error"]
    metrics = app.state.ctx.metrics.registry.get_sample_value(
        "edgegpu_extender_telemetry_reports_total", {"result": "unauthorized"}
    )
    assert metrics == 1.0


async def test_freshness_follows_the_extenders_clock_not_the_agents(client, clock):
    r = report("n", interval_s=5)
    r["sampled_at"] = "1999-01-01T00:00:00Z"  # a badly set edge clock
    await client.post("/v1/telemetry", json=r)
    assert (await client.get("/debug/nodes/n")).json()["stale"] is False
    clock.advance(16)
    assert (await client.get("/debug/nodes/n")).json()["stale"] is True


async def test_a_fault_while_storing_a_push_is_a_500_with_a_message_not_a_traceback(
    app, client, monkeypatch
):
    def broken(_report, **_kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(app.state.ctx.state, "ingest", broken)
    resp = await client.post("/v1/telemetry", json=report("n1", [gpu(0)]))
    assert resp.status_code == 500
    assert resp.json() == {"error": "internal error (RuntimeError)"}
    # The next request is served as usual.
    assert (await client.get("/healthz")).status_code == 200


async def test_uvicorn_takes_the_peer_address_not_forwarded_headers(clock):
    import uvicorn

    from scheduler_extender.api.server import uvicorn_options

    assert uvicorn_options()["proxy_headers"] is False
    config = uvicorn.Config(create_app(clock=clock), **uvicorn_options())
    assert config.proxy_headers is False


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(
            b'{"schema":"edgegpu.io/telemetry/v1","node":"x","agent":{"version":"","backend":"b",'
            b'"boot_id":"b","seq":18446744073709551616},"sampled_at":"2026-01-01T00:00:00Z",'
            b'"interval_s":1,"gpus":[]}',
            id="seq 2^64",
        ),
        pytest.param(
            b'{"schema":"edgegpu.io/telemetry/v1","node":"x","agent":{"version":"","backend":"b",'
            b'"boot_id":"b","seq":1},"sampled_at":"2026-01-01T00:00:00Z","interval_s":1,'
            b'"gpus":[],"x":' + b"[" * 1000 + b"]" * 1000 + b"}",
            id="an unknown field nested 1000 deep",
        ),
    ],
)
async def test_hostile_pushes_get_a_clear_422(client, body):
    resp = await client.post("/v1/telemetry", content=body, headers=JSON)
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"].startswith("invalid telemetry report")


async def test_a_body_that_never_arrives_is_answered_408_and_holds_nothing(monkeypatch):
    """A client that declares more than it sends held a request open for ever."""
    import asyncio

    from scheduler_extender.api import bodies as serving, fast
    from scheduler_extender.api.app import create_app

    monkeypatch.setattr(serving, "BODY_TIMEOUT_S", 0.2)
    monkeypatch.setattr(fast, "PUSH_BODY_TIMEOUT_S", 0.2)
    app = create_app()
    sent: list[dict] = []
    parts = [{"type": "http.request", "body": b'{"schema":', "more_body": True}]

    async def receive():
        if parts:
            return parts.pop()
        await asyncio.sleep(3600)  # the rest never comes

    async def send(message):
        sent.append(message)

    for path in ("/v1/telemetry", "/filter"):
        sent.clear()
        parts[:] = [{"type": "http.request", "body": b'{"schema":', "more_body": True}]
        scope = {"type": "http", "method": "POST", "path": path, "client": ("127.0.0.1", 1),
                 "headers": [(b"content-length", b"5000"),
                             (b"content-type", b"application/json")]}  # fmt: skip
        await asyncio.wait_for(app(scope, receive, send), timeout=5)
        assert sent[0]["status"] == 408, path
        assert b"did not arrive in time" in sent[1]["body"]
