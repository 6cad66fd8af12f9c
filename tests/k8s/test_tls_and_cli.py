"""HTTPS as kube-scheduler's enableHTTPS + tlsConfig.caFile uses it, and the cluster flags."""

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def self_signed(folder: Path, names: str) -> tuple[Path, Path]:
    """A certificate for ``names`` (a subjectAltName list) and its key, signing itself."""
    key, crt = folder / "tls.key", folder / "tls.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(key),
         "-out", str(crt), "-subj", "/CN=edgegpu-extender", "-addext", f"subjectAltName={names}"],
        check=True, capture_output=True,
    )  # fmt: skip
    return crt, key


@pytest.fixture
def cert(tmp_path: Path) -> tuple[Path, Path]:
    return self_signed(tmp_path, "IP:127.0.0.1,DNS:localhost")


def start(*args: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler_extender", "--port", str(port), "--log-level", "warning", *args],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ},
    )  # fmt: skip
    return proc, port


def wait_up(url: str, verify: object, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(proc.communicate()[1].decode())
        try:
            if httpx.get(url, verify=verify, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError("did not start")


def test_the_extender_serves_https_that_a_scheduler_with_the_ca_accepts(cert):
    crt, key = cert
    proc, port = start("--tls-cert-file", str(crt), "--tls-key-file", str(key))
    try:
        ctx = ssl.create_default_context(cafile=str(crt))
        wait_up(f"https://127.0.0.1:{port}/healthz", ctx, proc)
        body = {"Pod": {"metadata": {"name": "p"}, "spec": {"containers": []}}, "NodeNames": ["a"]}
        resp = httpx.post(f"https://127.0.0.1:{port}/filter", json=body, verify=ctx)
        assert resp.status_code == 200 and resp.json()["NodeNames"] == ["a"]
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"https://127.0.0.1:{port}/healthz", verify=ssl.create_default_context())
        metrics = httpx.get(f"https://127.0.0.1:{port}/metrics", verify=ctx).text
        expiry = "edgegpu_extender_certificate_expiry_timestamp_seconds "
        (line,) = [line for line in metrics.splitlines() if line.startswith(expiry)]
        assert 0 < float(line.removeprefix(expiry)) - time.time() <= 86_400 + 60
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)


def test_tls_files_that_do_not_load_exit_2_with_one_line(cert, tmp_path):
    crt, _ = cert
    wrong_key = tmp_path / "other.key"
    wrong_key.write_text("not a key\n")
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler_extender", "--port", str(free_port()),
         "--tls-cert-file", str(crt), "--tls-key-file", str(wrong_key)],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("gpu-sched-extender: cannot load the TLS files")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_the_extender_runs_against_a_cluster_from_a_kubeconfig(kube, kubeconfig):
    kube.add_node("n1", {"edgegpu.io/rack": "rack-z"})
    proc, port = start("--kubeconfig", str(kubeconfig), "--namespace", "edgegpu-system")
    try:
        wait_up(f"http://127.0.0.1:{port}/readyz", None, proc)
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz").json()
        assert ready["caches"] == {"nodes": True, "pods": True, "gpuschedulingpolicies": True}
        deadline = time.monotonic() + 10
        while (
            kube.get("leases", "edgegpu-extender", "edgegpu-system") is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert kube.get("leases", "edgegpu-extender", "edgegpu-system") is not None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=15)
    lease = kube.get("leases", "edgegpu-extender", "edgegpu-system")
    assert lease["spec"]["holderIdentity"] == ""  # released at shutdown


def test_a_missing_kubeconfig_exits_2_with_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler_extender", "--kubeconfig", str(tmp_path / "nope")],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "cannot load the cluster configuration" in proc.stderr and "Traceback" not in proc.stderr


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def test_with_a_client_ca_only_the_scheduler_with_its_certificate_reaches_the_verbs(cert, tmp_path):
    """kube-scheduler's extender tlsConfig presents a client certificate; without
    one the verbs are refused 403, while agents still push with their tokens alone."""
    crt, key = cert
    ca_key, ca_crt = tmp_path / "ca.key", tmp_path / "ca.crt"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout",
             str(ca_key), "-out", str(ca_crt), "-subj", "/CN=scheduler-ca")  # fmt: skip
    c_key, c_csr, c_crt = tmp_path / "c.key", tmp_path / "c.csr", tmp_path / "c.crt"
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(c_key), "-out", str(c_csr),
             "-subj", "/CN=edgegpu-scheduler")  # fmt: skip
    _openssl("x509", "-req", "-in", str(c_csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "1", "-out", str(c_crt))  # fmt: skip
    tokens = tmp_path / "tokens"
    tokens.write_text("agent-token n1\n")
    proc, port = start("--tls-cert-file", str(crt), "--tls-key-file", str(key),
                       "--client-ca-file", str(ca_crt), "--static-token-file", str(tokens))  # fmt: skip
    try:
        server_ca = ssl.create_default_context(cafile=str(crt))
        wait_up(f"https://127.0.0.1:{port}/healthz", server_ca, proc)
        body = {"Pod": {"metadata": {"name": "p"}, "spec": {"containers": []}}, "NodeNames": ["a"]}
        url = f"https://127.0.0.1:{port}"
        refused = httpx.post(f"{url}/filter", json=body, verify=server_ca)
        assert refused.status_code == 403 and "client certificate" in refused.text
        scheduler = ssl.create_default_context(cafile=str(crt))
        scheduler.load_cert_chain(str(c_crt), str(c_key))
        ok = httpx.post(f"{url}/filter", json=body, verify=scheduler)
        assert ok.status_code == 200 and ok.json()["NodeNames"] == ["a"]
        push = httpx.post(f"{url}/v1/telemetry", content=b"{}", verify=server_ca,
                          headers={"authorization": "Bearer agent-token",
                                   "content-type": "application/json"})  # fmt: skip
        assert push.status_code == 422  # reached the telemetry handler: no certificate needed
        stranger = ssl.create_default_context(cafile=str(crt))
        stranger.load_cert_chain(str(crt), str(key))  # a certificate of another CA
        with pytest.raises(httpx.HTTPError):
            httpx.post(f"{url}/filter", json=body, verify=stranger)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert b"Traceback" not in err


def test_a_client_ca_without_tls_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler_extender", "--client-ca-file", str(tmp_path / "ca")],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2 and "--client-ca-file needs --tls-cert-file" in proc.stderr


def test_an_agent_pushes_over_https_to_an_extender_signed_by_a_private_ca(tmp_path):
    # A certificate for the host name only: an agent that reaches the replica by its address
    # (--resolve-all, as in the DaemonSet) must check it against that name (SNI).
    crt, key = self_signed(tmp_path, "DNS:localhost")
    proc, port = start("--tls-cert-file", str(crt), "--tls-key-file", str(key))
    try:
        wait_up(
            f"https://localhost:{port}/healthz", ssl.create_default_context(cafile=str(crt)), proc
        )

        def agent(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "node_agent", "--backend", "simulated", "--once",
                 "--node-name", "tls-0", "--metrics-port", "0",
                 "--extender-urls", f"https://localhost:{port}", *args],
                cwd=ROOT, capture_output=True, text=True, timeout=60,
            )  # fmt: skip

        assert agent("--ca-file", str(crt)).returncode == 0
        by_address = agent("--ca-file", str(crt), "--resolve-all")
        assert by_address.returncode == 0, by_address.stderr
        unverified = agent()  # the system's CAs do not know this one
        assert unverified.returncode == 1 and "reached no extender" in unverified.stderr
        nodes = httpx.get(f"https://localhost:{port}/debug/nodes",
                          verify=ssl.create_default_context(cafile=str(crt))).json()["nodes"]  # fmt: skip
        assert [n["node"] for n in nodes] == ["tls-0"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
