"""edgegpu on the e2e control plane, installed the way docs/install.md tells a user.

* ``install``: the ``kubectl`` commands of docs/install.md's "Apply" section, run as written.
* ``Extender``: one replica of the extender as a process, with the arguments and environment
  of ``manifests/extender/deployment.yaml`` (loopback address and free ports instead of the
  Pod's, ``--kubeconfig`` with a token of the manifests' ServiceAccount instead of
  ``--in-cluster``).
* ``Balancer``: one address in front of the replicas, as their Service is (one replica at a
  time), or splitting each pod's filter and bind over two replicas.
* ``EdgegpuScheduler``: kube-scheduler with ``manifests/scheduler/kube-scheduler-config.yaml``,
  only the extender's URL rewritten and the kubeconfig of the manifests' ServiceAccount added.
* ``Agent``: a simulated node agent for a DaemonSet pod the fake kubelet runs, with a token
  bound to that pod for the DaemonSet's audience.
* ``issue_certificates``: what cert-manager with ``manifests/cert-manager/`` leaves in the
  namespace (the two Secrets) plus the agents' ``edgegpu-ca`` ConfigMap. Each process gets the
  Secrets and ConfigMaps its manifest mounts, read from the API server as kubelet would and
  written to a folder of its own; paths in its arguments and environment follow.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import re
import ssl
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvicorn
import yaml

from tests.e2e.controlplane import (
    NEW_EC_KEY,
    ROOT,
    ClusterError,
    ControlPlane,
    Process,
    free_port,
    openssl,
    wait_until,
)

NAMESPACE = "edgegpu-system"
INSTALL_DOC = ROOT / "docs" / "install.md"


def install_commands() -> list[list[str]]:
    """The kubectl commands of docs/install.md's "Apply" section (the optional monitoring
    and the policy listing, which needs a running extender, left out)."""
    text = INSTALL_DOC.read_text()
    section = text.split("## 3. Apply", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("kubectl ") or "monitoring" in line or " get " in line:
            continue
        commands.append(line.split()[1:])
    if not commands:
        raise ClusterError(f"no kubectl commands in the Apply section of {INSTALL_DOC}")
    return commands


def install(cp: ControlPlane, *, rollouts: bool = True) -> list[str]:
    """Run the documented install; the commands run, as printed. Without ``rollouts`` the
    waits for Deployments and DaemonSets are left out (no controllers run them). The
    certificates are issued as cert-manager would (``issue_certificates``) once the namespace
    is there, before any rollout is waited for."""
    ran = []
    issued = False
    for args in install_commands():
        if "rollout" in args:
            if not issued:
                issue_certificates(cp)
                issued = True
            if not rollouts:
                continue
        cp.kubectl(*args)
        ran.append("kubectl " + " ".join(args))
    if not issued:
        issue_certificates(cp)
    return ran


def _deployment(path: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "manifests" / path).read_text())
    return doc


def _pod(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod spec of a manifest's workload, and its first container."""
    spec: dict[str, Any] = _deployment(path)["spec"]["template"]["spec"]
    return spec, spec["containers"][0]


_CERTS = ROOT / "manifests" / "cert-manager" / "certificates.yaml"


@dataclass(frozen=True)
class Pki:
    """The certificates of one namespace's install, as files (the harness's own copies)."""

    folder: Path

    @property
    def ca(self) -> Path:
        """The CA's certificate."""
        return self.folder / "ca.crt"

    def pair(self, name: str) -> tuple[Path, Path]:
        """(certificate, key) of ``extender`` or ``scheduler``."""
        return self.folder / f"{name}.crt", self.folder / f"{name}.key"

    def server_context(self) -> ssl.SSLContext:
        """What a client that verifies the extender uses (the agents' and the scheduler's CA)."""
        return ssl.create_default_context(cafile=str(self.ca))

    def scheduler_context(self) -> ssl.SSLContext:
        """kube-scheduler's side of the mTLS: the CA and its client certificate."""
        ctx = self.server_context()
        ctx.load_cert_chain(*(str(p) for p in self.pair("scheduler")))
        return ctx


def _certificate_specs(namespace: str) -> dict[str, dict[str, Any]]:
    """The Certificates of manifests/cert-manager/ by secretName, for ``namespace``."""
    docs = yaml.safe_load_all(_CERTS.read_text().replace(NAMESPACE, namespace))
    return {
        d["spec"]["secretName"]: d["spec"]
        for d in docs
        if d and d["kind"] == "Certificate" and not d["spec"].get("isCA")
    }


def issue_certificates(cp: ControlPlane, namespace: str = NAMESPACE) -> Pki:
    """Issue what manifests/cert-manager/ asks cert-manager for, and store it as it would.

    The extender's certificate also names 127.0.0.1: here its Service is an address on
    loopback. Then the ``edgegpu-ca`` ConfigMap of docs/install.md.
    """
    pki = Pki(cp.folder / f"pki-{namespace}")
    pki.folder.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", *NEW_EC_KEY, "-keyout", str(pki.folder / "ca.key"), "-out", str(pki.ca),
             "-days", "7", "-subj", "/CN=edgegpu-ca")  # fmt: skip
    specs = _certificate_specs(namespace)
    for secret, who in (
        ("edgegpu-extender-tls", "extender"),
        ("edgegpu-scheduler-tls", "scheduler"),
    ):
        spec = specs[secret]
        crt, key = pki.pair(who)
        csr = pki.folder / f"{who}.csr"
        openssl("req", "-new", *NEW_EC_KEY, "-keyout", str(key), "-out", str(csr),
                 "-subj", f"/CN={spec['commonName']}")  # fmt: skip
        usage = {"server auth": "serverAuth", "client auth": "clientAuth"}
        ext = [f"extendedKeyUsage={','.join(usage[u] for u in spec['usages'])}"]
        if spec.get("dnsNames"):
            ext.append("subjectAltName=" + ",".join(
                [f"DNS:{n}" for n in spec["dnsNames"]] + ["IP:127.0.0.1"]
            ))  # fmt: skip
        (pki.folder / f"{who}.ext").write_text("\n".join(ext) + "\n")
        openssl("x509", "-req", "-in", str(csr), "-CA", str(pki.ca), "-CAkey",
                 str(pki.folder / "ca.key"), "-CAcreateserial", "-days", "7", "-extfile",
                 str(pki.folder / f"{who}.ext"), "-out", str(crt))  # fmt: skip
        data = {
            "tls.crt": crt.read_bytes(),
            "tls.key": key.read_bytes(),
            "ca.crt": pki.ca.read_bytes(),
        }
        cp.kubectl("create", "-f", "-", "--namespace", namespace, input=yaml.safe_dump({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": secret, "namespace": namespace},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }))  # fmt: skip
    cp.kubectl("create", "configmap", "edgegpu-ca", "--namespace", namespace,
               f"--from-file=ca.crt={pki.ca}")  # fmt: skip
    return pki


def mount(cp: ControlPlane, namespace: str, pod_spec: dict[str, Any], container: dict[str, Any],
          folder: Path) -> dict[str, Path]:  # fmt: skip
    """The container's Secret and ConfigMap volumes, read from the API server and written under
    ``folder``, as kubelet mounts them: mount path → local folder."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    out: dict[str, Path] = {}
    for m in container.get("volumeMounts") or []:
        volume = volumes.get(m["name"]) or {}
        if "secret" in volume:
            source, kind = volume["secret"], "secrets"
            name = source["secretName"]
        elif "configMap" in volume:
            source, kind = volume["configMap"], "configmaps"
            name = source["name"]
        else:
            continue
        obj = cp.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        if obj is None:
            raise ClusterError(f"{kind} {namespace}/{name} is not there to mount")
        data = {
            k: base64.b64decode(v) if kind == "secrets" else str(v).encode()
            for k, v in (obj.get("data") or {}).items()
        }
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        target = folder / m["name"]
        target.mkdir(parents=True, exist_ok=True)
        for item in items:
            (target / item["path"]).write_bytes(data[item["key"]])
        out[m["mountPath"]] = target
    return out


def remount(value: str, mounts: dict[str, Path]) -> str:
    """``value`` with a mounted path replaced by its local folder (whole path segments only:
    /etc/edgegpu is not a part of /etc/edgegpu-tls)."""
    for path in sorted(mounts, key=len, reverse=True):
        value = re.sub(re.escape(path) + r"(?=/|$)", str(mounts[path]), value)
    return value


@dataclass
class Extender:
    """One extender replica as a process."""

    cp: ControlPlane
    name: str
    port: int = field(default_factory=free_port)
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    """Environment over the manifest's, as an operator would set it in the Deployment."""
    process: Process | None = None
    deployment: dict[str, Any] | None = None
    """The Deployment it runs as (default: manifests/extender/deployment.yaml's)."""
    namespace: str = NAMESPACE
    mounts: dict[str, Path] = field(default_factory=dict)
    """The Deployment's Secret and ConfigMap mounts: mount path → local folder."""

    @property
    def url(self) -> str:
        """Where the scheduler's verbs are answered."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def ingest_url(self) -> str:
        """Where agents push (the same port: the DaemonSet's URL names it)."""
        return self.url

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The manifest's arguments and environment, rewritten for a process on loopback."""
        deployment = self.deployment or _deployment("extender/deployment.yaml")
        pod_spec = deployment["spec"]["template"]["spec"]
        container = pod_spec["containers"][0]
        self.mounts = mount(
            self.cp, self.namespace, pod_spec, container, self.cp.folder / self.name
        )
        args = [remount(str(a), self.mounts) for a in container["args"]]
        out: list[str] = []
        it = iter(args)
        for arg in it:
            if arg == "--host":
                next(it)
                out += ["--host", "127.0.0.1"]
            elif arg == "--port":
                next(it)
                out += ["--port", str(self.port)]
            elif arg == "--in-cluster":
                out += ["--kubeconfig", str(self.kubeconfig)]
            else:
                out.append(arg)
        env: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
        fields = {"metadata.namespace": self.namespace, "metadata.name": self.name}
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = remount(str(var["value"]), self.mounts)
            else:
                env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        env.update(self.extra_env)
        return [sys.executable, "-m", "scheduler_extender", *out, *self.extra_args], env

    @property
    def kubeconfig(self) -> Path:
        """The kubeconfig with the extender ServiceAccount's token."""
        return self.cp.service_account_kubeconfig(self.namespace, "edgegpu-extender")

    def start(self, wait_ready: bool = True) -> None:
        """Start the replica; wait for /readyz (caches synced) unless told not to."""
        argv, env = self.command()
        self.process = self.cp.spawn(self.name, argv, env)
        if wait_ready:
            self.wait_ready()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until /readyz answers 200."""

        def ready() -> bool:
            if self.process is None or not self.process.alive():
                raise ClusterError(
                    f"{self.name} exited:\n{self.process.tail() if self.process else ''}"
                )
            try:
                return self.fetch("/readyz", timeout_s=2.0).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(f"{self.name} /readyz", ready, timeout_s, 0.3)

    def stop(self) -> None:
        """Stop the replica (SIGTERM)."""
        self.cp.retire(self.process)
        self.process = None

    def context(self) -> ssl.SSLContext:
        """TLS as a client of this replica: its CA (from the Secret it mounts)."""
        (ca,) = (self.cp.folder / self.name).glob("*/ca.crt")
        return ssl.create_default_context(cafile=str(ca))

    def fetch(self, path: str, timeout_s: float = 5.0) -> httpx.Response:
        """GET ``path`` over HTTPS, checking the certificate against its Service's name."""
        with httpx.Client(verify=self.context(), timeout=timeout_s) as client:
            return client.get(
                f"{self.url}{path}",
                extensions={"sni_hostname": f"edgegpu-extender.{self.namespace}.svc"},
            )

    def get(self, path: str) -> Any:
        """GET a JSON endpoint of this replica."""
        return self.fetch(path).json()

    def post(self, path: str, doc: Any, timeout_s: float = 5.0) -> Any:
        """POST JSON to an endpoint of this replica (``/debug/explain``); its JSON answer."""
        with httpx.Client(verify=self.context(), timeout=timeout_s) as client:
            return client.post(
                f"{self.url}{path}",
                json=doc,
                extensions={"sni_hostname": f"edgegpu-extender.{self.namespace}.svc"},
            ).json()


def _pod_name(body: bytes) -> str:
    """The pod a scheduler request is about ("" when the body does not say)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    if not isinstance(doc, dict):
        return ""
    if "PodName" in doc:
        return str(doc["PodName"])
    return str(((doc.get("Pod") or {}).get("metadata") or {}).get("name", ""))


class Balancer:
    """One address for several extender replicas, as their Service gives the scheduler.

    As the Service does (``sessionAffinity: ClientIP``), every request goes to one replica,
    and to the next one when that one does not answer. With ``split_bind`` each filter goes
    to the next replica in turn, prioritize to the replica that answered the last filter and
    bind to the one after it, so that the replica that binds a pod has never seen it.
    ``before_bind`` (when set) runs before a bind is forwarded, with the replica's index, e.g.
    to restart that replica between filter and bind.
    """

    def __init__(self, replicas: list[Extender], pki: Pki) -> None:
        self.replicas = replicas
        self.pki = pki
        """Its serving certificate is the extender's; it takes the scheduler's only."""
        self.port = free_port()
        self.split_bind = False
        self.before_bind: Callable[[int], None] | None = None
        self.served: list[tuple[str, str, str]] = []
        """(path, replica name, pod name) of every request forwarded."""
        self._sticky = 0
        self._turn = itertools.count()
        self._last_filter = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._client = httpx.Client()

    @property
    def url(self) -> str:
        """The address the scheduler is given."""
        return f"https://127.0.0.1:{self.port}"

    def _first(self, path: str) -> int:
        n = len(self.replicas)
        if not self.split_bind:
            return self._sticky
        if path.endswith("/bind"):
            return (self._last_filter + 1) % n
        if path.endswith("/prioritize"):
            return self._last_filter  # so that only filter and prioritize have seen the pod
        return next(self._turn) % n

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path: str = scope["path"]
        first = self._first(path)
        if path.endswith("/bind") and self.before_bind is not None:
            await asyncio.to_thread(self.before_bind, first)
        status, headers, content = 502, [(b"content-type", b"text/plain")], b"no replica"
        n = len(self.replicas)
        for k in range(n):
            i = (first + k) % n
            replica = self.replicas[i]
            try:
                resp = await asyncio.to_thread(
                    self._client.post,
                    f"{replica.url}{path}",
                    content=body,
                    headers={"content-type": "application/json"},
                )
            except httpx.HTTPError:
                continue
            if path.endswith("/filter"):
                self._last_filter = i
            if not self.split_bind:
                self._sticky = i
            self.served.append((path, replica.name, _pod_name(body)))
            status = resp.status_code
            headers = [(b"content-type", resp.headers.get("content-type", "").encode())]
            content = resp.content
            break
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    def start(self) -> None:
        """Serve in a thread."""
        # Kept-alive connections to each replica, with the scheduler's client certificate: the
        # harness stands for the Service, which passes the scheduler's TLS through.
        self._client = httpx.Client(timeout=10.0, verify=self.pki.scheduler_context())
        config = uvicorn.Config(
            self._app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="off",
            interface="asgi3",
            ssl_certfile=str(self.pki.pair("extender")[0]),
            ssl_keyfile=str(self.pki.pair("extender")[1]),
            ssl_ca_certs=str(self.pki.ca),
            ssl_cert_reqs=ssl.CERT_REQUIRED,  # only the scheduler, as the extender's verbs
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        wait_until("balancer", lambda: self._server is not None and self._server.started, 10.0)

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._client.close()


class EdgegpuScheduler:
    """The second scheduler of the manifests, as a process."""

    def __init__(self, cp: ControlPlane, extender_url: str, *, name: str = "edgegpu-scheduler",
                 overrides: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.cp = cp
        self.name = name
        self.extender_url = extender_url
        self.overrides = overrides or {}
        self.process: Process | None = None

    def config(self) -> dict[str, Any]:
        """The project's KubeSchedulerConfiguration, with the URL rewritten and a kubeconfig."""
        doc: dict[str, Any] = yaml.safe_load(
            (ROOT / "manifests" / "scheduler" / "kube-scheduler-config.yaml").read_text()
        )
        mounts = mount(self.cp, NAMESPACE, *_pod("scheduler/deployment.yaml"),
                       self.cp.folder / self.name)  # fmt: skip
        for ext in doc["extenders"]:
            ext["urlPrefix"] = re.sub(r"^https?://[^/]+", self.extender_url, ext["urlPrefix"])
            tls = ext.get("tlsConfig") or {}
            for key in ("certFile", "keyFile", "caFile"):
                if key in tls:
                    tls[key] = remount(tls[key], mounts)
            ext.update(self.overrides)
        if self.name != "edgegpu-scheduler":  # a second one: its own profile and Lease
            doc["profiles"][0]["schedulerName"] = self.name
            doc["leaderElection"]["resourceName"] = self.name
        kubeconfig = self.cp.service_account_kubeconfig(NAMESPACE, "edgegpu-scheduler")
        doc["clientConnection"] = {"kubeconfig": str(kubeconfig)}
        return doc

    def start(self) -> None:
        """Start it and wait until it holds its leader Lease (then it schedules)."""
        path = self.cp.folder / f"{self.name}-config.yaml"
        path.write_text(yaml.safe_dump(self.config()))
        container = _pod("scheduler/deployment.yaml")[1]
        flags = [f for f in container["command"][1:] if not f.startswith("--config")]
        self.process = self.cp.spawn(
            self.name,
            [self.cp.binary("kube-scheduler"), f"--config={path}", "--secure-port=0", *flags],
        )
        lease = self.config()["leaderElection"]

        def leading() -> bool:
            if self.process is None or not self.process.alive():
                raise ClusterError(
                    f"{self.name} exited:\n{self.process.tail() if self.process else ''}"
                )
            doc = self.cp.get(
                f"/apis/coordination.k8s.io/v1/namespaces/{lease['resourceNamespace']}"
                f"/leases/{lease['resourceName']}"
            )
            holder = ((doc or {}).get("spec") or {}).get("holderIdentity") or ""
            return bool(holder)

        wait_until(f"{self.name} leader lease", leading, 60.0, 0.5)

    def stop(self) -> None:
        """Stop it."""
        self.cp.retire(self.process)
        self.process = None


@dataclass
class Agent:
    """A simulated node agent, run for the DaemonSet's pod on its node."""

    cp: ControlPlane
    node: str
    gpus: int
    extender_urls: list[str]
    scenario: str = "steady"
    scenario_after_s: float = 0.0
    interval_s: float = 1.0
    seed: int = 0
    extra_args: list[str] = field(default_factory=list)
    host_process: bool = False
    """On a real node: the agent runs beside kubelet as a host process for the DaemonSet's pod,
    whose image the node never pulls (it stays Pending): the pod need only be on the node."""
    process: Process | None = None
    pod: dict[str, Any] | None = None

    def agent_pod(self) -> dict[str, Any] | None:
        """The DaemonSet's Running pod on this node (any of its pods there, ``host_process``)."""
        pods = self.cp.get(
            f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector="
            "app.kubernetes.io/name%3Dedgegpu-node-agent"
            f"&fieldSelector=spec.nodeName%3D{self.node}"
        )
        for pod in (pods or {}).get("items") or []:
            phase = (pod.get("status") or {}).get("phase")
            if (self.host_process or phase == "Running") and not pod["metadata"].get(
                "deletionTimestamp"
            ):
                return dict(pod)
        return None

    @property
    def home(self) -> Path:
        """The agent's own folder in the run's folder, for what a real agent keeps on its host
        (``--state-dir``, ``--reboot-sentinel``): agents on this machine never write under its
        /var/lib or /var/run, and each node keeps its own across restarts."""
        return self.cp.folder / "agents" / self.node

    @property
    def sentinel(self) -> Path:
        """The reboot sentinel the agent writes when the extender asks for a reboot."""
        return self.home / "reboot-required"

    def start(self) -> None:
        """Wait for the DaemonSet's pod, take a token bound to it, start the agent."""
        self.pod = wait_until(f"agent pod on {self.node}", self.agent_pod, 90.0, 0.5)
        (self.home / "state").mkdir(parents=True, exist_ok=True)
        pod_spec, container = _pod("node-agent/daemonset.yaml")
        mounts = mount(self.cp, NAMESPACE, {"volumes": [
            v for v in pod_spec["volumes"] if "configMap" in v
        ]}, container, self.home)  # fmt: skip
        ca = next(remount(a, mounts) for a in container["args"] if a.startswith("--ca-file="))
        (token_source,) = (
            s["serviceAccountToken"]
            for v in pod_spec["volumes"] if "projected" in v
            for s in v["projected"]["sources"] if "serviceAccountToken" in s
        )  # fmt: skip
        token = self.cp.token(NAMESPACE, "edgegpu-node-agent", pod=self.pod, expiration_s=3600,
                              audiences=[token_source["audience"]])  # fmt: skip
        token_file = self.cp.folder / f"agent-{self.node}.token"
        token_file.write_text(token)
        self.process = self.cp.spawn(f"agent-{self.node}", [
            sys.executable, "-m", "node_agent", "--backend", "simulated",
            "--node-name", self.node, "--gpus", str(self.gpus), "--seed", str(self.seed),
            "--scenario", self.scenario, "--scenario-after-s", str(self.scenario_after_s),
            "--extender-urls", ",".join(self.extender_urls), "--interval-s", str(self.interval_s),
            "--metrics-port", "0", "--token-file", str(token_file), "--log-level", "warning",
            "--state-dir", str(self.home / "state"), "--reboot-sentinel", str(self.sentinel),
            ca, *self.extra_args,
        ], env={"PYTHONUNBUFFERED": "1"})  # fmt: skip

    def stop(self) -> None:
        """Stop the agent (its node goes stale on the extender)."""
        self.cp.retire(self.process)
        self.process = None
