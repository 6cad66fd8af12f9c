"""``kubectl edgegpu`` against the fake API server, reaching a real extender process over HTTPS.

The fake API server speaks no port-forward websocket: the plugin's port-forward is replaced at
that boundary by a TCP connection to the extender on 127.0.0.1, a loopback client as the
kubelet's port-forward is inside the pod. Everything above it is the plugin's own: choosing the
pod, the CA from ConfigMap edgegpu-ca, TLS for edgegpu-extender.<namespace>.svc, /debug/*.
"""

from __future__ import annotations

import json
import signal
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes.client.exceptions import ApiException

from scheduler_extender.cli import kubectl
from tests.builders import gpu, report
from tests.fakes.fake_kube import FakeKube
from tests.k8s.test_tls_and_cli import self_signed, start, wait_up

NS = "edgegpu-system"
NAMES = f"DNS:edgegpu-extender.{NS}.svc,DNS:edgegpu-extender-headless.{NS}.svc"


class Extender:
    """An extender process serving HTTPS on 127.0.0.1 with a certificate of its own CA."""

    def __init__(self, port: int, ca: Path) -> None:
        self.port, self.ca = port, ca
        self.opened: list[tuple[str, str, int]] = []

    def forward(self, api: Any, namespace: str, pod: str, port: int) -> socket.socket:
        """The port-forward, as a loopback TCP connection to this extender."""
        self.opened.append((namespace, pod, port))
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)


@pytest.fixture
def extender(tmp_path: Path) -> Iterator[Extender]:
    (tmp_path / "server").mkdir()
    crt, key = self_signed(tmp_path / "server", f"{NAMES},IP:127.0.0.1")
    proc, port = start("--tls-cert-file", str(crt), "--tls-key-file", str(key))
    try:
        trust = ssl.create_default_context(cafile=str(crt))
        wait_up(f"https://127.0.0.1:{port}/healthz", trust, proc)
        body = report("edge-1", [gpu(0, model="Tesla T4"), gpu(1, temperature_c=93.0,
                                 health="unhealthy", health_reasons=["xid:79"])])  # fmt: skip
        httpx.post(f"https://127.0.0.1:{port}/v1/telemetry", json=body, verify=trust,
                   timeout=10).raise_for_status()  # fmt: skip
        yield Extender(port, crt)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)


def extender_pod(kube: FakeKube, name: str, *, phase: str = "Running", ready: bool) -> None:
    pod = kube.add_pod(name, NS, phase=phase, labels={"app.kubernetes.io/name": "edgegpu-extender"})
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    kube.put("pods", pod)


def ca_configmap(kube: FakeKube, pem: str) -> None:
    kube.put("configmaps", {"metadata": {"name": "edgegpu-ca", "namespace": NS},
                            "data": {"ca.crt": pem}})  # fmt: skip


def run(capsys: pytest.CaptureFixture[str], *args: str, extender: Extender | None = None
        ) -> tuple[int, str, str]:  # fmt: skip
    code = kubectl.main(list(args), **({"forward": extender.forward} if extender else {}))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_nodes_pods_and_explain_through_a_port_forward_to_the_ready_extender_pod(
    kube: FakeKube, kubeconfig: Path, extender: Extender, capsys: pytest.CaptureFixture[str]
) -> None:
    ca_configmap(kube, extender.ca.read_text())
    extender_pod(kube, "edgegpu-extender-a", ready=False)
    extender_pod(kube, "edgegpu-extender-b", ready=True)
    extender_pod(kube, "edgegpu-extender-0", phase="Pending", ready=False)
    kube.add_node("edge-1")
    kube.add_pod("trainer", node="edge-1", uid="uid-t", phase="Running", limits={"edgegpu.io/gpu-mem-block": "2"},
                 annotations={"edgegpu.io/gpu-index": "0", "edgegpu.io/gpu-uuid": "GPU-0000", "edgegpu.io/qos": "training"})  # fmt: skip
    kube.add_pod("web", node="edge-1", uid="uid-w", phase="Running")
    kube.add_pod("waiting", uid="uid-p", limits={"edgegpu.io/gpu-mem-block": "9"})

    code, out, err = run(capsys, "--kubeconfig", str(kubeconfig), "nodes", extender=extender)
    assert code == 0, err
    assert extender.opened[0] == (NS, "edgegpu-extender-b", 8888)
    lines = out.splitlines()  # /debug/nodes answered: the forwarded client is loopback
    assert lines[0].split()[:3] == ["NODE", "GPU", "MODEL"]
    assert "edge-1" in lines[1] and "Tesla T4" in lines[1] and "ok" in lines[1]
    assert "unhealthy" in lines[2] and "hot" in lines[2]

    code, out, _ = run(capsys, "--kubeconfig", str(kubeconfig), "-o", "json", "pods", "-A")
    assert code == 0
    code, after, _ = run(capsys, "pods", "-A", "-o", "json", "--kubeconfig", str(kubeconfig))
    assert code == 0 and after == out  # flags after the command, as README and kubectl have them
    (held,) = json.loads(out)
    assert (held["pod"], held["gpu"], held["uuid"], held["blocks"], held["qos"]) == (
        "trainer", "0", "GPU-0000", 2, "training")  # fmt: skip

    code, out, _ = run(capsys, "--kubeconfig", str(kubeconfig), "explain", "waiting",
                       extender=extender)  # fmt: skip
    assert code == 0
    assert out.splitlines()[0] == "pod default/waiting: inference, asks 9 block(s)"
    assert "edge-1" in out and "exceeds every gpu" in out


def test_with_no_ready_extender_pod_a_running_one_is_reached(
    kube: FakeKube, kubeconfig: Path, extender: Extender, capsys: pytest.CaptureFixture[str]
) -> None:
    ca_configmap(kube, extender.ca.read_text())
    extender_pod(kube, "edgegpu-extender-a", ready=False)
    code, out, err = run(capsys, "--kubeconfig", str(kubeconfig), "nodes", extender=extender)
    assert code == 0 and "edge-1" in out, err
    assert extender.opened == [(NS, "edgegpu-extender-a", 8888)] * 2  # nodes, then remediation


def test_an_extender_certificate_of_another_ca_is_refused_in_one_line(
    kube: FakeKube, kubeconfig: Path, extender: Extender, capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:  # fmt: skip
    other, _ = self_signed(tmp_path, NAMES)
    ca_configmap(kube, other.read_text())
    extender_pod(kube, "edgegpu-extender-a", ready=True)
    code, out, err = run(capsys, "--kubeconfig", str(kubeconfig), "nodes", extender=extender)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith(f"kubectl edgegpu: TLS to edgegpu-extender.{NS}.svc")
    assert "certificate verify failed" in err and f"the CA in ConfigMap {NS}/edgegpu-ca" in err


def test_a_certificate_for_another_name_is_refused(
    kube: FakeKube, kubeconfig: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    crt, key = self_signed(tmp_path, "DNS:elsewhere.example,IP:127.0.0.1")
    proc, port = start("--tls-cert-file", str(crt), "--tls-key-file", str(key))
    try:
        wait_up(f"https://127.0.0.1:{port}/healthz", ssl.create_default_context(cafile=str(crt)),
                proc)  # fmt: skip
        ca_configmap(kube, crt.read_text())
        extender_pod(kube, "edgegpu-extender-a", ready=True)
        code, _, err = run(capsys, "--kubeconfig", str(kubeconfig), "nodes",
                           extender=Extender(port, crt))  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
    assert code == 1 and "Hostname mismatch" in err and err.count("\n") == 1


def test_without_the_ca_configmap_the_system_cas_are_tried_and_the_error_says_so(
    kube: FakeKube, kubeconfig: Path, extender: Extender, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:  # fmt: skip
    other, _ = self_signed(tmp_path, NAMES)
    monkeypatch.setenv("SSL_CERT_FILE", str(other))  # the "system" CAs, which do not sign it
    extender_pod(kube, "edgegpu-extender-a", ready=True)
    code, _, err = run(capsys, "--kubeconfig", str(kubeconfig), "nodes", extender=extender)
    assert code == 1 and err.count("\n") == 1 and "certificate verify failed" in err
    assert f"the system CAs, as ConfigMap {NS}/edgegpu-ca was not read" in err
    assert "(not found)" in err and "--extender-ca" in err

    code, out, err = run(capsys, "--kubeconfig", str(kubeconfig), "--extender-ca",
                         str(extender.ca), "nodes", extender=extender)  # fmt: skip
    assert code == 0 and "edge-1" in out, err


def test_no_running_extender_pod_is_one_clear_line(
    kube: FakeKube, kubeconfig: Path, extender: Extender, capsys: pytest.CaptureFixture[str]
) -> None:
    extender_pod(kube, "edgegpu-extender-a", phase="Pending", ready=False)
    code, out, err = run(capsys, "--kubeconfig", str(kubeconfig), "nodes", extender=extender)
    assert code == 1 and out == "" and extender.opened == []
    assert err == (
        f"kubectl edgegpu: no running extender pod (app.kubernetes.io/name=edgegpu-extender) in {NS}\n"
    )


def test_a_refused_port_forward_is_one_line_naming_the_pod(
    kube: FakeKube, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def forbidden(api: Any, namespace: str, pod: str, port: int) -> socket.socket:
        raise ApiException(status=0, reason="Handshake status 403 Forbidden")

    extender_pod(kube, "edgegpu-extender-a", ready=True)
    code = kubectl.main(["--kubeconfig", str(kubeconfig), "nodes"], forward=forbidden)
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert f"port-forward to pod {NS}/edgegpu-extender-a:8888: Handshake status 403" in err


def test_a_port_forward_that_never_connects_ends_at_the_request_timeout(
    kube: FakeKube, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    released = threading.Event()

    def hangs(api: Any, namespace: str, pod: str, port: int) -> socket.socket:
        released.wait()
        raise ConnectionError("released")

    extender_pod(kube, "edgegpu-extender-a", ready=True)
    try:
        code = kubectl.main(["--kubeconfig", str(kubeconfig), "--request-timeout", "2", "nodes"],
                            forward=hangs)  # fmt: skip
    finally:
        released.set()
    err = capsys.readouterr().err
    assert code == 1 and "no connection within 2 s" in err and err.count("\n") == 1


def test_with_only_an_extender_url_nodes_work_and_the_rest_says_why_not(
    extender: Extender, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "no-kubeconfig")
    url = f"https://127.0.0.1:{extender.port}"
    code, out, err = run(capsys, "--kubeconfig", missing, "--extender-url", url, "--extender-ca",
                         str(extender.ca), "nodes")  # fmt: skip
    assert code == 0 and "edge-1" in out, err
    code, out, err = run(capsys, "--kubeconfig", missing, "--extender-url", url, "pods")
    assert code == 1 and out == "" and "kubeconfig" in err


def test_an_extender_url_is_checked_against_ssl_cert_file_or_the_system_cas(
    extender: Extender, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    args = ("--kubeconfig", str(tmp_path / "none"), "--extender-url",
            f"https://127.0.0.1:{extender.port}/", "nodes")  # fmt: skip
    monkeypatch.setenv("SSL_CERT_FILE", str(extender.ca))
    code, out, err = run(capsys, *args)
    assert code == 0 and "edge-1" in out, err
    other, _ = self_signed(tmp_path, NAMES)
    monkeypatch.setenv("SSL_CERT_FILE", str(other))
    code, out, err = run(capsys, *args)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert f"TLS to https://127.0.0.1:{extender.port}/" in err
    assert "certificate verify failed" in err and "the system CAs" in err
