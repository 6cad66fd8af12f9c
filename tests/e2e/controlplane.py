"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager
and the cluster's default kube-scheduler, from the binaries ``build-controlplane.sh`` builds.

Everything listens on loopback ports chosen free at start; certificates, the service-account
signing key and the admin token are made at start in the run's folder, where every
component's log is kept. ``stop()`` ends every process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "tests" / "e2e" / "build-controlplane.sh"


class ClusterError(RuntimeError):
    """A component did not start, or a step of the harness failed; the message says which."""


class Fatal(ClusterError):
    """A part that will not come up, whatever the wait (a process that exited): ``wait_until``
    raises it at once instead of polling on."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def build_binaries(script: Path = BUILD_SCRIPT) -> Path:
    """The folder a build script prints (control-plane binaries by default): built once and
    cached, or ``EDGEGPU_E2E_BIN``."""
    proc = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"{script.name} failed with status {proc.returncode}")
    return Path(proc.stdout.strip().splitlines()[-1])


def wait_until(
    what: str, check: Callable[[], Any], timeout_s: float, interval_s: float = 0.2
) -> Any:
    """Poll ``check`` until it returns something truthy; ClusterError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except Fatal:
            raise
        except Exception as exc:  # the thing polled is not up yet
            last = exc
        else:
            if result:
                return result
        time.sleep(interval_s)
    raise ClusterError(
        f"{what}: not within {timeout_s:.0f} s" + (f" (last: {last})" if last else "")
    )


def _die_with_parent() -> None:
    """In the child: SIGKILL when the harness dies without stopping it, so that no component
    outlives it (a kube-apiserver still starting ignores SIGTERM)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


NEW_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
"""openssl req arguments for a new P-256 key, unencrypted."""


def openssl(*args: str) -> None:
    """Run openssl; CalledProcessError when it fails."""
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(folder: Path) -> None:
    """A CA, a serving certificate for 127.0.0.1/localhost, the API server's client certificate
    for kubelets, and the service-account key pair."""
    folder.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", *NEW_EC_KEY, "-keyout", str(folder / "ca.key"), "-out",
             str(folder / "ca.crt"), "-days", "7", "-subj", "/CN=edgegpu-e2e-ca")  # fmt: skip
    openssl("req", "-new", *NEW_EC_KEY, "-keyout", str(folder / "serving.key"), "-out",
             str(folder / "serving.csr"), "-subj", "/CN=kube-apiserver")  # fmt: skip
    (folder / "san.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
    )
    openssl("x509", "-req", "-in", str(folder / "serving.csr"), "-CA", str(folder / "ca.crt"),
             "-CAkey", str(folder / "ca.key"), "-CAcreateserial", "-days", "7",
             "-extfile", str(folder / "san.ext"), "-out", str(folder / "serving.crt"))  # fmt: skip
    # The API server's client certificate for kubelets (logs, exec): system:masters.
    openssl("req", "-new", *NEW_EC_KEY, "-keyout", str(folder / "kubelet-client.key"), "-out",
             str(folder / "kubelet-client.csr"),
             "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client")  # fmt: skip
    openssl("x509", "-req", "-in", str(folder / "kubelet-client.csr"), "-CA",
             str(folder / "ca.crt"), "-CAkey", str(folder / "ca.key"), "-CAcreateserial",
             "-days", "7", "-out", str(folder / "kubelet-client.crt"))  # fmt: skip
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(folder / "sa.key"))
    openssl("ec", "-in", str(folder / "sa.key"), "-pubout", "-out", str(folder / "sa.pub"))


def kubeconfig_text(
    server: str, ca: Path, token: str | None, user: str, *, cert: tuple[Path, Path] | None = None
) -> str:
    """A kubeconfig for one user: a token, or a client certificate and its key (``cert``)."""
    credentials = (
        {"token": token} if cert is None
        else {"client-certificate": str(cert[0]), "client-key": str(cert[1])}
    )  # fmt: skip
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}
            ],
            "users": [{"name": user, "user": credentials}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
            "current-context": "e2e",
        }
    )


@dataclass
class Process:
    """A started component: its process and its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.popen.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def tail(self, lines: int = 40) -> str:
        """The last lines of its log."""
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


@dataclass
class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + the default kube-scheduler."""

    folder: Path
    bin_dir: Path = field(default_factory=build_binaries)
    processes: list[Process] = field(default_factory=list)
    api_port: int = 0
    admin_token: str = field(default_factory=lambda: secrets.token_hex(16))

    @property
    def server(self) -> str:
        """The API server's URL."""
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def ca(self) -> Path:
        """The CA that signed the API server's certificate."""
        return self.folder / "pki" / "ca.crt"

    @property
    def admin_kubeconfig(self) -> Path:
        """The admin's kubeconfig (system:masters)."""
        return self.folder / "admin.kubeconfig"

    def binary(self, name: str) -> str:
        """Path of one component's binary."""
        return str(self.bin_dir / name)

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Process:
        """Start a process with its output in ``<folder>/logs/<name>.log``."""
        logs = self.folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        proc = Process(name, popen, log)
        self.processes.append(proc)
        return proc

    def versions(self) -> str:
        """What the binaries say of their versions (one line)."""
        out = subprocess.run(
            [str(self.bin_dir / "controlplane"), "version"], capture_output=True, text=True
        )
        return out.stdout.strip().replace("\n", "; ")

    # -- start -----------------------------------------------------------------------------------
    def start(self, *, controllers: bool = True) -> None:
        """Start etcd, the API server and (``controllers``) the controller-manager and the
        default scheduler. Without them, nothing marks Nodes NotReady and no ServiceAccount is
        made: the benchmarks create the Nodes and the "default" ServiceAccount themselves."""
        pki = self.folder / "pki"
        make_pki(pki)
        tokens = {
            "admin": (self.admin_token, "system:masters"),
            "system:kube-controller-manager": (secrets.token_hex(16), ""),
            "system:kube-scheduler": (secrets.token_hex(16), ""),
        }
        (pki / "tokens.csv").write_text(
            "".join(f'{tok},{user},{user},"{groups}"\n' for user, (tok, groups) in tokens.items())
        )
        etcd_port, peer_port = free_port(), free_port()
        self.api_port = free_port()
        self.spawn("etcd", [
            self.binary("etcd"), f"--data-dir={self.folder / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}", "--log-level=error",
        ])  # fmt: skip
        self.spawn("kube-apiserver", [
            self.binary("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", f"--secure-port={self.api_port}",
            "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--cert-dir={pki}", f"--tls-cert-file={pki / 'serving.crt'}",
            f"--tls-private-key-file={pki / 'serving.key'}", f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={pki / 'tokens.csv'}", "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16", "--allow-privileged=true",
            "--enable-priority-and-fairness=false", "--profiling=false", "--v=1",
            # What a kubelet's credentials may change: its own Node and its own pods only.
            "--enable-admission-plugins=NodeRestriction",
            # Real kubelets (tests/e2e/realnode.py): reached at their InternalIP, 10.217.<i>.1.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'kubelet-client.key'}",
        ])  # fmt: skip
        wait_until("kube-apiserver /readyz", self._ready, 90.0, 0.5)
        self.admin_kubeconfig.write_text(
            kubeconfig_text(self.server, self.ca, self.admin_token, "admin")
        )
        for user, (tok, _) in tokens.items():
            if user != "admin":
                short = user.split(":")[-1]
                (self.folder / f"{short}.kubeconfig").write_text(
                    kubeconfig_text(self.server, self.ca, tok, user)
                )
        if not controllers:
            return
        self.spawn("kube-controller-manager", [
            self.binary("kube-controller-manager"),
            f"--kubeconfig={self.folder / 'kube-controller-manager.kubeconfig'}",
            "--secure-port=0", "--leader-elect=false", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller", "--v=1",
        ])  # fmt: skip
        self.spawn("kube-scheduler", [
            self.binary("kube-scheduler"),
            f"--kubeconfig={self.folder / 'kube-scheduler.kubeconfig'}",
            "--secure-port=0", "--leader-elect=false", "--v=1",
        ])  # fmt: skip
        # The ServiceAccount controller makes "default" in every namespace: pods need it.
        wait_until(
            "the default ServiceAccount",
            lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default"),
            60.0,
            0.5,
        )

    def _ready(self) -> bool:
        for proc in self.processes:
            if not proc.alive():
                raise ClusterError(f"{proc.name} exited:\n{proc.tail()}")
        return self.request("GET", "/readyz").status_code == 200

    # -- talking to it -----------------------------------------------------------------------------
    def client(self, token: str | None = None, timeout_s: float = 30.0) -> httpx.Client:
        """An HTTP client on the API server as the admin (or with ``token``)."""
        return httpx.Client(
            base_url=self.server,
            verify=ssl.create_default_context(cafile=str(self.ca)),
            headers={"authorization": f"Bearer {token or self.admin_token}"},
            timeout=timeout_s,
        )

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One API call as the admin."""
        with self.client() as c:
            return c.request(method, path, **kwargs)

    def get(self, path: str) -> dict[str, Any] | None:
        """GET an object as the admin; None on 404."""
        resp = self.request("GET", path)
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise ClusterError(f"GET {path}: {resp.status_code} {resp.text[:300]}")
        doc: dict[str, Any] = resp.json()
        return doc

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl as the admin (``input`` on its stdin)."""
        proc = subprocess.run(
            [self.binary("kubectl"), f"--kubeconfig={self.admin_kubeconfig}", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            input=input,
        )
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)}: {proc.stderr.strip() or proc.stdout}")
        return proc

    def token(
        self, namespace: str, service_account: str, *, pod: dict[str, Any] | None = None,
        expiration_s: int = 86400, audiences: list[str] | None = None,
    ) -> str:  # fmt: skip
        """A TokenRequest for a ServiceAccount, bound to ``pod`` when given, for ``audiences``
        (the API server's own when not given)."""
        spec: dict[str, Any] = {"expirationSeconds": expiration_s}
        if audiences:
            spec["audiences"] = audiences
        if pod is not None:
            spec["boundObjectRef"] = {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            }
        resp = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        if resp.status_code != 201:
            raise ClusterError(f"TokenRequest {namespace}/{service_account}: {resp.text[:300]}")
        token: str = resp.json()["status"]["token"]
        return token

    def retire(self, proc: Process | None) -> None:
        """Stop one process of the run and forget it."""
        if proc is not None:
            proc.stop()
            if proc in self.processes:
                self.processes.remove(proc)

    def service_account_kubeconfig(self, namespace: str, service_account: str) -> Path:
        """A kubeconfig with a token of the ServiceAccount, written once per run."""
        path = self.folder / f"{service_account}.kubeconfig"
        if not path.exists():
            token = self.token(namespace, service_account)
            path.write_text(kubeconfig_text(self.server, self.ca, token, service_account))
        return path

    def logs(self) -> str:
        """The tail of every component's log, for a failed test's report."""
        return "\n".join(f"--- {p.name} ({p.log}) ---\n{p.tail()}" for p in self.processes)

    def stop(self) -> None:
        """Stop every process, the last started first."""
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()
