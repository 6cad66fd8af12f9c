"""The extender's HTTP surface, tried as an attacker would: closed by default, every input bounded.

Content types a browser may send cross-site without asking, bodies over their cap or over what
may be held at once or slow to arrive, connections that never finish a request head, /debug/*
read from elsewhere than loopback, and bearer tokens long or many. Timed tests use real sockets against uvicorn on 127.0.0.1, with short
deadlines and generous margins: they wait for what must happen, never race a clock.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from fastapi import FastAPI

from node_agent.uplink.pusher import Pusher
from scheduler_extender.api import fast
from scheduler_extender.api.app import create_app
from scheduler_extender.api.bodies import BODY_TIMEOUT_S, BodyBudget
from scheduler_extender.api.server import uvicorn_options
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.k8s.auth import MAX_TOKEN_CHARS, AuthError, TokenReviewAuth
from scheduler_extender.telemetry.clock import FakeClock
from tests.builders import args_names, args_nodes, gpu, node_object, pod, report
from tests.extender.test_api_scheduler import RecordingBinder

JSON = {"content-type": "application/json"}
PATIENCE_S = 30.0
"""How long a test waits for what must happen (the deadlines it waits for are 1 s or less)."""


def client_for(app: FastAPI, peer: str = "127.0.0.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(peer, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://extender")


# -- content types --------------------------------------------------------------------------------

VERBS_AND_PUSH = ["/filter", "/prioritize", "/preempt", "/bind", "/v1/telemetry"]


@pytest.mark.parametrize("path", VERBS_AND_PUSH)
@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([("content-type", "text/plain")], id="text/plain"),
        pytest.param([("content-type", "text/plain; charset=utf-8")], id="text/plain charset"),
        pytest.param([("content-type", "application/x-www-form-urlencoded")], id="form"),
        pytest.param([("content-type", "multipart/form-data; boundary=x")], id="multipart"),
        pytest.param([], id="none"),
        pytest.param(
            [("content-type", "application/json"), ("content-type", "text/plain")], id="two"
        ),
    ],
)
async def test_a_body_a_browser_can_send_cross_site_is_refused_415_and_nothing_is_done(
    path: str, headers: list[tuple[str, str]]
) -> None:
    app = create_app(clock=FakeClock())
    body = (
        orjson.dumps(report("n1"))
        if path == "/v1/telemetry"
        else orjson.dumps(args_names(pod("p"), ["n1"]))
    )
    async with client_for(app) as client:
        resp = await client.post(path, content=body, headers=headers)
        assert resp.status_code == 415, resp.text
        assert "application/json" in resp.json()["error"]
        assert resp.headers["connection"] == "close"
        assert (await client.get("/debug/nodes")).json() == {"nodes": []}


async def test_json_with_parameters_is_taken_as_kube_scheduler_and_the_agent_send_it() -> None:
    app = create_app(clock=FakeClock())
    async with client_for(app) as client:
        charset = {"content-type": "Application/JSON; charset=utf-8"}
        push = await client.post(
            "/v1/telemetry", content=orjson.dumps(report("n1")), headers=charset
        )
        assert push.status_code == 200 and push.json()["accepted"] is True
        body = orjson.dumps(args_names(pod("p", blocks=None), ["n1"]))
        resp = await client.post("/filter", content=body, headers=charset)
        assert resp.status_code == 200 and resp.json()["NodeNames"] == ["n1"]


# -- body caps --------------------------------------------------------------------------------------


async def test_a_node_list_over_the_default_cap_is_refused_naming_the_flag_to_raise() -> None:
    """The default cap is sized for names only (nodeCacheCapable: true); full Node objects over
    it are refused, and the error says which flag raises it."""
    assert ExtenderSettings().max_request_bytes <= 8 * 1024 * 1024
    bulky = [node_object(f"n{i}") for i in range(900)]
    for node in bulky:
        node["metadata"]["annotations"] = {"padding": "x" * 10_000}
    app = create_app(clock=FakeClock())
    async with client_for(app) as client:
        resp = await client.post("/filter", json=args_nodes(pod(), bulky))
        assert resp.status_code == 200
        error = resp.json()["Error"]
        assert "--max-request-bytes" in error and "nodeCacheCapable: false" in error


async def test_a_chunked_body_that_never_ends_is_refused_once_past_the_cap() -> None:
    """No Content-Length, 64 KiB chunks for ever: read no further than the cap."""
    app = create_app(clock=FakeClock())
    cap = app.state.ctx.settings.max_request_bytes
    chunk = b" " * 65536
    pulled = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": chunk, "more_body": True}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/filter", "client": ("127.0.0.1", 1),
             "headers": [(b"content-type", b"application/json")]}  # fmt: skip
    await asyncio.wait_for(app(scope, receive, send), PATIENCE_S)
    assert pulled <= cap // len(chunk) + 1
    assert sent[0]["status"] == 200 and b"--max-request-bytes" in sent[1]["body"]
    assert app.state.ctx.request_bodies.used == 0


class Stalled:
    """A request whose body stops after its first bytes until ``go`` is set."""

    def __init__(self, app: FastAPI, path: str, declared: int, first: bytes, rest: bytes) -> None:
        self.go = asyncio.Event()
        self.sent: list[dict[str, Any]] = []
        self._parts = [first, rest]
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", b"%d" % declared)]  # fmt: skip
        scope = {"type": "http", "method": "POST", "path": path, "client": ("127.0.0.1", 1),
                 "headers": headers}  # fmt: skip
        self.task = asyncio.create_task(app(scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        if len(self._parts) == 1:
            await self.go.wait()
        body = self._parts.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(self._parts)}

    async def _send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])


async def until(check: Any) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.01)


async def test_pushes_over_what_may_be_held_at_once_get_503_with_retry_after() -> None:
    """However many connections send at once, the bodies held stay within the budget."""
    cap = 64 * 1024
    app = create_app(ExtenderSettings(max_telemetry_bytes=cap, max_inflight_telemetry_bytes=2 * cap),
                     clock=FakeClock())  # fmt: skip
    ctx = app.state.ctx
    good = orjson.dumps(report("n1"))
    slow = [Stalled(app, "/v1/telemetry", cap, b"{", b" " * (cap - 1)) for _ in range(2)]
    await until(lambda: ctx.push_bodies.used == 2 * cap)
    async with client_for(app) as client:
        refused = await client.post("/v1/telemetry", content=good, headers=JSON)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        for s in slow:
            s.go.set()
        await asyncio.wait_for(asyncio.gather(*(s.task for s in slow)), PATIENCE_S)
        assert [s.status for s in slow] == [422, 422]
        assert ctx.push_bodies.used == 0
        accepted = await client.post("/v1/telemetry", content=good, headers=JSON)
        assert accepted.status_code == 200 and accepted.json()["accepted"] is True
    registry = ctx.metrics.registry
    assert registry.get_sample_value(
        "edgegpu_extender_telemetry_reports_total", {"result": "busy"}
    ) == 1.0  # fmt: skip


async def test_a_verb_over_what_may_be_held_at_once_waits_then_answers_busy_in_its_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fast, "VERB_WAIT_S", 0.1)
    cap = 64 * 1024
    app = create_app(ExtenderSettings(max_request_bytes=cap, max_inflight_request_bytes=2 * cap),
                     clock=FakeClock())  # fmt: skip
    ctx = app.state.ctx
    slow = [Stalled(app, "/filter", cap, b"{", b" " * (cap - 1)) for _ in range(2)]
    await until(lambda: ctx.request_bodies.used == 2 * cap)
    body = orjson.dumps(args_names(pod("p", blocks=None), ["n1"]))
    async with client_for(app) as client:
        resp = await client.post("/filter", content=body, headers=JSON)
        assert resp.status_code == 200
        error = resp.json()["Error"]
        assert "busy" in error and "--max-inflight-request-bytes" in error
        assert (await client.post("/prioritize", content=body, headers=JSON)).json() == []
        for s in slow:
            s.go.set()
        await asyncio.wait_for(asyncio.gather(*(s.task for s in slow)), PATIENCE_S)
        assert ctx.request_bodies.used == 0
        ok = await client.post("/filter", content=body, headers=JSON)
        assert ok.json()["NodeNames"] == ["n1"]


async def test_a_verb_that_finds_room_within_its_wait_is_answered_in_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fast, "VERB_WAIT_S", PATIENCE_S)
    cap = 64 * 1024
    app = create_app(ExtenderSettings(max_request_bytes=cap, max_inflight_request_bytes=cap),
                     clock=FakeClock())  # fmt: skip
    ctx = app.state.ctx
    slow = Stalled(app, "/filter", cap, b"{", b" " * (cap - 1))
    await until(lambda: ctx.request_bodies.used == cap)
    body = orjson.dumps(args_names(pod("p", blocks=None), ["n1"]))
    async with client_for(app) as client:
        waiting = asyncio.create_task(client.post("/filter", content=body, headers=JSON))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        slow.go.set()
        resp = await asyncio.wait_for(waiting, PATIENCE_S)
        assert resp.json()["NodeNames"] == ["n1"]
    await slow.task


async def test_a_request_that_gives_up_waiting_for_room_holds_none_of_it() -> None:
    """Waiters are served in arrival order; one cancelled (its client gone) leaves no trace."""
    budget = BodyBudget(100)
    assert await budget.acquire(100, 0.0)
    gone = asyncio.create_task(budget.acquire(60, PATIENCE_S))
    first = asyncio.create_task(budget.acquire(70, PATIENCE_S))
    second = asyncio.create_task(budget.acquire(30, PATIENCE_S))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    budget.release(100)
    assert await first and await second
    assert budget.used == 100
    assert not await budget.acquire(1, 0.0)
    assert not await budget.acquire(101, PATIENCE_S)  # could never fit: refused at once


async def test_an_agent_refused_for_want_of_room_backs_off() -> None:
    app = create_app(clock=FakeClock())
    budget = app.state.ctx.push_bodies
    assert await budget.acquire(budget.capacity, 0.0)  # every byte held by other pushes
    now = [1000.0]
    async with client_for(app) as client:
        pusher = Pusher(["http://extender"], client, clock=lambda: now[0])
        body = orjson.dumps(report("n1"))
        assert set((await pusher.push(body)).results.values()) == {"failed"}
        assert set((await pusher.push(body)).results.values()) == {"backoff"}
        budget.release(budget.capacity)
        now[0] += 60.0
        assert set((await pusher.push(body)).results.values()) == {"ok"}


# -- head deadline, over real sockets ---------------------------------------------------------------


@contextmanager
def serving(
    app: FastAPI, head_timeout_s: float | None = None, **options: Any
) -> Iterator[tuple[int, uvicorn.Server]]:
    """uvicorn as the extender runs it (and ``options``), in a thread, on a free port of
    127.0.0.1."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    config = uvicorn.Config(
        app, lifespan="off", **uvicorn_options(head_timeout_s=head_timeout_s), **options
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + PATIENCE_S
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        yield listener.getsockname()[1], server
    finally:
        server.should_exit = True
        thread.join(PATIENCE_S)
        listener.close()


def read_until_closed(conn: socket.socket) -> tuple[bytes, bool]:
    """Everything the server sends, and whether it then closed the connection."""
    conn.settimeout(PATIENCE_S)
    data = b""
    try:
        while chunk := conn.recv(65536):
            data += chunk
    except TimeoutError:
        return data, False
    except ConnectionResetError:
        pass
    return data, True


def read_response(conn: socket.socket) -> bytes:
    """One response with a Content-Length, leaving the connection open."""
    conn.settimeout(PATIENCE_S)
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))  # fmt: skip
    while len(body) < length:
        body += conn.recv(65536)
    return head


def test_connections_that_never_send_a_byte_are_closed_after_the_head_timeout() -> None:
    """Idle connections were held for ever, each a file descriptor."""
    with serving(create_app(), head_timeout_s=0.5) as (port, server):
        conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
        try:
            for conn in conns:
                assert read_until_closed(conn) == (b"", True)
        finally:
            for conn in conns:
                conn.close()
        deadline = time.monotonic() + PATIENCE_S
        while server.server_state.connections:
            assert time.monotonic() < deadline, len(server.server_state.connections)
            time.sleep(0.02)


def test_a_head_sent_a_byte_at_a_time_is_answered_408_and_closed() -> None:
    with (
        serving(create_app(), head_timeout_s=0.5) as (port, _),
        socket.create_connection(("127.0.0.1", port)) as conn,
    ):
        conn.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\n")
        conn.settimeout(0.1)
        answer = b""
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline:
            try:
                conn.sendall(b"X")
                chunk = conn.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
        assert b"did not arrive in time" in answer


def test_a_kept_alive_connection_idles_past_the_head_timeout_and_its_next_head_is_timed() -> None:
    """The head deadline runs from a request's first byte, not through the idle time between
    requests (uvicorn's keep-alive, 75 s, governs that)."""
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with (
        serving(create_app(), head_timeout_s=0.3) as (port, _),
        socket.create_connection(("127.0.0.1", port)) as conn,
    ):
        conn.sendall(request)
        assert read_response(conn).startswith(b"HTTP/1.1 200")
        time.sleep(1.5)  # five head deadlines with nothing sent
        conn.sendall(request)
        assert read_response(conn).startswith(b"HTTP/1.1 200")
        conn.sendall(b"GET /healthz HTTP/1.1\r\n")
        answer, closed = read_until_closed(conn)
        assert answer.startswith(b"HTTP/1.1 408") and closed


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n",
            id="a route that reads no body",
        ),
        pytest.param(
            b"POST /v1/telemetry HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 1000000\r\n\r\n",
            id="a refused push",
        ),
        pytest.param(
            b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 999999999\r\n\r\n",
            id="a verb over the cap",
        ),
    ],
)
def test_an_answer_sent_before_the_body_arrived_closes_the_connection(head: bytes) -> None:
    """Else the rest of the body is read and thrown away for as long as the client sends it."""
    with (
        serving(create_app(), head_timeout_s=5.0) as (port, _),
        socket.create_connection(("127.0.0.1", port)) as conn,
    ):
        conn.sendall(head + b"{")
        answer, closed = read_until_closed(conn)
        assert answer.startswith(b"HTTP/1.1 "), answer[:80]
        assert closed


# -- /debug ---------------------------------------------------------------------------------------


async def test_debug_and_the_status_page_answer_loopback_clients_only_by_default() -> None:
    app = create_app(ExtenderSettings(), clock=FakeClock())
    explain = orjson.dumps(args_names(pod("p"), ["n1"]))
    async with client_for(app, peer="10.0.0.7") as remote, client_for(app) as local:
        for path in ("/", "/debug/nodes", "/debug/nodes/n1", "/debug/policy", "/debug/remediation"):
            assert (await remote.get(path)).status_code == 404, path
        assert (
            await remote.post("/debug/explain", content=explain, headers=JSON)
        ).status_code == 404
        for path in ("/", "/debug/nodes", "/debug/policy", "/debug/remediation"):
            assert (await local.get(path)).status_code == 200, path
        assert (
            await local.post("/debug/explain", content=explain, headers=JSON)
        ).status_code == 200
        assert (await remote.get("/healthz")).status_code == 200


async def test_no_debug_output_shows_a_pod_uid() -> None:
    """A pod's uid is what a bind needs besides its name: /debug gives it to nobody."""
    uid = "uid-5f0c1a2b-secret"
    clock = FakeClock()
    app = create_app(ExtenderSettings(debug_endpoints="on"), clock=clock, binder=RecordingBinder())
    async with client_for(app) as client:
        process = {"pid": 7, "pod_uid": uid, "used_mib": 100.0}
        await client.post("/v1/telemetry", json=report("a", [gpu(0, processes=[process])]))
        spec = pod("p", uid=uid)
        await client.post("/filter", json=args_names(spec, ["a"]))
        bound = await client.post(
            "/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": uid, "Node": "a"}
        )
        assert bound.json() == {"Error": ""}
        node = (await client.get("/debug/nodes/a")).json()
        assert node["reservations"][0]["pod"] == "default/p"
        assert node["gpus"][0]["processes"][0]["pod"] == "default/p"
        pages = [
            await client.get(path)
            for path in (
                "/",
                "/debug/nodes",
                "/debug/nodes/a",
                "/debug/policy",
                "/debug/remediation",
            )
        ]
        pages.append(await client.post("/debug/explain", json=args_names(spec, ["a"])))
        for page in pages:
            assert page.status_code == 200
            assert uid not in page.text, page.url


# -- agent tokens ---------------------------------------------------------------------------------


class Reviews:
    """The API server's TokenReview, as a fake: ``good`` is the agent's token, all else refused."""

    def __init__(self, good: str) -> None:
        self.good = good
        self.calls = 0

    def __call__(self, token: str) -> dict[str, Any]:
        self.calls += 1
        if token != self.good:
            return {"authenticated": False, "error": "invalid bearer token"}
        extra = {TokenReviewAuth.POD_NAME: ["agent-n1"], TokenReviewAuth.POD_UID: ["uid-1"],
                 TokenReviewAuth.NODE_NAME: ["n1"]}  # fmt: skip
        return {"authenticated": True, "audiences": ["edgegpu"],
                "user": {"username": "system:serviceaccount:edgegpu-system:edgegpu-node-agent",
                         "extra": extra}}  # fmt: skip


def token_review(reviews: Reviews) -> TokenReviewAuth:
    """Agent authentication by TokenReview, at a time that never moves: nothing expires."""
    return TokenReviewAuth(reviews, lambda ns, name: None, namespace="edgegpu-system",
                           service_account="edgegpu-node-agent", audience="edgegpu",
                           clock=lambda: 1000.0)  # fmt: skip


async def test_a_token_longer_than_a_projected_one_is_refused_401_before_any_review(
    tmp_path: Path,
) -> None:
    reviews = Reviews("agent-token")
    auth = token_review(reviews)
    with pytest.raises(AuthError) as refused:
        await auth.authenticate("x" * (MAX_TOKEN_CHARS + 1))
    assert refused.value.status == 401 and "longer than" in str(refused.value)
    assert reviews.calls == 0 and auth.cached == (0, 0)
    tokens = tmp_path / "tokens"
    tokens.write_text("agent-token n1\n")
    app = create_app(ExtenderSettings(static_token_file=tokens), clock=FakeClock())
    async with client_for(app, peer="10.0.0.7") as client:
        for token in ("x" * 60_000, "agent-token" + "x" * MAX_TOKEN_CHARS):
            resp = await client.post("/v1/telemetry", content=orjson.dumps(report("n1")),
                                     headers={**JSON, "authorization": f"Bearer {token}"})  # fmt: skip
            assert resp.status_code == 401 and "longer than" in resp.json()["error"]
        accepted = await client.post("/v1/telemetry", content=orjson.dumps(report("n1")),
                                     headers={**JSON, "authorization": "Bearer agent-token"})  # fmt: skip
        assert accepted.status_code == 200


async def test_a_flood_of_distinct_bad_tokens_takes_bounded_memory_and_keeps_the_agents_cached() -> (
    None
):
    """Each distinct token was kept whole, and only expired ones were ever dropped: twelve
    thousand bad tokens of 60 KB in a minute took the extender past its memory limit."""
    reviews = Reviews("agent-token")
    auth = token_review(reviews)
    assert (await auth.authenticate("agent-token")).node == "n1"
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(12_000):
            with pytest.raises(AuthError):
                await auth.authenticate(f"{i:08d}" + "x" * (MAX_TOKEN_CHARS - 8))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 8 * 1024 * 1024, held  # the tokens themselves were 96 MiB
    assert auth.cached == (1, 1_000)
    assert reviews.calls == 12_001
    assert (await auth.authenticate("agent-token")).node == "n1"
    assert reviews.calls == 12_001  # still cached
    with pytest.raises(AuthError):
        await auth.authenticate(f"{11_999:08d}" + "x" * (MAX_TOKEN_CHARS - 8))
    assert reviews.calls == 12_001  # a recent refusal is cached too


# -- push body deadline ---------------------------------------------------------------------------


async def test_a_push_body_that_stops_arriving_is_cut_off_sooner_than_a_verbs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A push had a verb's 30 s to send its body: sixteen pushes trickling a megabyte each held
    the whole push budget, and every agent's report was refused meanwhile."""
    assert fast.PUSH_BODY_TIMEOUT_S < BODY_TIMEOUT_S
    monkeypatch.setattr(fast, "PUSH_BODY_TIMEOUT_S", 0.2)
    app = create_app(clock=FakeClock())
    ctx = app.state.ctx
    push = Stalled(app, "/v1/telemetry", 1000, b"{", b" " * 999)
    verb = Stalled(app, "/filter", 1000, b"{", b" " * 999)
    await asyncio.wait_for(push.task, PATIENCE_S)
    assert push.status == 408 and ctx.push_bodies.used == 0
    assert not verb.task.done()  # a verb's body still has its own deadline
    verb.go.set()
    await asyncio.wait_for(verb.task, PATIENCE_S)
    assert verb.status == 200 and ctx.request_bodies.used == 0


def test_the_extender_raises_its_open_files_limit_so_idle_peers_cannot_use_it_up() -> None:
    """Each connection holds a file (a TLS handshake for up to a minute): started with a soft
    limit of 256 under a higher hard one, the extender serves with the hard one."""
    import resource
    import subprocess
    import sys

    from tests.k8s.test_tls_and_cli import ROOT, free_port, wait_up

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip("this machine's hard limit leaves nothing to raise")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler_extender", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)),
    )  # fmt: skip
    try:
        wait_up(f"http://127.0.0.1:{port}/healthz", True, proc)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        (line,) = [x for x in limits.splitlines() if x.startswith("Max open files")]
        # an infinite hard limit is left alone: the soft one cannot be raised to it
        expected = "256" if hard == resource.RLIM_INFINITY else str(hard)
        assert line.split()[3] == expected, line
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
