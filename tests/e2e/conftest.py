"""The e2e suite's cluster: a real control plane, edgegpu installed as docs/install.md says,
two extender replicas behind one address, the project's kube-scheduler, simulated agents.

Run by ``make e2e`` (EDGEGPU_E2E=1); skipped otherwise, since the first build of the control
plane takes a quarter of an hour. Component logs are printed when a test fails.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.edgegpu import (
    NAMESPACE,
    Agent,
    Balancer,
    EdgegpuScheduler,
    Extender,
    Pki,
    install,
)
from tests.e2e.fake_kubelet import FakeKubelet
from tests.e2e.realnode import RealNode, containerd2, host_settings, restore_host_settings

E2E = os.environ.get("EDGEGPU_E2E") == "1"

# name, GPUs, scenario, rack
NODES: list[tuple[str, int, str, str]] = [
    ("gpu-a", 4, "steady", "rack-a"),
    ("gpu-b", 4, "steady", "rack-a"),
    ("gpu-c", 4, "steady", "rack-b"),
    ("hot-0", 1, "overheat", "rack-b"),
    ("xid-0", 1, "xid-79", "rack-b"),
]

REAL_NODES: list[tuple[str, int, str]] = [("real-0", 2, "rack-r"), ("real-1", 2, "rack-r")]
"""Nodes run by the real kubelet, containerd and runc (name, GPUs, rack): two Tesla T4 each."""
REAL_AGENT_ARGS = ["--load-pct", "0", "--model", "Tesla T4"]

SUITE_LABELS: dict[str, dict[str, str]] = {
    # test_remediation turns the fault loop on, and the scheduling cases after it count on
    # xid-0's GPU staying unhealthy: its XID lasts until a self-test, which the loop would ask.
    "xid-0": {"edgegpu.io/remediation": "disabled"},
}
"""Labels the suite gives some of its nodes (``make cluster`` gives none)."""

AGENT_ARGS: dict[str, list[str]] = {
    # Steady nodes run idle (no memory in use), so that their GPUs are free to give out.
    "steady": ["--load-pct", "0"],
    # Without the agent's own thermal protection the blocked-airflow GPU goes past maxTemp.
    "overheat": ["--no-power-control"],
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
            if not E2E:
                item.add_marker(pytest.mark.skip(reason="the real control plane: make e2e"))


@dataclass
class Cluster:
    """Everything the e2e tests drive."""

    cp: ControlPlane
    kubelet: FakeKubelet
    extenders: list[Extender]
    balancer: Balancer
    scheduler: EdgegpuScheduler
    agents: dict[str, Agent] = field(default_factory=dict)
    installed: list[str] = field(default_factory=list)
    real: dict[str, RealNode] = field(default_factory=dict)
    host_settings: dict[str, str] = field(default_factory=dict)
    """The host's kernel settings before the real nodes changed them (put back at the end)."""

    def pod(
        self,
        name: str,
        namespace: str = "default",
        *,
        blocks: int = 0,
        gpus: int = 0,
        qos: str | None = None,
        priority_class: str | None = None,
        node_selector: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """A GPU pod for the edgegpu scheduler."""
        limits: dict[str, str] = {}
        if blocks:
            limits["edgegpu.io/gpu-mem-block"] = str(blocks)
        if gpus:
            limits["nvidia.com/gpu"] = str(gpus)
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": {}},
            "spec": {
                "schedulerName": "edgegpu-scheduler",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {"name": "app", "image": "example/app", "resources": {"limits": limits}}
                ],
            },
        }
        if qos:
            pod["metadata"]["annotations"]["edgegpu.io/qos"] = qos
        if priority_class:
            pod["spec"]["priorityClassName"] = priority_class
        if node_selector:
            pod["spec"]["nodeSelector"] = node_selector
        return pod

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create a pod."""
        ns = obj["metadata"]["namespace"]
        resp = self.cp.request("POST", f"/api/v1/namespaces/{ns}/pods", json=obj)
        assert resp.status_code == 201, resp.text
        doc: dict[str, Any] = resp.json()
        return doc

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A pod, or None."""
        return self.cp.get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def wait_bound(self, namespace: str, name: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """Until the pod has a node."""

        def bound() -> dict[str, Any] | None:
            pod = self.get_pod(namespace, name)
            return pod if pod and pod["spec"].get("nodeName") else None

        doc: dict[str, Any] = wait_until(f"pod {namespace}/{name} bound", bound, timeout_s, 0.2)
        return doc

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The events of a pod."""
        doc = self.cp.get(
            f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name%3D{name}"
        )
        return list((doc or {}).get("items") or [])

    def namespace(self, name: str) -> str:
        """Create a namespace (and wait for its default ServiceAccount)."""
        self.cp.request(
            "POST", "/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": name}},
        )  # fmt: skip
        wait_until(
            f"serviceaccount {name}/default",
            lambda: self.cp.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
            30.0,
        )
        return name

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace (its pods go with it)."""
        self.cp.request("DELETE", f"/api/v1/namespaces/{name}")

    def fresh(self, timeout_s: float = 120.0) -> None:
        """Until every replica has a fresh report from every node whose agent runs.

        After a replica was down, agents retry it with backoff (up to a minute): a restarted
        replica knows a node again only after that node's next push reaches it.
        """
        live = [n for n, a in self.agents.items() if a.process is not None]

        def all_fresh() -> bool:
            for ext in self.extenders:
                rows = {r["node"]: r for r in ext.get("/debug/nodes")["nodes"]}
                if not all(rows.get(n, {}).get("reported") and not rows[n]["stale"] for n in live):
                    return False
            return True

        wait_until("fresh reports from every agent on every replica", all_fresh, timeout_s, 0.5)

    def logs(self) -> str:
        """Every component's log tail."""
        return self.cp.logs()

    def all_nodes(self) -> list[str]:
        """Every GPU node of the cluster: the fake kubelet's and the real ones."""
        return [n for n, *_ in NODES] + list(self.real)


def start_cluster(
    folder: Path,
    *,
    agent_interval_s: float = 1.0,
    settle: bool = True,
    labels: dict[str, dict[str, str]] | None = None,
    real_nodes: list[tuple[str, int, str]] | None = None,
) -> Cluster:
    """Start it all; the caller stops it with ``stop_cluster``.

    ``labels``: extra labels of some nodes, by name; ``real_nodes``: nodes run by the real
    kubelet (``tests/e2e/realnode.py``), beside the fake kubelet's. Returns once every node has reported to
    every replica and, with ``settle``, once hot-0's GPU is hot and xid-0's unhealthy there
    (the suite's tests count on both). When it raises (KeyboardInterrupt too), what had
    started is stopped already.
    """
    cp = ControlPlane(folder)
    kubelet = FakeKubelet(cp)
    # The second profile of the whole-Node-objects case, listed as docs/install.md says.
    # The extenders are the DRA driver too, as overlays/dra/ makes them (EDGEGPU_DRA; its
    # DeviceClass and RBAC are applied after the install): a node's slice appears only once
    # its agent serves kubelet's DRA plugin, which the DRA cases' agents do.
    served = {"EDGEGPU_SCHEDULER_NAMES": '["edgegpu-scheduler", "edgegpu-full-nodes"]',
              "EDGEGPU_DRA": "true"}  # fmt: skip
    extenders = [Extender(cp, f"edgegpu-extender-{i}", extra_env=served) for i in range(2)]
    balancer = Balancer(extenders, Pki(cp.folder / f"pki-{NAMESPACE}"))
    scheduler = EdgegpuScheduler(cp, balancer.url)
    cluster = Cluster(cp, kubelet, extenders, balancer, scheduler)
    try:
        cp.start()
        kubelet.start()
        for name, gpus, _, rack in NODES:
            every = {"accelerator": "nvidia-tesla", "edgegpu.io/rack": rack}
            kubelet.add_node(name, gpus=gpus, labels={**every, **(labels or {}).get(name, {})})
        if real_nodes:
            cluster.host_settings = host_settings()
        for index, (name, _, rack) in enumerate(real_nodes or []):
            # real-1 runs containerd 2 (CDI: the DRA cases' containers get the GPU's env).
            node = RealNode(cp, name, index, labels={"accelerator": "nvidia-tesla",
                                                     "edgegpu.io/rack": rack},
                            runtime=containerd2() if index == 1 else None)  # fmt: skip
            cluster.real[name] = node
            node.start()
        cluster.installed = install(cp)
        cp.kubectl("apply", "-f", "overlays/dra/deviceclass.yaml", "-f", "overlays/dra/rbac.yaml",
                   "-f", "overlays/dra/admission.yaml")  # fmt: skip
        for ext in extenders:
            ext.start()
        balancer.start()
        urls = [e.ingest_url for e in extenders]
        for seed, (name, gpus, scenario, _) in enumerate(NODES):
            args = [*AGENT_ARGS.get(scenario, []), *device_plugin(cluster, name)]
            agent = Agent(cp, name, gpus, urls, scenario=scenario, seed=seed,
                          interval_s=agent_interval_s, extra_args=args)  # fmt: skip
            agent.start()
            cluster.agents[name] = agent
        for seed, (name, gpus, _) in enumerate(real_nodes or [], start=len(NODES)):
            real = cluster.real[name]
            args = [*REAL_AGENT_ARGS, "--device-plugin", "--kubelet-dir", str(real.device_plugins),
                    "--pod-resources-socket", str(real.pod_resources_socket)]  # fmt: skip
            agent = Agent(cp, name, gpus, urls, seed=seed, interval_s=agent_interval_s,
                          extra_args=args, host_process=True)  # fmt: skip
            agent.start()
            cluster.agents[name] = agent
        scheduler.start()

        def settled() -> bool:
            for ext in extenders:
                rows = {r["node"]: r for r in ext.get("/debug/nodes")["nodes"]}
                if not all(rows.get(n, {}).get("reported") for n in cluster.all_nodes()):
                    return False
                if not settle:
                    continue
                if not rows["hot-0"]["gpus"][0]["hot"]:
                    return False
                if rows["xid-0"]["gpus"][0]["health"] != "unhealthy":
                    return False
            return True

        # The overheating GPU warms with a 40 s time constant: this is most of the wait.
        wait_until("every node reported to every replica, hot-0 hot, xid-0 unhealthy", settled,
                   180.0, 1.0)  # fmt: skip
    except BaseException as exc:
        if not isinstance(exc, KeyboardInterrupt):
            print(cp.logs(), file=sys.stderr)  # why it did not come up
        stop_cluster(cluster)
        raise
    return cluster


def device_plugin(cluster: Cluster, node: str) -> list[str]:
    """Give ``node`` kubelet's device manager (once); the flags of its agent's device plugin.

    Every GPU node runs the plugin, as the DaemonSet does: kube-scheduler counts the memory
    blocks a node advertises.
    """
    folder = cluster.cp.folder / f"{node}-device-plugins"
    socket = cluster.cp.folder / f"{node}-pod-resources" / "kubelet.sock"
    if node not in cluster.kubelet.device_managers:
        cluster.kubelet.attach_device_manager(node, folder, socket)
    return ["--device-plugin", "--kubelet-dir", str(folder), "--pod-resources-socket", str(socket)]


def stop_cluster(cluster: Cluster) -> None:
    """Stop every process and thread."""
    cluster.scheduler.stop()
    cluster.balancer.stop()
    cluster.kubelet.stop()
    for agent in cluster.agents.values():
        agent.stop()  # before its node: the agent holds the node's device-plugin socket
    for node in cluster.real.values():
        node.stop()
    restore_host_settings(cluster.host_settings)
    cluster.cp.stop()


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    folder = Path(tempfile.mkdtemp(prefix="edgegpu-e2e-"))
    started = time.monotonic()
    # Real nodes need root: without it the suite runs on the fake kubelet's nodes alone, and
    # test_real_node.py says why it is skipped.
    real = REAL_NODES if os.geteuid() == 0 else []
    c = start_cluster(folder, labels=SUITE_LABELS, real_nodes=real)
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    line = (
        f"\ncluster up in {time.monotonic() - started:.1f} s: {c.cp.versions()}; logs in {folder}"
    )
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print(line, flush=True)
    try:
        yield c
    finally:
        stop_cluster(c)
        if os.environ.get("EDGEGPU_E2E_KEEP") != "1":
            shutil.rmtree(folder, ignore_errors=True)


BREAKER_CONFIG_MAP = f"/api/v1/namespaces/{NAMESPACE}/configmaps/edgegpu-remediation-breaker"


@pytest.fixture
def ns(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = "t-" + request.node.name.lower().replace("_", "-")[:50].strip("-")
    cluster.namespace(name)
    yield name
    cluster.delete_namespace(name)
    # The cases share nodes and an hour: each starts with a fresh disruption budget, as the
    # runbook's reset gives (else one case's cordons and evictions count against the next).
    cluster.cp.request("DELETE", BREAKER_CONFIG_MAP)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and "cluster" in getattr(item, "funcargs", {}):
        cluster = item.funcargs["cluster"]
        report.sections.append(("component logs", cluster.logs()))


@pytest.fixture
def say(capsys: pytest.CaptureFixture[str]) -> Callable[[str], None]:
    """Print a measured figure to the terminal, past pytest's capture."""

    def _say(line: str) -> None:
        with capsys.disabled():
            print(line, flush=True)

    return _say


def until(what: str, check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    """Poll until truthy (an AssertionError names what did not happen)."""
    try:
        return wait_until(what, check, timeout_s, 0.25)
    except Exception as exc:
        raise AssertionError(str(exc)) from None


@contextmanager
def extra_node(
    cluster: Cluster,
    name: str,
    gpus: int,
    agent_args: list[str],
    *,
    labels: dict[str, str] | None = None,
    gpu_resource: str = "nvidia.com/gpu",
) -> Iterator[Agent]:
    """A GPU node of one test, with its agent (the DaemonSet's pod on it, device plugin on),
    gone afterwards."""
    every = {"accelerator": "nvidia-tesla", "edgegpu.io/rack": "rack-c", **(labels or {})}
    cluster.kubelet.add_node(name, gpus=gpus, labels=every, gpu_resource=gpu_resource)
    args = ["--load-pct", "0", *agent_args, *device_plugin(cluster, name)]
    agent = Agent(cluster.cp, name, gpus, [e.ingest_url for e in cluster.extenders],
                  seed=sum(map(ord, name)), extra_args=args)  # fmt: skip
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()
        cluster.kubelet.silence(name)
        cluster.cp.request("DELETE", f"/api/v1/nodes/{name}")
        cluster.kubelet.detach_device_manager(name)


def reported(cluster: Cluster, node: str) -> bool:
    """Whether every replica has a report of ``node``'s GPUs."""
    return all((e.get(f"/debug/nodes/{node}") or {}).get("gpus") for e in cluster.extenders)
