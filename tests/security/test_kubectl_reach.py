"""``kubectl edgegpu``'s own port-forward: the kubernetes client's websocket, the channel protocol.

A stand-in for the API server's pods/portforward (``v4.channel.k8s.io``: per port a data channel
and an error channel, each opened by a frame naming the port) forwards the data channel to an
extender serving HTTPS on 127.0.0.1, as the kubelet forwards inside the pod. What a real API
server and kubelet do beyond that protocol is not modelled here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import signal
import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from websocket import ABNF

from scheduler_extender.cli import kubectl, reach
from tests.fakes.fake_kube import FakeKube
from tests.k8s.test_tls_and_cli import self_signed, start, wait_up

NS = "edgegpu-system"
HOST = f"edgegpu-extender.{NS}.svc"
WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    head = _exactly(sock, 2)
    length = head[1] & 0x7F
    if length == 126:
        (length,) = struct.unpack("!H", _exactly(sock, 2))
    elif length == 127:
        (length,) = struct.unpack("!Q", _exactly(sock, 8))
    mask = _exactly(sock, 4) if head[1] & 0x80 else b"\0\0\0\0"
    return head[0] & 0x0F, bytes(b ^ mask[i % 4] for i, b in enumerate(_exactly(sock, length)))


def _frame(payload: bytes, opcode: int = ABNF.OPCODE_BINARY) -> bytes:
    return ABNF(fin=1, opcode=opcode, mask_value=0, data=payload).format()


class PortForwardServer:
    """Answers pods/portforward websockets, forwarding each data channel to ``target``."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.threads.append(threading.Thread(target=self._serve, args=(conn,), daemon=True))
            self.threads[-1].start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            line, *rest = head.decode().split("\r\n")
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in rest if h)
            }
            self.requests.append((line, headers))
            accept = base64.b64encode(hashlib.sha1(
                (headers["sec-websocket-key"] + WEBSOCKET_GUID).encode()).digest()).decode()  # fmt: skip
            conn.sendall(f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                         f"Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n"
                         f"Sec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n".encode())  # fmt: skip
            port = struct.pack("<H", 8888)
            conn.sendall(_frame(b"\x00" + port) + _frame(b"\x01" + port))
            with socket.create_connection(("127.0.0.1", self.target), timeout=10) as pod:
                back = threading.Thread(target=self._to_client, args=(pod, conn), daemon=True)
                back.start()
                while True:
                    opcode, data = _read_frame(conn)
                    if opcode == ABNF.OPCODE_CLOSE:
                        conn.sendall(_frame(data, ABNF.OPCODE_CLOSE))
                        break
                    if opcode == ABNF.OPCODE_BINARY and data[:1] == b"\x00":
                        pod.sendall(data[1:])
                pod.shutdown(socket.SHUT_RDWR)
                back.join(10)

    @staticmethod
    def _to_client(pod: socket.socket, conn: socket.socket) -> None:
        try:
            while data := pod.recv(65536):
                conn.sendall(_frame(b"\x00" + data))
        except OSError:
            pass

    def forward(self) -> reach.PortForward:
        """The plugin's own port-forward, through an API client that points here."""
        cfg = client.Configuration(host=self.url, api_key={"BearerToken": "reader-token"},
                                   api_key_prefix={"BearerToken": "Bearer"})  # fmt: skip
        here = client.ApiClient(cfg)
        return lambda api, namespace, pod, port: reach.port_forward(here, namespace, pod, port)

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self.listener.close()
        for thread in self.threads:
            thread.join(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeKube, Path, Path, PortForwardServer]]:
    """The fake API server with one Ready extender pod, the extender, and its port-forward."""
    crt, key = self_signed(tmp_path, f"DNS:{HOST},IP:127.0.0.1")
    proc, port = start("--tls-cert-file", str(crt), "--tls-key-file", str(key))
    server = PortForwardServer(port)
    try:
        wait_up(f"https://127.0.0.1:{port}/healthz", ssl.create_default_context(cafile=str(crt)),
                proc)  # fmt: skip
        with FakeKube() as kube:
            pod = kube.add_pod("edgegpu-extender-a", NS, phase="Running",
                               labels={"app.kubernetes.io/name": "edgegpu-extender"})  # fmt: skip
            pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
            kube.put("pods", pod)
            yield kube, kube.kubeconfig(tmp_path / "kubeconfig"), crt, server
    finally:
        server.close()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)


def test_the_port_forward_carries_verified_https_to_the_pod_where_debug_answers(
    cluster: tuple[FakeKube, Path, Path, PortForwardServer], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    kube, kubeconfig, ca, server = cluster
    kube.put("configmaps", {"metadata": {"name": "edgegpu-ca", "namespace": NS},
                            "data": {"ca.crt": ca.read_text()}})  # fmt: skip
    code = kubectl.main(["--kubeconfig", str(kubeconfig), "-o", "json", "nodes"],
                        forward=server.forward())  # fmt: skip
    out = capsys.readouterr()
    assert code == 0 and json.loads(out.out) == [] and out.err == ""
    line, headers = server.requests[0]
    assert (
        line
        == f"GET /api/v1/namespaces/{NS}/pods/edgegpu-extender-a/portforward?ports=8888 HTTP/1.1"
    )
    assert headers["authorization"] == "Bearer reader-token"
    assert "v4.channel.k8s.io" in headers["sec-websocket-protocol"]


def test_over_the_port_forward_a_certificate_of_another_ca_is_one_line(
    cluster: tuple[FakeKube, Path, Path, PortForwardServer], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    kube, kubeconfig, _, server = cluster
    (tmp_path / "other").mkdir()
    other, _ = self_signed(tmp_path / "other", f"DNS:{HOST}")
    kube.put("configmaps", {"metadata": {"name": "edgegpu-ca", "namespace": NS},
                            "data": {"ca.crt": other.read_text()}})  # fmt: skip
    code = kubectl.main(["--kubeconfig", str(kubeconfig), "nodes"], forward=server.forward())
    out = capsys.readouterr()
    assert code == 1 and out.out == "" and out.err.count("\n") == 1
    assert "certificate verify failed" in out.err and f"ConfigMap {NS}/edgegpu-ca" in out.err
