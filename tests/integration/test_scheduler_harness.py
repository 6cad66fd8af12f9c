"""The extender over a real socket, driven as kube-scheduler drives it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from scheduler_extender.api.app import create_app
from scheduler_extender.config import ExtenderSettings
from tests.builders import gpu, node_object, pod, report
from tests.harness import HTTPExtenderHarness


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = _free_port()
    app = create_app(ExtenderSettings(port=port, path_prefix="/scheduler"))
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off"
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=0.5).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    reports = [
        report(
            "rack-a-cool",
            [gpu(0, temperature_c=40.0), gpu(1, temperature_c=42.0)],
            labels={"edgegpu.io/rack": "a"},
        ),
        report("rack-a-warm", [gpu(0, temperature_c=75.0)], labels={"edgegpu.io/rack": "a"}),
        report("rack-b-hot", [gpu(0, temperature_c=92.0)], labels={"edgegpu.io/rack": "b"}),
        report("rack-b-sick", [gpu(0, health="unhealthy")], labels={"edgegpu.io/rack": "b"}),
    ]
    for r in reports:
        assert httpx.post(f"{base}/v1/telemetry", json=r).status_code == 200
    yield base
    srv.should_exit = True
    thread.join(timeout=5)


NODES = [node_object(n) for n in ("rack-a-cool", "rack-a-warm", "rack-b-hot", "rack-b-sick")]


@pytest.mark.parametrize("cache_capable", [True, False], ids=["nodeCacheCapable", "full-nodes"])
def test_a_training_pod_lands_on_the_coolest_node_in_both_modes(server, cache_capable):
    harness = HTTPExtenderHarness(f"{server}/scheduler", weight=2, node_cache_capable=cache_capable)
    try:
        chosen, outcome, scores = harness.schedule(pod("train-0", qos="training"), NODES)
        # Filter answers the best node alone: the others are left out, and the scheduler
        # takes it without scoring.
        assert chosen == "rack-a-cool" and outcome.feasible == ["rack-a-cool"]
        assert outcome.failed == {} and outcome.unresolvable == {} and scores == {}
    finally:
        harness.close()


def test_a_single_feasible_node_is_chosen_without_prioritize(server):
    harness = HTTPExtenderHarness(f"{server}/scheduler")
    try:
        chosen, outcome, scores = harness.schedule(pod("solo", qos="training"), NODES[1:])
        assert chosen == "rack-a-warm" and scores == {}
        assert outcome.feasible == ["rack-a-warm"]
    finally:
        harness.close()


def test_the_nominated_node_alone_is_filtered(server):
    harness = HTTPExtenderHarness(f"{server}/scheduler")
    try:
        assert harness.filter(pod("nominated"), [NODES[2]]).failed == {
            "rack-b-hot": "edgegpu: gpu too hot"
        }
    finally:
        harness.close()


def test_bind_without_a_cluster_fails_clearly_and_does_not_reserve(server):
    harness = HTTPExtenderHarness(f"{server}/scheduler")
    try:
        p = pod("b0", qos="inference")
        harness.filter(p, NODES)
        assert "no binder configured" in harness.bind(p, "rack-a-cool")
        nodes = httpx.get(f"{server}/debug/nodes").json()["nodes"]
        assert all(n["reservations"] == [] for n in nodes)
    finally:
        harness.close()


def test_answers_come_well_inside_the_schedulers_timeout(server):
    harness = HTTPExtenderHarness(f"{server}/scheduler", http_timeout_s=5.0)
    try:
        many = [node_object(f"n{i}") for i in range(2000)]
        start = time.perf_counter()
        outcome = harness.filter(pod("big", qos="inference"), many)
        (best,) = outcome.feasible  # unknown nodes fail open for inference: one of them
        assert best in {n["metadata"]["name"] for n in many}
        assert time.perf_counter() - start < 5.0
    finally:
        harness.close()
