"""The agent's device plugin with kubelet's device manager.

The fake kubelet's device manager is built on kubelet's own device plugin API package: the
agent registers ``edgegpu.io/gpu-mem-block`` with it, the blocks become the node's capacity,
and a block pod is admitted with the GPU the extender chose at bind in its environment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from node_agent.deviceplugin.podresources import holders
from tests.e2e.conftest import Cluster, extra_node, until
from tests.e2e.edgegpu import Agent

POOL = {"edgegpu.io/e2e-pool": "device-plugin"}
NODE = "dp-0"


def pod_resources(cluster: Cluster) -> Path:
    """Where dp-0's kubelet serves its PodResources API (``conftest.device_plugin``)."""
    return cluster.cp.folder / f"{NODE}-pod-resources" / "kubelet.sock"


@pytest.fixture
def plugin_node(cluster: Cluster) -> Iterator[Agent]:
    with extra_node(cluster, NODE, 2, ["--model", "Tesla T4"], labels=POOL) as agent:
        manager = cluster.kubelet.device_managers[NODE]
        manager.wait(lambda e: e["event"] == "devices" and e["devices"], 60.0)
        yield agent


def test_a_block_pod_gets_the_gpu_chosen_at_bind_and_the_plugin_survives_a_kubelet_restart(
    cluster: Cluster, ns: str, plugin_node: Agent, say: Callable[[str], None]
) -> None:
    manager = cluster.kubelet.device_managers[NODE]
    registered = manager.wait(lambda e: e["event"] == "registered")
    assert registered["resource"] == "edgegpu.io/gpu-mem-block"
    assert registered["preferred_allocation"] is True

    def advertised() -> str | None:
        node = cluster.cp.get(f"/api/v1/nodes/{NODE}") or {}
        return (node.get("status") or {}).get("allocatable", {}).get("edgegpu.io/gpu-mem-block")

    assert until("the blocks advertised", advertised, 30.0) == "6"  # 2 × T4 (15 GiB / 4 GiB)
    for i in range(3):
        cluster.create(cluster.pod(f"blocks-{i}", ns, blocks=1, qos="inference",
                                   node_selector=POOL))  # fmt: skip

    def running() -> list[dict[str, object]] | None:
        pods = [cluster.get_pod(ns, f"blocks-{i}") for i in range(3)]
        ok = all(p and (p.get("status") or {}).get("phase") == "Running" for p in pods)
        return pods if ok else None  # type: ignore[return-value]

    pods = until("the block pods Running on dp-0", running, 60.0)
    given, chosen = [], []
    for pod in pods:
        meta = pod["metadata"]  # type: ignore[index]
        envs = cluster.kubelet.envs[(ns, meta["name"])]  # type: ignore[index]
        given.append(envs["NVIDIA_VISIBLE_DEVICES"])
        chosen.append(meta["annotations"]["edgegpu.io/gpu-uuid"])  # type: ignore[index]
        assert envs["EDGEGPU_MEM_LIMIT_MIB"] == "4096"
    # Pods asking the same blocks, bound within milliseconds, are matched oldest bind first; if
    # kubelet admits them in another order two may swap GPUs, and each GPU still holds exactly
    # the blocks the extender counted on it.
    assert sorted(given) == sorted(chosen), (given, chosen)
    matched = sum(g == c for g, c in zip(given, chosen, strict=True))
    # kubelet's PodResources API, as the agent reads it after a restart: each container's blocks.
    held = asyncio.run(holders(pod_resources(cluster), "edgegpu.io/gpu-mem-block")())
    assert held == {f"{ns}/blocks-{i}": 1 for i in range(3)}
    say(
        f"device plugin: 3 one-block pods bound to {NODE} at once; containers given the GPU "
        f"chosen at bind for their own pod: {matched} of 3 (the GPUs given: {sorted(given)})"
    )

    before = sum(1 for e in manager.events if e["event"] == "registered")
    manager.restart()
    until("the plugin registered again after the kubelet restart",
          lambda: sum(1 for e in manager.events if e["event"] == "registered") > before, 30.0)  # fmt: skip
