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
  bound to that pod.
"""

from __future__ import annotations

import asyncio
import itertools
import re
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

from tests.e2e.controlplane import ROOT, ClusterError, ControlPlane, Process, free_port, wait_until

NAMESPACE = "edgegpu-system"
INSTALL_DOC = ROOT / "docs" / "install.md"


def install_commands() -> list[list[str]]:
    """The kubectl commands of docs/install.md's "Apply" section (the optional monitoring
    and the policy listing, which needs a running extender, left out)."""
    text = INSTALL_DOC.read_text()
    section = text.split("## 2. Apply", 1)[1].split("\n## ", 1)[0]
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
    waits for Deployments and DaemonSets are left out (no controllers run them)."""
    ran = []
    for args in install_commands():
        if not rollouts and "rollout" in args:
            continue
        cp.kubectl(*args)
        ran.append("kubectl " + " ".join(args))
    return ran


def _deployment(path: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "manifests" / path).read_text())
    return doc


@dataclass
class Extender:
    """One extender replica as a process."""

    cp: ControlPlane
    name: str
    port: int = field(default_factory=free_port)
    extra_args: list[str] = field(default_factory=list)
    process: Process | None = None
    deployment: dict[str, Any] | None = None
    """The Deployment it runs as (default: manifests/extender/deployment.yaml's)."""
    namespace: str = NAMESPACE

    @property
    def url(self) -> str:
        """Where the scheduler's verbs are answered."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def ingest_url(self) -> str:
        """Where agents push (the same port: the DaemonSet's URL names it)."""
        return self.url

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The manifest's arguments and environment, rewritten for a process on loopback."""
        deployment = self.deployment or _deployment("extender/deployment.yaml")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        args = [str(a) for a in container["args"]]
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
                env[var["name"]] = str(var["value"])
            else:
                env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
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
            return httpx.get(f"{self.url}/readyz", timeout=2.0).status_code == 200

        wait_until(f"{self.name} /readyz", ready, timeout_s, 0.3)

    def stop(self) -> None:
        """Stop the replica (SIGTERM)."""
        self.cp.retire(self.process)
        self.process = None

    def get(self, path: str) -> Any:
        """GET a JSON endpoint of this replica."""
        return httpx.get(f"{self.url}{path}", timeout=5.0).json()


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

    def __init__(self, replicas: list[Extender]) -> None:
        self.replicas = replicas
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
        self._client = httpx.Client(timeout=10.0)  # kept-alive connections to each replica

    @property
    def url(self) -> str:
        """The address the scheduler is given."""
        return f"http://127.0.0.1:{self.port}"

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
        config = uvicorn.Config(
            self._app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="off",
            interface="asgi3",
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
        for ext in doc["extenders"]:
            ext["urlPrefix"] = re.sub(r"^https?://[^/]+", self.extender_url, ext["urlPrefix"])
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
        container = _deployment("scheduler/deployment.yaml")["spec"]["template"]["spec"][
            "containers"
        ][0]
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
    process: Process | None = None
    pod: dict[str, Any] | None = None

    def agent_pod(self) -> dict[str, Any] | None:
        """The DaemonSet's Running pod on this node, if there is one."""
        pods = self.cp.get(
            f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector="
            "app.kubernetes.io/name%3Dedgegpu-node-agent"
            f"&fieldSelector=spec.nodeName%3D{self.node}"
        )
        for pod in (pods or {}).get("items") or []:
            if (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get(
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
        token = self.cp.token(NAMESPACE, "edgegpu-node-agent", pod=self.pod, expiration_s=3600)
        token_file = self.cp.folder / f"agent-{self.node}.token"
        token_file.write_text(token)
        self.process = self.cp.spawn(f"agent-{self.node}", [
            sys.executable, "-m", "node_agent", "--backend", "simulated",
            "--node-name", self.node, "--gpus", str(self.gpus), "--seed", str(self.seed),
            "--scenario", self.scenario, "--scenario-after-s", str(self.scenario_after_s),
            "--extender-urls", ",".join(self.extender_urls), "--interval-s", str(self.interval_s),
            "--metrics-port", "0", "--token-file", str(token_file), "--log-level", "warning",
            "--state-dir", str(self.home / "state"), "--reboot-sentinel", str(self.sentinel),
            *self.extra_args,
        ], env={"PYTHONUNBUFFERED": "1"})  # fmt: skip

    def stop(self) -> None:
        """Stop the agent (its node goes stale on the extender)."""
        self.cp.retire(self.process)
        self.process = None
