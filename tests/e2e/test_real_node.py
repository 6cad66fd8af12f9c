"""edgegpu on nodes run by the real kubelet, containerd and runc (``tests/e2e/realnode.py``).

Here the real kubelet decides: its device manager takes the agent's registration, its admission
calls the plugin's Allocate and puts the answer into a container that runc starts, its
PodResources API says who holds which device, and it kills the container when the fault loop
evicts the pod. There is no GPU: the agent's backend is simulated, and the container gets the
plugin's environment, not ``/dev/nvidia*``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from node_agent.deviceplugin.devices import gpu_of
from node_agent.deviceplugin.podresources import pod_devices
from tests.e2e.conftest import REAL_NODES, Cluster, until
from tests.e2e.edgegpu import NAMESPACE, Agent
from tests.e2e.realnode import RealNode, real_pod
from tests.e2e.test_policy_and_auth import patch_policy
from tests.e2e.test_remediation import _policy_in_force

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="real nodes need root (kubelet, containerd and runc run as root)"
)

BLOCK = "edgegpu.io/gpu-mem-block"
T4_BLOCKS = 3
"""Blocks of one simulated Tesla T4 (15 GiB in 4 GiB blocks)."""
PRINT_ENV = "env | sort; echo ---; trap 'exit 0' TERM; while true; do sleep 1; done"
"""A container that prints its environment, then waits to be stopped."""


def envs_of(cluster: Cluster, ns: str, name: str) -> dict[str, str] | None:
    """What the container printed of its environment (through kubelet's log endpoint)."""
    out = cluster.cp.kubectl("logs", "-n", ns, name, check=False)
    if out.returncode != 0 or "---" not in out.stdout:
        return None
    lines = out.stdout.split("---", 1)[0].splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def phase(cluster: Cluster, ns: str, name: str) -> str | None:
    pod = cluster.get_pod(ns, name) or {}
    found: str | None = (pod.get("status") or {}).get("phase")
    return found


@pytest.fixture(autouse=True)
def quiet_real_nodes(cluster: Cluster) -> Iterator[None]:
    """Each case starts on real nodes that run none of an earlier case's pods (a namespace is
    deleted in the background)."""

    def quiet() -> bool:
        for name in cluster.real:
            doc = cluster.cp.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{name}") or {}
            if any(p["metadata"]["namespace"] != NAMESPACE for p in doc.get("items") or []):
                return False
        return True

    until("the real nodes free of earlier cases' pods", quiet, 120.0)
    yield


def start_on(cluster: Cluster, ns: str, name: str, node: str, blocks: int) -> tuple[str, str]:
    """A pod of ``blocks`` on ``node``, Running; its GPU (the container's environment and the
    bind's annotation agree) and its container's ID."""
    pod = cluster.pod(name, ns, blocks=blocks, qos="inference",
                      node_selector={"kubernetes.io/hostname": node})  # fmt: skip
    cluster.create(real_pod(pod, PRINT_ENV))
    until(f"{name} Running on {node}", lambda: phase(cluster, ns, name) == "Running", 120.0)
    envs = until(f"{name}'s printed environment", lambda: envs_of(cluster, ns, name), 60.0)
    doc = cluster.get_pod(ns, name) or {}
    bound = doc["metadata"]["annotations"]["edgegpu.io/gpu-uuid"]
    assert envs["NVIDIA_VISIBLE_DEVICES"] == bound, (bound, envs)
    assert envs["EDGEGPU_GPU_UUID"] == bound, (bound, envs)
    assert envs["EDGEGPU_MEM_LIMIT_MIB"] == str(blocks * 4096), envs
    return bound, _container_of(doc)


def held_by(node: RealNode, ns: str) -> dict[str, list[str]]:
    """kubelet's PodResources: the blocks each container of ``ns`` holds on ``node``."""
    socket = node.pod_resources_socket
    listing: list[Any] | None = asyncio.run(pod_devices(socket, BLOCK)())  # type: ignore[arg-type]
    held: dict[str, list[str]] = {}
    for p in listing or []:
        if p.namespace == ns:
            (devices,) = p.containers
            held[p.name] = sorted(devices)
    return held


def assert_agreed(
    cluster: Cluster, node: RealNode, ns: str, given: dict[str, str], blocks: dict[str, int]
) -> None:
    """kubelet's PodResources and the extender's reservations say each pod holds its blocks
    on the GPU it was given, and no pod of ``ns`` holds others."""  # fmt: skip
    held = held_by(node, ns)
    assert set(held) == set(given), held
    for name, gpu in given.items():
        assert len(held[name]) == blocks[name], held
        assert {gpu_of(d) for d in held[name]} == {gpu}, (name, gpu, held[name])
    view = cluster.extenders[0].get(f"/debug/nodes/{node.name}")
    uuids = {g["index"]: g["uuid"] for g in view["gpus"]}
    reserved = {r["pod"]: [uuids[i] for i in r["gpus"]] for r in view["reservations"]}
    for name, gpu in given.items():
        assert reserved[f"{ns}/{name}"] == [gpu], reserved


def test_the_real_kubelet_counts_the_blocks_the_agent_registers(cluster: Cluster) -> None:
    for name, gpus, _ in REAL_NODES:

        def capacity(node: str = name) -> str | None:
            doc = cluster.cp.get(f"/api/v1/nodes/{node}") or {}
            value: str | None = (doc.get("status") or {}).get("capacity", {}).get(BLOCK)
            return value if value not in (None, "0") else None

        assert until(f"{BLOCK} capacity of {name}", capacity, 60.0) == str(gpus * T4_BLOCKS)
        node = cluster.cp.get(f"/api/v1/nodes/{name}") or {}
        info = node["status"]["nodeInfo"]
        assert info["containerRuntimeVersion"].startswith("containerd://"), info
        assert info["kubeletVersion"].startswith("v1.36"), info

        # The DaemonSet's pod is there (the agent runs beside it), its image never pulled.
        def pull_refused(node: str = name) -> str | None:
            pod = cluster.agents[node].agent_pod() or {}
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                message = str((status.get("state") or {}).get("waiting", {}).get("message"))
                if "127.0.0.1:9" in message:
                    return message
            return None

        until(f"the agent pod on {name} refused its image pull", pull_refused, 60.0)


def test_containers_on_a_real_node_get_the_gpu_bind_chose_and_podresources_agrees(
    cluster: Cluster, ns: str, say: Callable[[str], None]
) -> None:
    node = REAL_NODES[0][0]
    started = time.monotonic()
    # Two blocks each of a three-block T4: the two pods cannot share a GPU.
    names = ["infer-0", "infer-1"]
    for name in names:
        pod = cluster.pod(name, ns, blocks=2, qos="inference",
                          node_selector={"kubernetes.io/hostname": node})  # fmt: skip
        cluster.create(real_pod(pod, PRINT_ENV))
    running = until("both pods Running on the real node",
                    lambda: all(phase(cluster, ns, n) == "Running" for n in names), 120.0)  # fmt: skip
    assert running
    seconds = time.monotonic() - started
    given: dict[str, str] = {}
    for name in names:
        pod = cluster.get_pod(ns, name) or {}
        annotations = pod["metadata"]["annotations"]
        envs = until(
            f"{name}'s printed environment", functools.partial(envs_of, cluster, ns, name), 60.0
        )
        assert envs["NVIDIA_VISIBLE_DEVICES"] == annotations["edgegpu.io/gpu-uuid"], envs
        assert envs["EDGEGPU_GPU_UUID"] == annotations["edgegpu.io/gpu-uuid"], envs
        assert envs["EDGEGPU_MEM_LIMIT_MIB"] == str(2 * 4096), envs
        given[name] = envs["NVIDIA_VISIBLE_DEVICES"]
    assert len(set(given.values())) == 2, given

    # kubelet's PodResources: each container holds two blocks, all of its own pod's GPU; the
    # extender's reservations say the same GPUs.
    assert_agreed(cluster, cluster.real[node], ns, given, dict.fromkeys(names, 2))
    say(
        f"real node: 2 two-block pods created → Running on {node} in {seconds:.1f} s; each "
        f"container's NVIDIA_VISIBLE_DEVICES = its bind's GPU ({len(given)} distinct GPUs), "
        f"PodResources and the extender agree"
    )


def test_a_pod_placed_past_the_extender_fails_kubelet_admission_with_the_plugins_reason(
    cluster: Cluster, ns: str, say: Callable[[str], None]
) -> None:
    node = cluster.real[REAL_NODES[0][0]]
    pod = real_pod(cluster.pod("unbound", ns, blocks=1, qos="inference"), PRINT_ENV)
    pod["spec"]["nodeName"] = node.name  # no scheduler, no extender: no GPU was chosen for it
    cluster.create(pod)
    doc = until("unbound failed at kubelet's admission",
                lambda: phase(cluster, ns, "unbound") == "Failed" and cluster.get_pod(ns, "unbound"),
                90.0)  # fmt: skip
    status = doc["status"]
    message = str(status.get("message") or "")
    assert status.get("reason") == "UnexpectedAdmissionError", status
    assert "no pod bound here by the extender" in message, message
    assert "not given on a guess" in message, message
    assert not status.get("containerStatuses"), status  # nothing was started
    assert "unbound" not in held_by(node, ns), "kubelet gave it blocks anyway"
    say(f"real node: a pod placed by nodeName past the extender: kubelet recorded "
        f"{status['reason']}: {message}")  # fmt: skip


def test_a_kubelet_restart_and_an_agent_restart_keep_every_container_on_its_gpu(
    cluster: Cluster, ns: str, say: Callable[[str], None]
) -> None:
    node = cluster.real[REAL_NODES[0][0]]
    agent = cluster.agents[node.name]
    given, containers, blocks = {}, {}, {}

    def start(name: str, size: int) -> str:
        given[name], containers[name] = start_on(cluster, ns, name, node.name, size)
        blocks[name] = size
        return given[name]

    def kept() -> None:
        """Every container started so far still runs, never restarted, on the same blocks."""
        running = node.tasks()
        for name, container in containers.items():
            assert container in running, f"{name}'s container {container[:12]} is gone"
            doc = cluster.get_pod(ns, name) or {}
            (status,) = doc["status"]["containerStatuses"]
            assert status["restartCount"] == 0 and "running" in status["state"], status
        assert_agreed(cluster, node, ns, given, blocks)

    all_blocks = REAL_NODES[0][1] * T4_BLOCKS

    def plugged(since: int) -> Callable[[], bool]:
        """Whether kubelet has taken a list of every block healthy since ``since`` lists."""
        return lambda: node.device_lists(BLOCK, all_blocks) > since

    first = start("before", 2)  # one GPU keeps a block free, the other three
    held = held_by(node, ns)
    lists = node.device_lists(BLOCK, all_blocks)
    started = time.monotonic()
    node.restart_kubelet()
    until(f"the agent's plugin registered with {node.name}'s new kubelet, every block healthy",
          plugged(lists), 120.0)  # fmt: skip
    kubelet_s = time.monotonic() - started
    # The new kubelet's PodResources lists its pods once it has synced them.
    listed = until("the new kubelet's PodResources naming the running pod again",
                   lambda: held_by(node, ns) or None, 60.0)  # fmt: skip
    assert listed == held, "the new kubelet moved a container's blocks"
    kept()
    # Two blocks now fit only on the other GPU: a pod admitted on the wrong one would show it.
    second = start("after-kubelet", 2)
    assert second != first, (first, second)
    kept()

    lists = node.device_lists(BLOCK, all_blocks)
    started = time.monotonic()
    agent.stop()
    agent.start()
    until(f"the restarted agent's plugin registered with {node.name}'s kubelet, every block "
          "healthy", plugged(lists), 120.0)  # fmt: skip
    agent_s = time.monotonic() - started
    kept()
    start("after-agent", 1)  # either GPU has one block left: its printed GPU is the bind's
    kept()
    say(
        f"real node: kubelet restarted, the plugin registered again {kubelet_s:.1f} s later; "
        f"the agent restarted, registered again {agent_s:.1f} s later; {len(containers)} "
        f"containers kept their GPU, the pods admitted after each got the bind's GPU"
    )


def _deployment(cluster: Cluster, ns: str) -> dict[str, Any]:
    rack = {"edgegpu.io/rack": REAL_NODES[0][2]}
    pod = cluster.pod("worker", ns, blocks=T4_BLOCKS, qos="inference", node_selector=rack)
    template = real_pod(pod, PRINT_ENV)
    template["metadata"] = {"labels": {"app": "worker"},
                            "annotations": {"edgegpu.io/qos": "inference"}}  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "worker", "namespace": ns},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "worker"}},
                 "template": template},
    }  # fmt: skip


def _workers(cluster: Cluster, ns: str) -> list[dict[str, Any]]:
    doc = cluster.cp.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3Dworker") or {}
    return [p for p in doc.get("items") or [] if not p["metadata"].get("deletionTimestamp")]


def _running(pod: dict[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)


def _workers_on(cluster: Cluster, ns: str, node: str, spare: str) -> list[dict[str, Any]]:
    """Two workers of a Deployment, a whole T4 each, Running on ``node`` (``spare``, the other
    node of the rack, cordoned until they run)."""
    cluster.cp.kubectl("cordon", spare)
    try:
        resp = cluster.cp.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments",
                                  json=_deployment(cluster, ns))  # fmt: skip
        assert resp.status_code == 201, resp.text
        pods: list[dict[str, Any]] = until(
            f"both workers' containers running on {node}",
            lambda: len(found := [p for p in _workers(cluster, ns)
                                  if p["spec"].get("nodeName") == node and _running(p)]) == 2
            and found,
            120.0,
        )  # fmt: skip
    finally:
        cluster.cp.kubectl("uncordon", spare)
    return pods


def _container_of(pod: dict[str, Any]) -> str:
    """The containerd ID of the pod's (one) container."""
    (status,) = pod["status"]["containerStatuses"]
    container: str = status["containerID"].split("//", 1)[1]
    return container


def _on_gpu0(
    cluster: Cluster, node: str, pods: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Of two workers running on ``node``: the one on GPU 0, and the other."""
    gpu0 = cluster.extenders[0].get(f"/debug/nodes/{node}")["gpus"][0]["uuid"]
    (first,) = [p for p in pods if p["metadata"]["annotations"]["edgegpu.io/gpu-uuid"] == gpu0]
    (other,) = [p for p in pods if p is not first]
    assert _container_of(first) in cluster.real[node].tasks()
    return first, other


def _restart(agent: Agent, scenario: str, extra_args: list[str]) -> None:
    """The node's agent stopped and started again with ``scenario`` and ``extra_args``."""
    agent.stop()
    agent.scenario, agent.extra_args = scenario, extra_args
    agent.start()


def _moved(
    cluster: Cluster,
    ns: str,
    node: str,
    spare: str,
    first: dict[str, Any],
    cause: tuple[str, Callable[[], bool]],
    timeout_s: float,
) -> tuple[dict[str, float], dict[str, Any]]:
    """Seconds from now until the cause is seen, the real kubelet has killed ``first``'s
    container, the pod is gone and a replacement runs on ``spare``; the replacement, whose
    container printed its bind's GPU."""
    seen, check = cause
    container = _container_of(first)
    t0 = time.monotonic()
    marks: dict[str, float] = {}

    def progress() -> bool:
        if check():
            marks.setdefault(seen, time.monotonic() - t0)
        if seen in marks and container not in cluster.real[node].tasks():
            marks.setdefault("killed", time.monotonic() - t0)
        if cluster.get_pod(ns, first["metadata"]["name"]) is None:
            marks.setdefault("deleted", time.monotonic() - t0)
        moved = [p for p in _workers(cluster, ns)
                 if p["spec"].get("nodeName") == spare and _running(p)]  # fmt: skip
        if moved and "killed" in marks:
            marks.setdefault("replaced", time.monotonic() - t0)
        return {seen, "killed", "deleted", "replaced"} <= set(marks)

    until(f"{seen} → eviction → the real kubelet kills the container → a replacement Running "
          f"on {spare}", progress, timeout_s)  # fmt: skip
    (moved,) = [p for p in _workers(cluster, ns) if p["spec"].get("nodeName") == spare]
    bound = moved["metadata"]["annotations"]["edgegpu.io/gpu-uuid"]
    envs = until("the replacement's printed environment",
                 lambda: envs_of(cluster, ns, moved["metadata"]["name"]), 60.0)  # fmt: skip
    assert envs["NVIDIA_VISIBLE_DEVICES"] == bound, (bound, envs)
    return marks, moved


def test_the_fault_loop_on_a_real_node_drains_it_through_the_real_kubelet(
    cluster: Cluster, ns: str, say: Callable[[str], None]
) -> None:
    faulty, spare = REAL_NODES[0][0], REAL_NODES[1][0]
    first, other = _on_gpu0(cluster, faulty, _workers_on(cluster, ns, faulty, spare))
    patch_policy(cluster, {"remediation": {"enabled": True, "dryRun": False,
                                            "maxUnavailablePercent": 50}})  # fmt: skip
    agent = cluster.agents[faulty]
    plain = agent.extra_args
    try:
        until("remediation on in every replica", lambda: _policy_in_force(cluster, True), 30.0)
        # The agent restarts, and GPU 0 raises XID 79 until a self-test passes.
        _restart(agent, "xid-79", plain)
        t0 = time.monotonic()

        def cordoned() -> bool:
            node = cluster.cp.get(f"/api/v1/nodes/{faulty}") or {}
            return bool(node.get("spec", {}).get("unschedulable"))

        marks, _ = _moved(cluster, ns, faulty, spare, first, ("cordoned", cordoned), 180.0)
        assert cluster.get_pod(ns, other["metadata"]["name"]), "the healthy GPU's pod evicted"

        def handed_back() -> bool:
            node = cluster.cp.get(f"/api/v1/nodes/{faulty}") or {}
            notes = node["metadata"].get("annotations") or {}
            return not node["spec"].get("unschedulable") and "edgegpu.io/remediation" not in notes

        until(f"{faulty} uncordoned after its self-test passed", handed_back, 180.0)
        uncordoned = time.monotonic() - t0
        kept = cluster.get_pod(ns, other["metadata"]["name"])
        assert kept and _running(kept), "the pod on the healthy GPU was not left alone"
        say(
            f"fault loop on a real node (seconds from the faulty agent's start): cordoned "
            f"{marks['cordoned']:.1f}, container killed by kubelet {marks['killed']:.1f}, pod "
            f"gone {marks['deleted']:.1f}, replacement Running on {spare} "
            f"{marks['replaced']:.1f}, uncordoned after the self-test {uncordoned:.1f}"
        )
    finally:
        patch_policy(cluster, {"remediation": {"enabled": False, "dryRun": True,
                                                "maxUnavailablePercent": 10}})  # fmt: skip
        _restart(agent, "steady", plain)


def test_a_pod_on_a_hot_gpu_of_a_real_node_moves_to_a_cool_one(
    cluster: Cluster, ns: str, say: Callable[[str], None]
) -> None:
    hot, spare = REAL_NODES[1][0], REAL_NODES[0][0]
    first, other = _on_gpu0(cluster, hot, _workers_on(cluster, ns, hot, spare))
    agent = cluster.agents[hot]
    plain = agent.extra_args
    patch_policy(cluster, {"remediation": {"enabled": True, "dryRun": False},
                            "thermalThrottling": {"migrateAfter": "10s"}})  # fmt: skip
    try:
        until("remediation on in every replica", lambda: _policy_in_force(cluster, True), 30.0)
        # GPU 0's airflow blocked, and no power limit of the agent's own to hold it back.
        _restart(agent, "overheat", [*plain, "--no-power-control"])
        gpu0 = first["metadata"]["annotations"]["edgegpu.io/gpu-uuid"]

        def hot_gpu0() -> bool:
            return bool(cluster.extenders[0].get(f"/debug/nodes/{hot}")["gpus"][0]["hot"])

        marks, moved = _moved(cluster, ns, hot, spare, first, ("GPU 0 hot", hot_gpu0), 240.0)
        bound = moved["metadata"]["annotations"]["edgegpu.io/gpu-uuid"]
        gpus = {g["uuid"]: g for g in cluster.extenders[0].get(f"/debug/nodes/{spare}")["gpus"]}
        assert bound != gpu0 and not gpus[bound]["hot"], gpus[bound]
        kept = cluster.get_pod(ns, other["metadata"]["name"])
        assert kept and _running(kept), "the pod on the cool GPU was not left alone"
        say(
            f"thermal migration on a real node (seconds from the hot agent's start): GPU 0 hot "
            f"{marks['GPU 0 hot']:.1f}, container killed by kubelet {marks['killed']:.1f}, pod "
            f"gone {marks['deleted']:.1f}, replacement Running on {spare} {marks['replaced']:.1f}"
        )
    finally:
        patch_policy(cluster, {"remediation": {"enabled": False, "dryRun": True},
                                "thermalThrottling": {"migrateAfter": "2m"}})  # fmt: skip
        _restart(agent, "steady", plain)
