"""The telemetry relay (``--ingest-port``): a real relay process, real sockets on 127.0.0.1.

Each test starts the app's lifespan, which starts the relay subprocess on a listening socket
the test opened; pushes go to the relay over HTTP and must land in the extender's state.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client import CollectorRegistry

from scheduler_extender import relay as wire
from scheduler_extender.api import ingest as ingest_mod, relay as relay_mod
from scheduler_extender.api.app import create_app
from scheduler_extender.api.relay import listen
from scheduler_extender.cli import main as cli_main
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.k8s.auth import StaticTokenAuth
from scheduler_extender.serving import CpuSplit, split_cpus
from scheduler_extender.telemetry.clock import FakeClock
from tests.builders import gpu, report


@asynccontextmanager
async def running(**kwargs: Any) -> AsyncIterator[tuple[Any, str, httpx.AsyncClient]]:
    """(app, relay URL, a client of the extender's own port) while the lifespan runs."""
    listener = listen("127.0.0.1", 0)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    settings = ExtenderSettings(log_level="warning", max_telemetry_bytes=64 * 1024)
    app = create_app(
        settings, clock=FakeClock(), registry=CollectorRegistry(), ingest_listener=listener,
        **kwargs,
    )  # fmt: skip
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=transport, base_url="http://extender") as own:
            yield app, url, own


async def post(url: str, body: bytes, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as c:
        return await c.post(f"{url}/v1/telemetry", content=body, headers=headers)


async def test_pushes_through_the_relay_land_in_the_extender():
    async with running() as (_, url, own):
        first = await post(url, orjson.dumps(report("edge-1", [gpu(0, temperature_c=61.0)], seq=5)))
        assert first.status_code == 200
        assert first.json() == {"accepted": True, "performance_gpus": []}
        node = (await own.get("/debug/nodes/edge-1")).json()
        assert node["gpus"][0]["temperature_c"] == 61.0
        again = await post(url, orjson.dumps(report("edge-1", [gpu(0)], seq=5)))
        assert again.json()["accepted"] is False
        assert "not newer" in again.json()["reason"]
        # The extender counts and times relayed pushes as its own.
        metrics = (await own.get("/metrics")).text
        assert 'edgegpu_extender_telemetry_reports_total{result="ignored"} 1.0' in metrics
        assert 'edgegpu_extender_request_duration_seconds_count{verb="telemetry"} 2.0' in metrics


@pytest.mark.parametrize("settle_s", [0.0, 0.05])
async def test_the_relay_sends_a_valid_push_with_its_digest_and_the_extender_does_not_decode_it(
    monkeypatch, settle_s
):
    made: list[Any] = []
    admit = ingest_mod.admit

    async def spy(ctx, body, client, token, digest=None):
        made.append(digest)
        return await admit(ctx, body, client, token, digest)

    monkeypatch.setattr(ingest_mod, "admit", spy)
    async with running() as (app, url, own):
        state = app.state.ctx.state
        state.settle_s = settle_s
        good = report("edge-1", [gpu(0, temperature_c=61.0, uuid="GPU-x")], seq=5)
        assert (await post(url, orjson.dumps(good))).json()["accepted"] is True
        bad = report("edge-1", [gpu(0, temperature_c=500.0)], seq=6)
        refused = await post(url, orjson.dumps(bad))
        assert refused.status_code == 422 and refused.json()["problems"]
        assert [d.node if d else None for d in made] == ["edge-1", None]
        state.settle()
        record = state.store.get("edge-1")
        assert record.decoded is None  # stored from the digest: the body not decoded yet
        assert state.gpu_uuids("edge-1", [0]) == ("GPU-x",)
        node = (await own.get("/debug/nodes/edge-1")).json()
        assert node["gpus"][0]["uuid"] == "GPU-x" and node["agent"]["seq"] == 5
        assert record.decoded is not None


async def test_many_pushes_at_once_each_get_their_own_answer():
    async with running() as (_, url, own):
        bodies = [orjson.dumps(report(f"n{i}", [gpu(0)], seq=1)) for i in range(60)]
        answers = await asyncio.gather(*(post(url, b) for b in bodies))
        # A repeat, sent once the first is answered (sent together, either could come first).
        answers.append(await post(url, orjson.dumps(report("n0", [gpu(0)], seq=1))))
        assert [a.json()["accepted"] for a in answers] == [True] * 60 + [False]
        nodes = (await own.get("/debug/nodes")).json()["nodes"]
        assert len(nodes) == 60


async def test_bad_pushes_get_the_same_answers_as_on_the_scheduler_port():
    async with running() as (_, url, own):
        bad = report("n", [gpu(0, temperature_c="hot")])
        via_relay = await post(url, orjson.dumps(bad))
        direct = await own.post("/v1/telemetry", content=orjson.dumps(bad))
        assert via_relay.status_code == direct.status_code == 422
        assert via_relay.json() == direct.json()
        assert (await post(url, b"{not json")).status_code == 422
        too_big = await post(url, b"x" * (65 * 1024))
        assert too_big.status_code == 413
        assert "over the limit" in too_big.json()["error"]
        async with httpx.AsyncClient() as c:
            assert (await c.get(f"{url}/healthz")).json() == {"status": "ok"}
            assert (await c.get(f"{url}/v1/telemetry")).status_code == 405
            elsewhere = await c.post(f"{url}/filter", content=b"{}")
            assert elsewhere.status_code == 404
            assert "telemetry pushes only" in elsewhere.json()["error"]


async def test_agent_tokens_are_checked_by_the_extender(tmp_path: Path):
    tokens = tmp_path / "tokens"
    tokens.write_text("secret-1 edge-1\n")
    async with running(auth=StaticTokenAuth(tokens)) as (_, url, _own):
        body = orjson.dumps(report("edge-1", [gpu(0)]))
        assert (await post(url, body)).status_code == 401
        assert (await post(url, body, authorization="Bearer wrong")).status_code == 401
        other = orjson.dumps(report("edge-2", [gpu(0)]))
        assert (await post(url, other, authorization="Bearer secret-1")).status_code == 403
        ok = await post(url, body, authorization="Bearer secret-1")
        assert ok.status_code == 200
        assert ok.json()["accepted"] is True


async def wait_for(predicate: Any, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_relay_that_dies_is_started_again_and_no_push_is_refused_meanwhile():
    async with running() as (app, url, own):
        supervisor = app.state.relay
        assert (await post(url, orjson.dumps(report("a", [gpu(0)])))).status_code == 200
        first = supervisor.process
        first.kill()
        await first.wait()
        # The port stays open in the extender: this push waits for the next relay.
        late = await post(url, orjson.dumps(report("b", [gpu(0)])))
        assert late.status_code == 200
        assert late.json()["accepted"] is True
        assert supervisor.process is not first
        metrics = (await own.get("/metrics")).text
        assert "edgegpu_extender_relay_restarts_total 1.0" in metrics


def niceness(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


async def test_the_relay_runs_at_a_lower_priority_and_stops_with_the_extender():
    async with running() as (app, url, _own):
        process = app.state.relay.process
        await post(url, orjson.dumps(report("a", [gpu(0)])))  # it is up
        assert niceness(process.pid) == niceness(os.getpid()) + 10
        assert process.returncode is None
    assert process.returncode is not None


def allowed_cpus(pid: int) -> set[int]:
    return os.sched_getaffinity(pid)


def test_the_scheduler_gets_the_last_cpu_and_the_relay_the_rest():
    assert split_cpus({0, 1}) == CpuSplit(frozenset({1}), frozenset({0}))
    assert split_cpus([5, 2, 9, 2]) == CpuSplit(frozenset({9}), frozenset({2, 5}))
    assert split_cpus({3}) is None
    assert split_cpus(()) is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to split")
async def test_a_relay_given_cpus_runs_on_them_and_a_restarted_one_too():
    cpus = frozenset({min(os.sched_getaffinity(0))})
    async with running(relay_cpus=cpus) as (app, url, _own):
        supervisor = app.state.relay
        assert (await post(url, orjson.dumps(report("a", [gpu(0)])))).status_code == 200
        assert allowed_cpus(supervisor.process.pid) == cpus
        first = supervisor.process
        first.kill()
        for _ in range(200):  # restarted by the supervisor
            if supervisor.process is not first:
                break
            await asyncio.sleep(0.05)
        assert (await post(url, orjson.dumps(report("a", [gpu(0)])))).status_code == 200
        assert allowed_cpus(supervisor.process.pid) == cpus


def test_split_cpus_needs_the_relay(capsys: pytest.CaptureFixture[str]):
    assert cli_main(["--port", "1", "--split-cpus"]) == 2
    assert "--split-cpus needs --ingest-port" in capsys.readouterr().err


def test_a_relay_given_cpus_it_cannot_have_runs_where_it_may_and_says_so():
    listener = listen("127.0.0.1", 0)
    ours, theirs = socket.socketpair()
    cmd = wire.command(listener.fileno(), theirs.fileno(), 1024, "warning", 0, cpus={4095})
    proc = subprocess.Popen(
        cmd, pass_fds=(listener.fileno(), theirs.fileno()), stderr=subprocess.PIPE
    )
    theirs.close()
    try:
        ours.close()  # no extender: it exits once it is up
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0
        assert b"cannot run on CPU 4095" in err
    finally:
        if proc.poll() is None:
            proc.kill()
        listener.close()


async def test_a_relay_whose_extender_is_gone_exits():
    listener = listen("127.0.0.1", 0)
    ours, theirs = socket.socketpair()
    cmd = wire.command(listener.fileno(), theirs.fileno(), 1024, "warning", 0)
    proc = subprocess.Popen(cmd, pass_fds=(listener.fileno(), theirs.fileno()))
    theirs.close()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        async with httpx.AsyncClient() as c:
            for _ in range(200):
                try:
                    if (await c.get(f"{url}/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
        ours.close()  # the extender has gone
        assert await asyncio.to_thread(proc.wait, 20) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        listener.close()


async def test_frames_carry_a_turns_items_together_and_refuse_nonsense():
    ours, theirs = socket.socketpair()
    reader, reader_side = await asyncio.open_unix_connection(sock=ours)
    _, writer = await asyncio.open_unix_connection(sock=theirs)
    outbox: wire.Outbox[wire.Push] = wire.Outbox(writer)
    outbox.put(wire.Push(1, "127.0.0.1", None, b"{}"), 2)
    outbox.put(wire.Push(2, None, "t", None), 0)
    await asyncio.sleep(0)  # the turn ends: one frame
    pushes = wire.decode_pushes(await wire.read_frame(reader))
    assert pushes == [wire.Push(1, "127.0.0.1", None, b"{}"), wire.Push(2, None, "t", None)]
    writer.write((wire.MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(wire.FrameError):
        await wire.read_frame(reader)
    writer.close()
    reader_side.close()


def test_an_ingest_port_in_use_is_a_start_up_error(capsys: pytest.CaptureFixture[str]):
    taken = listen("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        assert cli_main(["--port", "1", "--ingest-port", str(port)]) == 2
        assert f"cannot listen on 127.0.0.1:{port} (--ingest-port)" in capsys.readouterr().err
    finally:
        taken.close()


def test_the_relay_command_runs_at_the_configured_priority():
    cmd = wire.command(3, 4, 100, "info", 10, "c.pem", "k.pem")
    assert cmd[1:3] == ["-m", "scheduler_extender.relay"]
    assert cmd[cmd.index("--nice") + 1] == "10"
    assert cmd[-4:] == ["--ssl-certfile", "c.pem", "--ssl-keyfile", "k.pem"]
    assert "--cpus" not in cmd
    cmd = wire.command(3, 4, 100, "info", 10, cpus=frozenset({3, 0, 2}))
    assert cmd[cmd.index("--cpus") + 1] == "0,2,3"


@pytest.mark.parametrize("bad", ["", "a", "1,-2", "1,,2"])
def test_the_relay_refuses_a_cpu_list_that_is_not_one(bad: str, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_:
        wire.main(["--listen-fd", "3", "--link-fd", "4", "--max-bytes", "1", "--cpus", bad])
    assert exit_.value.code == 2
    assert "not a list of CPU numbers" in capsys.readouterr().err


async def test_with_settling_relayed_pushes_are_held_briefly_and_all_answered():
    async with running() as (app, url, own):
        ctx = app.state.ctx
        ctx.state.settle_s = 0.05
        supervisor = app.state.relay
        ctx.push_turns.verb()  # the scheduler is active: pushes are held
        bodies = [orjson.dumps(report(f"h{i}", [gpu(0)], seq=1)) for i in range(40)]
        answers = await asyncio.gather(*(post(url, b) for b in bodies))
        assert all(a.json()["accepted"] for a in answers)
        assert supervisor.held == 0
        ctx.state.settle()
        nodes = (await own.get("/debug/nodes")).json()["nodes"]
        assert {n["node"] for n in nodes} == {f"h{i}" for i in range(40)}
        metrics = (await own.get("/metrics")).text
        assert 'edgegpu_extender_request_duration_seconds_count{verb="telemetry"} 40.0' in metrics


def hold_pushes(app: Any) -> None:
    """Settling on and the scheduler active throughout: relayed pushes are held (``HOLD_S``)."""
    app.state.ctx.state.settle_s = 60.0
    app.state.ctx.push_turns._verb_at = time.monotonic() + 3600


def bodies(prefix: str, count: int) -> list[bytes]:
    """First pushes of ``count`` nodes."""
    return [orjson.dumps(report(f"{prefix}{i}", [gpu(0)], seq=1)) for i in range(count)]


async def test_held_pushes_are_answered_before_the_relay_stops():
    async with running() as (app, url, _own):
        hold_pushes(app)
        supervisor = app.state.relay
        relay_mod.HOLD_S, held_for = 60.0, relay_mod.HOLD_S  # held until the extender stops
        try:
            pending = asyncio.create_task(post(url, orjson.dumps(report("late", [gpu(0)]))))
            await wait_for(lambda: supervisor.held == 1)
            stopping = asyncio.create_task(supervisor.stop())
            answer = await pending
            await stopping
        finally:
            relay_mod.HOLD_S = held_for
        assert answer.status_code == 200
        assert answer.json()["accepted"] is True


async def test_a_long_queue_of_held_pushes_is_applied_without_waiting(monkeypatch):
    monkeypatch.setattr(relay_mod, "HOLD_S", 60.0)
    monkeypatch.setattr(relay_mod, "PAUSE_WHILE_HELD", False)  # all of them held at once
    monkeypatch.setattr(relay_mod, "MAX_HELD", 3)
    async with running() as (app, url, _own):
        hold_pushes(app)
        pushes = (post(url, b) for b in bodies("q", 3))
        answers = await asyncio.wait_for(asyncio.gather(*pushes), 20)
        assert [a.json()["accepted"] for a in answers] == [True] * 3


async def test_while_the_scheduler_is_active_held_pushes_go_in_short_steps(monkeypatch):
    # A step of the drain takes the pushes that fit in STEP_S (here none: one push a step), and the
    # loop turns between steps, so a scheduler request waits for at most one step.
    monkeypatch.setattr(relay_mod, "HOLD_S", 60.0)
    monkeypatch.setattr(relay_mod, "PAUSE_WHILE_HELD", False)  # all of them held at once
    monkeypatch.setattr(relay_mod, "STEP_S", 0.0)
    async with running() as (app, url, _own):
        hold_pushes(app)
        supervisor = app.state.relay
        pending = [asyncio.create_task(post(url, b)) for b in bodies("s", 4)]
        await wait_for(lambda: supervisor.held == 4)
        seen: list[int] = []

        async def watch() -> None:
            while supervisor.held:
                seen.append(supervisor.held)
                await asyncio.sleep(0)

        watching = asyncio.create_task(watch())
        await supervisor.drain()
        await watching
        answers = await asyncio.gather(*pending)
        assert [a.json()["accepted"] for a in answers] == [True] * 4
        assert sorted(set(seen), reverse=True) == [3, 2, 1]  # the first step ran before the watch


async def test_held_pushes_stored_together_each_get_their_own_answer(monkeypatch):
    # One step holds good pushes, two of the same node, a stale one and refused ones: the good
    # ones are stored together, and every push gets the answer it would get alone.
    monkeypatch.setattr(relay_mod, "HOLD_S", 60.0)
    monkeypatch.setattr(relay_mod, "PAUSE_WHILE_HELD", False)  # all of them held at once
    async with running() as (app, url, own):
        hold_pushes(app)
        supervisor = app.state.relay
        sent = [
            orjson.dumps(report("m1", [gpu(0), gpu(1)], seq=5)),
            b"{not json",
            orjson.dumps(report("m2", [gpu(0), gpu(1)], seq=1)),
            orjson.dumps(report("m1", [gpu(0, temperature_c=61.0), gpu(1)], seq=6)),
            orjson.dumps(report("m2", [gpu(0)], seq=1)),  # not newer than the one before
            orjson.dumps(report("m3", [gpu(0, temperature_c="hot")])),
        ]
        pending = [asyncio.create_task(post(url, body)) for body in sent]
        await wait_for(lambda: supervisor.held == len(sent))
        await supervisor.drain()
        answers = [await p for p in pending]
        assert [a.status_code for a in answers] == [200, 422, 200, 200, 200, 422]
        assert [a.json().get("accepted") for a in answers] == [True, None, True, True, False, None]
        assert "not newer" in answers[4].json()["reason"]
        app.state.ctx.state.settle()
        nodes = {n["node"]: n for n in (await own.get("/debug/nodes")).json()["nodes"]}
        assert set(nodes) == {"m1", "m2"}
        assert nodes["m1"]["gpus"][0]["temperature_c"] == 61.0
        assert len(nodes["m2"]["gpus"]) == 2


async def test_a_step_that_fails_to_store_answers_500_and_the_next_step_goes_on(monkeypatch):
    monkeypatch.setattr(relay_mod, "HOLD_S", 60.0)
    monkeypatch.setattr(relay_mod, "PAUSE_WHILE_HELD", False)  # all of them held at once
    async with running() as (app, url, _own):
        hold_pushes(app)
        supervisor, state = app.state.relay, app.state.ctx.state
        real, broken = state.ingest_many, [True]

        def flaky(reports: list[Any]) -> Any:
            if broken[0]:
                raise RuntimeError("storing failed")
            return real(reports)

        monkeypatch.setattr(state, "ingest_many", flaky)
        first = [asyncio.create_task(post(url, body)) for body in [*bodies("f", 2), b"[]"]]
        await wait_for(lambda: supervisor.held == 3)
        await supervisor.drain()
        answers = [await p for p in first]
        assert [a.status_code for a in answers] == [500, 500, 422]
        assert "storing failed" not in answers[0].text  # no internals in the answer
        broken[0] = False
        hold_pushes(app)
        second = asyncio.create_task(post(url, bodies("g", 1)[0]))
        await wait_for(lambda: supervisor.held == 1)
        await supervisor.drain()
        assert (await second).json()["accepted"] is True


@pytest.mark.parametrize("pause", [True, False])
async def test_frames_that_come_while_pushes_are_held_wait_for_the_drain(monkeypatch, pause):
    # While the scheduler is active, the extender reads the relay's next frames only when the
    # drain of the pushes held now starts: it is not woken again and again meanwhile.
    monkeypatch.setattr(relay_mod, "HOLD_S", 60.0)
    monkeypatch.setattr(relay_mod, "PAUSE_WHILE_HELD", pause)
    async with running() as (app, url, _own):
        hold_pushes(app)
        supervisor = app.state.relay
        first = asyncio.create_task(post(url, bodies("p", 1)[0]))
        await wait_for(lambda: supervisor.held == 1)
        later = [asyncio.create_task(post(url, b)) for b in bodies("r", 3)]
        if pause:
            await asyncio.sleep(0.5)
            assert supervisor.held == 1  # their frames wait in the socket
            while not all(p.done() for p in later):  # each drain reads what waited, in turn
                await supervisor.drain()
                await wait_for(lambda: supervisor.held > 0 or all(p.done() for p in later))
        else:
            await wait_for(lambda: supervisor.held == 4)
            await supervisor.drain()
        answers = [await p for p in (first, *later)]
        assert [a.json()["accepted"] for a in answers] == [True] * 4
        assert supervisor.held == 0
