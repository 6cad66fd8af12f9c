"""``kubectl edgegpu`` against the fake API server, reaching a real extender process through
the service proxy as kubectl plugins do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scheduler_extender import kubectl
from tests.builders import gpu, report
from tests.e2e.controlplane import free_port
from tests.fakes.fake_kube import FakeKube
from tests.harness import extender_process


@pytest.fixture
def extender() -> Iterator[str]:
    with extender_process(free_port()) as base:
        body = report("edge-1", [gpu(0, model="Tesla T4"), gpu(1, temperature_c=93.0,
                                 health="unhealthy", health_reasons=["xid:79"])])  # fmt: skip
        httpx.post(f"{base}/v1/telemetry", json=body, timeout=5).raise_for_status()
        yield base


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = kubectl.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_nodes_pods_and_explain_through_the_service_proxy(
    kube: FakeKube, kubeconfig: Path, extender: str, capsys: pytest.CaptureFixture[str]
) -> None:
    kube.services[("edgegpu-system", "edgegpu-extender:8888")] = extender
    kube.add_node("edge-1")
    kube.add_pod("trainer", node="edge-1", uid="uid-t", phase="Running", limits={"edgegpu.io/gpu-mem-block": "2"},
                 annotations={"edgegpu.io/gpu-index": "0", "edgegpu.io/gpu-uuid": "GPU-0000", "edgegpu.io/qos": "training"})  # fmt: skip
    kube.add_pod("web", node="edge-1", uid="uid-w", phase="Running")
    kube.add_pod("waiting", uid="uid-p", limits={"edgegpu.io/gpu-mem-block": "9"})

    code, out, _ = run(capsys, "--kubeconfig", str(kubeconfig), "nodes")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["NODE", "GPU", "MODEL"]
    assert "edge-1" in lines[1] and "Tesla T4" in lines[1] and "ok" in lines[1]
    assert "unhealthy" in lines[2] and "hot" in lines[2]

    code, out, _ = run(capsys, "--kubeconfig", str(kubeconfig), "-o", "json", "pods", "-A")
    assert code == 0
    (held,) = json.loads(out)
    assert (held["pod"], held["gpu"], held["uuid"], held["blocks"], held["qos"]) == (
        "trainer", "0", "GPU-0000", 2, "training")  # fmt: skip

    code, out, _ = run(capsys, "--kubeconfig", str(kubeconfig), "explain", "waiting")
    assert code == 0
    assert out.splitlines()[0] == "pod default/waiting: inference, asks 9 block(s)"
    assert "edge-1" in out and "exceeds every gpu" in out


def test_no_extender_behind_the_service_is_one_clear_line(
    kube: FakeKube, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--kubeconfig", str(kubeconfig), "nodes")
    assert code == 1 and out == ""
    assert err.startswith("kubectl edgegpu: GET ") and "503" in err and "\n" == err[-1]
    assert err.count("\n") == 1


def test_with_only_an_extender_url_nodes_work_and_the_rest_says_why_not(
    extender: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "no-kubeconfig")
    code, out, _ = run(capsys, "--kubeconfig", missing, "--extender-url", extender, "nodes")
    assert code == 0 and "edge-1" in out
    code, out, err = run(capsys, "--kubeconfig", missing, "--extender-url", extender, "pods")
    assert code == 1 and out == "" and "kubeconfig" in err
