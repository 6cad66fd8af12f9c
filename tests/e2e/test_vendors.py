"""Heterogeneous GPUs: an AMD node beside the NVIDIA ones, with the real scheduler."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.e2e.conftest import Cluster, extra_node, reported, until
from tests.e2e.edgegpu import Agent

NODE = "amd-0"


@pytest.fixture
def amd_node(cluster: Cluster) -> Iterator[Agent]:
    args = ["--model", "AMD Instinct MI210"]
    with extra_node(cluster, NODE, 2, args, gpu_resource="amd.com/gpu") as agent:
        until("amd-0 reported to every replica",
              lambda: reported(cluster, NODE), 60.0)  # fmt: skip
        yield agent


def test_an_amd_gpu_pod_lands_on_the_amd_node_only_and_its_vendor_is_shown(
    cluster: Cluster, ns: str, amd_node: Agent, say: Callable[[str], None]
) -> None:
    gpus = cluster.extenders[0].get(f"/debug/nodes/{NODE}")["gpus"]
    assert {g["vendor"] for g in gpus} == {"amd"} and gpus[0]["model"] == "AMD Instinct MI210"
    placed = {}
    for name, resource in (("on-amd", "amd.com/gpu"), ("on-nvidia", "nvidia.com/gpu")):
        pod = cluster.pod(name, ns, qos="training")
        pod["spec"]["containers"][0]["resources"]["limits"] = {resource: "1"}
        cluster.create(pod)
        placed[name] = cluster.wait_bound(ns, name, 60.0)
    amd = placed["on-amd"]
    assert amd["spec"]["nodeName"] == NODE
    index = int(amd["metadata"]["annotations"]["edgegpu.io/gpu-index"])
    assert amd["metadata"]["annotations"]["edgegpu.io/gpu-uuid"] == gpus[index]["uuid"]
    assert placed["on-nvidia"]["spec"]["nodeName"] != NODE
    say(f"vendors: the amd.com/gpu pod went to {NODE} GPU {index}, the nvidia.com/gpu pod to "
        f"{placed['on-nvidia']['spec']['nodeName']}")  # fmt: skip
