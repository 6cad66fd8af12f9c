"""edgegpu on nodes run by the real kubelet, containerd and runc (``tests/e2e/realnode.py``).

Here the real kubelet decides: its device manager takes the agent's registration, its admission
calls the plugin's Allocate and puts the answer into a container that runc starts, its
PodResources API says who holds which device, and it kills the container when the fault loop
evicts the pod. There is no GPU: the agent's backend is simulated, and the container gets the
plugin's environment, not ``/dev/nvidia*``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from node_agent.deviceplugin.devices import gpu_of
from node_agent.deviceplugin.podresources import pod_devices
from tests.e2e.conftest import REAL_NODES, Cluster, until
from tests.e2e.realnode import real_pod

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
        envs = until(f"{name}'s printed environment", lambda n=name: envs_of(cluster, ns, n), 60.0)
        assert envs["NVIDIA_VISIBLE_DEVICES"] == annotations["edgegpu.io/gpu-uuid"], envs
        assert envs["EDGEGPU_GPU_UUID"] == annotations["edgegpu.io/gpu-uuid"], envs
        assert envs["EDGEGPU_MEM_LIMIT_MIB"] == str(2 * 4096), envs
        given[name] = envs["NVIDIA_VISIBLE_DEVICES"]
    assert len(set(given.values())) == 2, given

    # kubelet's PodResources: each container holds two blocks, all of its own pod's GPU.
    socket = cluster.real[node].pod_resources_socket
    listing: list[Any] | None = asyncio.run(pod_devices(socket, BLOCK)())  # type: ignore[arg-type]
    held = {f"{p.namespace}/{p.name}": p.containers for p in listing or [] if p.namespace == ns}
    assert set(held) == {f"{ns}/{n}" for n in names}, held
    for name in names:
        (devices,) = held[f"{ns}/{name}"]
        assert len(devices) == 2 and {gpu_of(d) for d in devices} == {given[name]}, devices

    # The extender's reservations say the same GPUs.
    view = cluster.extenders[0].get(f"/debug/nodes/{node}")
    uuids = {g["index"]: g["uuid"] for g in view["gpus"]}
    reserved = {r["pod"]: [uuids[i] for i in r["gpus"]] for r in view["reservations"]}
    for name in names:
        assert reserved[f"{ns}/{name}"] == [given[name]], reserved
    say(
        f"real node: 2 two-block pods created → Running on {node} in {seconds:.1f} s; each "
        f"container's NVIDIA_VISIBLE_DEVICES = its bind's GPU ({len(given)} distinct GPUs), "
        f"PodResources and the extender agree"
    )
