"""TLS as someone with a certificate of the CA, or with none, meets it; certificates that change.

Only a client certificate for one of the scheduler's names reaches the verbs (the extender's own,
of the same CA, does not); with a cluster the program refuses to serve its verbs open beyond
loopback unless told to; a renewed certificate or CA is served to new connections without a
restart, and its expiry is exported. Real handshakes against uvicorn on 127.0.0.1, with
certificates made by ``openssl``.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI

from scheduler_extender.api.app import create_app
from scheduler_extender.api.protocol import CLIENT_CERT_KEY, PeerCertificate
from scheduler_extender.api.tls import ServingTls, certificate_not_after
from scheduler_extender.cli.main import command_line
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.telemetry.clock import FakeClock
from tests.builders import args_names, pod
from tests.extender.test_api_scheduler import RecordingBinder
from tests.fakes.fake_kube import FakeKube
from tests.k8s.test_tls_and_cli import ROOT, free_port, start, wait_up
from tests.security.test_extender_http import PATIENCE_S, serving

FILTER = orjson.dumps(args_names(pod("p", blocks=None), ["n1"]))
JSON = {"content-type": "application/json"}


# -- a small PKI ------------------------------------------------------------------------------------


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _ec_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-out", path)  # fmt: skip


class Ca:
    """A certificate authority in ``folder``, issuing certificates as files there."""

    def __init__(self, folder: Path, name: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.key, self.crt = folder / f"{name}.key", folder / f"{name}.crt"
        _ec_key(self.key)
        _openssl("req", "-x509", "-new", "-key", self.key, "-out", self.crt, "-days", "3",
                 "-subj", f"/CN={name}")  # fmt: skip

    def issue(
        self, name: str, cn: str, *, sans: str | None = None, usage: str = "serverAuth",
        days: int = 1,
    ) -> tuple[Path, Path]:  # fmt: skip
        """A certificate for ``cn`` (and ``sans``, a subjectAltName list) and its key."""
        key, csr, crt = (self.folder / f"{name}.{x}" for x in ("key", "csr", "crt"))
        ext = self.folder / f"{name}.ext"
        ext.write_text(f"extendedKeyUsage={usage}\n" + (f"subjectAltName={sans}\n" if sans else ""))
        _ec_key(key)
        _openssl("req", "-new", "-key", key, "-out", csr, "-subj", f"/CN={cn}")
        _openssl("x509", "-req", "-in", csr, "-CA", self.crt, "-CAkey", self.key,
                 "-CAcreateserial", "-days", str(days), "-extfile", ext, "-out", crt)  # fmt: skip
        return crt, key


class MountedSecret:
    """A folder laid out as kubelet mounts a Secret: names that link through ``..data``.

    ``put`` writes a new version beside the old one and swaps ``..data`` to it in one rename,
    as kubelet does: the paths the extender was given never change.
    """

    def __init__(self, folder: Path) -> None:
        folder.mkdir()
        self.folder = folder
        self.versions = 0

    def put(self, files: dict[str, Path | bytes]) -> None:
        self.versions += 1
        version = self.folder / f"..version_{self.versions}"
        version.mkdir()
        for name, content in files.items():
            data = content if isinstance(content, bytes) else content.read_bytes()
            (version / name).write_bytes(data)
            link = self.folder / name
            if not link.is_symlink():
                link.symlink_to(Path("..data") / name)
        swap = self.folder / "..data_tmp"
        swap.symlink_to(version.name)
        os.replace(swap, self.folder / "..data")

    def __truediv__(self, name: str) -> Path:
        return self.folder / name


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Two CAs; of each, the extender's serving certificate (for client auth too, as Helm's
    genSignedCert makes it) and the scheduler's client certificate, as (certificate, key)."""
    folder = tmp_path_factory.mktemp("pki")
    made: dict[str, tuple[Path, Path]] = {}
    for n in (1, 2):
        ca = Ca(folder / f"ca{n}", f"edgegpu-ca-{n}")
        made[f"ca{n}"] = (ca.crt, ca.key)
        made[f"extender{n}"] = ca.issue(
            "extender", "edgegpu-extender", days=n,
            sans="DNS:edgegpu-extender.edgegpu-system.svc,IP:127.0.0.1",
            usage="serverAuth,clientAuth",
        )  # fmt: skip
        made[f"scheduler{n}"] = ca.issue("scheduler", "edgegpu-scheduler", usage="clientAuth")
        if n == 1:
            made["by-dns-name"] = ca.issue("by-dns", "kube-scheduler-1", usage="clientAuth",
                                           sans="DNS:edgegpu-scheduler")  # fmt: skip
    return made


# -- serving ----------------------------------------------------------------------------------------


@contextmanager
def serving_tls(app: FastAPI, tls: ServingTls) -> Iterator[str]:
    """uvicorn as the extender runs it, over ``tls``, in a thread; yields its base URL."""
    with serving(app, **tls.uvicorn_options()) as (port, _):
        yield f"https://127.0.0.1:{port}"


def served_certificate(url: str) -> bytes:
    """The certificate (DER) a new connection is served, with no server name sent."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    port = int(url.rsplit(":", 1)[1])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S) as raw,
        context.wrap_socket(raw) as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return der


def der(crt: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(crt.read_text())


def client(ca: Path, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """A client that trusts ``ca`` and presents ``cert`` (certificate, key)."""
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(*cert)
    return context


def post(url: str, context: ssl.SSLContext, path: str = "/filter") -> httpx.Response:
    return httpx.post(url + path, content=FILTER, headers=JSON, verify=context, timeout=PATIENCE_S)


# -- who may call the verbs -------------------------------------------------------------------------


def test_only_a_client_certificate_for_a_scheduler_name_reaches_the_verbs(
    pki: dict[str, tuple[Path, Path]],
) -> None:
    """Every certificate of the CA was taken for the scheduler's, the extender's own (which Helm
    makes for client auth too) among them: bind was open to anyone who could read its Secret."""
    ca = pki["ca1"][0]
    binder = RecordingBinder()
    app = create_app(ExtenderSettings(client_ca_file=ca), clock=FakeClock(), binder=binder)
    with serving_tls(app, ServingTls(*pki["extender1"], ca)) as url:
        assert post(url, client(ca, pki["scheduler1"])).json()["NodeNames"] == ["n1"]
        assert post(url, client(ca, pki["by-dns-name"])).json()["NodeNames"] == ["n1"]
        own = client(ca, pki["extender1"])
        for path in ("/filter", "/prioritize", "/preempt", "/bind"):
            refused = post(url, own, path)
            assert refused.status_code == 403, (path, refused.text)
            error = refused.json()["error"]
            assert "'edgegpu-extender'" in error and "--client-cert-names" in error
            assert "edgegpu-scheduler" in error
        assert post(url, client(ca)).status_code == 403  # no certificate at all
    assert binder.calls == []
    registry = app.state.ctx.metrics.registry
    assert registry.get_sample_value(
        "edgegpu_extender_request_errors_total", {"verb": "bind", "kind": "forbidden"}
    ) == 1.0  # fmt: skip


def with_peer(app: FastAPI, peer: PeerCertificate) -> httpx.AsyncClient:
    """A client whose every request comes with ``peer`` as its verified certificate."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope[CLIENT_CERT_KEY] = peer
        await app(scope, receive, send)

    transport = httpx.ASGITransport(app=asgi, client=("10.0.0.7", 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://extender")


async def test_a_refusal_names_the_certificates_cn_escaped_and_cut_short() -> None:
    app = create_app(ExtenderSettings(client_ca_file=Path("ca.crt")), clock=FakeClock())
    peer = PeerCertificate("\x1b[2J\u202e" + "x" * 500, ("edgegpu-scheduler.evil",))
    async with with_peer(app, peer) as peer_client:
        resp = await peer_client.post("/filter", content=FILTER, headers=JSON)
    assert resp.status_code == 403
    error = resp.json()["error"]
    assert "\x1b" not in error and "\u202e" not in error
    assert "'\\x1b[2J\\u202e" + "x" * 59 + "'..." in error
    assert "x" * 60 not in error and len(error) < 300


async def test_the_scheduler_names_a_certificate_may_carry_are_a_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed = command_line().parse_or_report(["--client-cert-names", "edgegpu-scheduler,kube-a"])
    assert parsed is not None
    settings = parsed[0]
    assert settings.client_cert_names == ["edgegpu-scheduler", "kube-a"]
    monkeypatch.setenv("EDGEGPU_CLIENT_CERT_NAMES", '["kube-b"]')
    assert ExtenderSettings().client_cert_names == ["kube-b"]
    monkeypatch.delenv("EDGEGPU_CLIENT_CERT_NAMES")
    assert ExtenderSettings().client_cert_names == ["edgegpu-scheduler"]
    assert command_line().parse_or_report(["--client-cert-names", ""]) is None
    app = create_app(settings.model_copy(update={"client_ca_file": Path("ca.crt")}),
                     clock=FakeClock())  # fmt: skip
    for cn, dns, status in (("kube-a", (), 200), ("x", ("kube-a",), 200), ("kube-b", (), 403)):
        async with with_peer(app, PeerCertificate(cn, dns)) as peer_client:
            resp = await peer_client.post("/filter", content=FILTER, headers=JSON)
            assert resp.status_code == status, (cn, dns)


# -- closed by default, for the program itself ------------------------------------------------------


@pytest.mark.parametrize(
    "cluster",
    [
        pytest.param(["--kubeconfig", "kubeconfig"], id="kubeconfig"),
        pytest.param(["--in-cluster"], id="in-cluster"),
    ],
)
def test_with_a_cluster_the_extender_will_not_serve_open_verbs_beyond_loopback(
    tmp_path: Path, cluster: list[str]
) -> None:
    """It served every verb, bind included, to whoever reached the port, and said nothing."""
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler_extender", "--host", "0.0.0.0", "--port",
         str(free_port()), *cluster],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "--client-ca-file" in proc.stderr and "--insecure-open-verbs" in proc.stderr


def test_told_to_serve_open_verbs_the_extender_starts_and_says_so(tmp_path: Path) -> None:
    with FakeKube(bookmark_interval_s=0.2) as kube:
        kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
        proc, port = start("--kubeconfig", str(kubeconfig), "--namespace", "edgegpu-system",
                           "--host", "0.0.0.0", "--insecure-open-verbs")  # fmt: skip
        try:
            wait_up(f"http://127.0.0.1:{port}/healthz", None, proc)
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=PATIENCE_S)
    assert "--insecure-open-verbs" in err.decode() and "Traceback" not in err.decode()


def test_without_a_cluster_the_extender_still_listens_beyond_loopback() -> None:
    """The embedded mode binds nothing: its verbs stay as they were."""
    proc, port = start("--host", "0.0.0.0")
    try:
        wait_up(f"http://127.0.0.1:{port}/healthz", None, proc)
    finally:
        proc.terminate()
        proc.communicate(timeout=PATIENCE_S)


# -- certificates that change -----------------------------------------------------------------------

EXPIRY = "edgegpu_extender_certificate_expiry_timestamp_seconds"


def not_after(crt: Path) -> float:
    """The certificate's notAfter as openssl reads it."""
    out = subprocess.run(["openssl", "x509", "-enddate", "-noout", "-in", str(crt)],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return float(ssl.cert_time_to_seconds(out.strip().removeprefix("notAfter=")))


def secret_of(folder: Path, pki: dict[str, tuple[Path, Path]], n: int) -> MountedSecret:
    secret = MountedSecret(folder)
    crt, key = pki[f"extender{n}"]
    secret.put({"tls.crt": crt, "tls.key": key, "ca.crt": pki[f"ca{n}"][0]})
    return secret


def tls_of(secret: MountedSecret, app: FastAPI, interval_s: float = 60.0) -> ServingTls:
    return ServingTls(
        secret / "tls.crt", secret / "tls.key", secret / "ca.crt",
        on_expiry=app.state.ctx.metrics.certificate_expiry.set, interval_s=interval_s,
    )  # fmt: skip


def test_a_renewed_certificate_and_ca_are_served_to_new_connections_without_a_restart(
    pki: dict[str, tuple[Path, Path]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The files were read once: a certificate renewed in its Secret was not served until the
    extender restarted, and the old one's expiry was an outage."""
    secret = secret_of(tmp_path / "tls", pki, 1)
    app = create_app(ExtenderSettings(client_ca_file=secret / "ca.crt"), clock=FakeClock())
    registry = app.state.ctx.metrics.registry
    tls = tls_of(secret, app)
    with serving_tls(app, tls) as url:
        assert served_certificate(url) == der(pki["extender1"][0])
        assert post(url, client(pki["ca1"][0], pki["scheduler1"])).status_code == 200
        assert registry.get_sample_value(EXPIRY) == not_after(pki["extender1"][0])

        renewed = pki["extender2"]
        secret.put({"tls.crt": renewed[0], "tls.key": renewed[1], "ca.crt": pki["ca2"][0]})
        with caplog.at_level(logging.INFO, "scheduler_extender"):
            assert tls.reload_if_changed()
            assert not tls.reload_if_changed()  # nothing changed since
        assert [r.levelname for r in caplog.records if "TLS" in r.getMessage()] == ["INFO"]
        assert served_certificate(url) == der(renewed[0])
        assert post(url, client(pki["ca2"][0], pki["scheduler2"])).status_code == 200
        with pytest.raises(httpx.HTTPError):  # the old CA is trusted no more
            post(url, client(pki["ca2"][0], pki["scheduler1"]))
        assert registry.get_sample_value(EXPIRY) == not_after(renewed[0])
        assert not_after(renewed[0]) != not_after(pki["extender1"][0])


def test_certificate_files_that_do_not_load_leave_the_certificate_in_use(
    pki: dict[str, tuple[Path, Path]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = secret_of(tmp_path / "tls", pki, 1)
    app = create_app(ExtenderSettings(client_ca_file=secret / "ca.crt"), clock=FakeClock())
    tls = tls_of(secret, app)
    with serving_tls(app, tls) as url:
        mismatched: dict[str, Path | bytes] = {"tls.crt": pki["extender2"][0],
                                               "tls.key": pki["extender1"][1]}  # fmt: skip
        for broken in (mismatched, {"tls.crt": b"not a certificate"}):
            secret.put({**broken, "ca.crt": pki["ca1"][0]})
            caplog.clear()
            with caplog.at_level(logging.INFO, "scheduler_extender"):
                assert not tls.reload_if_changed()
                assert not tls.reload_if_changed()  # said once
            (line,) = [r for r in caplog.records if "TLS" in r.getMessage()]
            assert line.levelname == "WARNING" and "still serving" in line.getMessage()
            assert served_certificate(url) == der(pki["extender1"][0])
            assert post(url, client(pki["ca1"][0], pki["scheduler1"])).status_code == 200
        registry = app.state.ctx.metrics.registry
        assert registry.get_sample_value(EXPIRY) == not_after(pki["extender1"][0])


def test_the_extender_looks_for_renewed_certificate_files_by_itself(
    pki: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    secret = secret_of(tmp_path / "tls", pki, 1)
    app = create_app(ExtenderSettings(client_ca_file=secret / "ca.crt"), clock=FakeClock())
    tls = tls_of(secret, app, interval_s=0.05)
    with serving_tls(app, tls) as url:
        tls.start()
        try:
            crt, key = pki["extender2"]
            secret.put({"tls.crt": crt, "tls.key": key, "ca.crt": pki["ca2"][0]})
            deadline = time.monotonic() + PATIENCE_S
            while served_certificate(url) != der(crt):
                assert time.monotonic() < deadline, "the renewed certificate was not served"
                time.sleep(0.05)
        finally:
            tls.stop()


async def test_the_expiry_gauge_is_served_whether_or_not_the_extender_serves_tls(
    pki: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """Without TLS the family is there with no sample: an alert on it never fires."""
    plain = create_app(clock=FakeClock())
    transport = httpx.ASGITransport(app=plain, client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
        text = (await http.get("/metrics")).text
    assert f"# TYPE {EXPIRY} gauge" in text
    assert not [line for line in text.splitlines() if line.startswith(EXPIRY)]
    crt = pki["extender1"][0]
    assert certificate_not_after(crt) == not_after(crt)
    assert certificate_not_after(tmp_path / "missing.crt") is None


def test_no_tls_session_is_resumed_so_every_connection_has_its_certificate_checked_again(
    pki: dict[str, tuple[Path, Path]],
) -> None:
    """A resumed session skips the certificate check: a client of a CA taken out of ca.crt at a
    reload could go on resuming what it had. The extender resumes none, and speaks TLS 1.3 only
    (TLS 1.2 would resume from a server-side cache)."""
    ca = pki["ca1"][0]
    context = client(ca, pki["scheduler1"])
    app = create_app(ExtenderSettings())
    with serving_tls(app, ServingTls(*pki["extender1"], ca)) as url:
        port = int(url.rsplit(":", 1)[1])
        session = None
        for attempt in range(2):
            with (
                socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S) as raw,
                context.wrap_socket(
                    raw, server_hostname="edgegpu-extender.edgegpu-system.svc", session=session
                ) as conn,  # fmt: skip
            ):
                conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                while conn.recv(4096):
                    pass
                assert not conn.session_reused, f"connection {attempt + 1} resumed a session"
                session = conn.session
        old = client(ca, pki["scheduler1"])
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(ssl.SSLError):
            with socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S) as raw:
                old.wrap_socket(raw, server_hostname="edgegpu-extender.edgegpu-system.svc")
