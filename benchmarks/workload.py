"""Deterministic workloads: node telemetry, realistic Node objects, pods of every class."""

from __future__ import annotations

import random
from typing import Any

import orjson

MODELS = (("Tesla T4", 15360, 70.0), ("NVIDIA A10", 23028, 150.0), ("NVIDIA L4", 23034, 72.0))


def node_name(i: int) -> str:
    return f"edge-{i:05d}"


def report(i: int, seq: int, gpus: int = 8, seed: int = 0) -> dict[str, Any]:
    """Telemetry of node i: a realistic spread of temperature, power, memory and load."""
    rng = random.Random(seed * 1_000_003 + i)
    model, mem, tdp = MODELS[i % len(MODELS)]
    out = []
    for g in range(gpus):
        util = rng.uniform(0, 100)
        out.append(
            {
                "index": g,
                "uuid": f"GPU-{i:05d}-{g:02d}-0000-0000-000000000000",
                "model": model,
                "temperature_c": round(rng.gauss(62, 12), 1),
                "power_w": round(tdp * (0.15 + 0.8 * util / 100), 1),
                "power_limit_w": tdp,
                "utilization_pct": round(util, 1),
                "memory_total_mib": mem,
                "memory_used_mib": round(rng.choice([0.0, 0.1, 0.3, 0.6, 0.9]) * mem),
                "sm_clock_mhz": 1590,
                "sm_clock_max_mhz": 1590,
                "throttle_reasons": [],
                "ecc_uncorrected": 0,
                "xid_last": None,
                "health": "unhealthy" if rng.random() < 0.01 else "healthy",
                "health_reasons": [],
                "processes": [],
            }
        )
    return {
        "schema": "edgegpu.io/telemetry/v1",
        "node": node_name(i),
        "agent": {"version": "0.1.0", "backend": "simulated", "boot_id": f"boot-{i}", "seq": seq},
        "sampled_at": "2026-12-02T10:15:00.123Z",
        "interval_s": 60.0,
        "labels": {"edgegpu.io/rack": f"rack-{i // 40:03d}"},
        "node_health": {"driver_ok": True, "device_nodes_ok": True, "cuda_ctx_success_ratio": 1.0},
        "gpus": out,
    }


def report_variant(i: int, seq: int, variant: int, gpus: int = 8) -> dict[str, Any]:
    """Node i's report as a later sample: the same GPUs and memory, readings that moved a little
    (temperature ±1.5 °C, power ±3 %, utilisation ±5 points), as consecutive samples do.
    """
    doc = report(i, seq, gpus)
    rng = random.Random(i * 7919 + variant)
    for g in doc["gpus"]:
        g["temperature_c"] = round(g["temperature_c"] + rng.uniform(-1.5, 1.5), 1)
        g["power_w"] = round(min(g["power_w"] * rng.uniform(0.97, 1.03), g["power_limit_w"]), 1)
        g["utilization_pct"] = round(
            min(max(g["utilization_pct"] + rng.uniform(-5, 5), 0.0), 100.0), 1
        )
    return doc


def node_object(i: int) -> dict[str, Any]:
    """A Node as the scheduler's snapshot holds it: labels, capacity, conditions, images."""
    name = node_name(i)
    rng = random.Random(i)
    images = [
        {
            "names": [f"registry.example.com/team-{k}/image-{k}@sha256:{rng.getrandbits(256):064x}",
                      f"registry.example.com/team-{k}/image-{k}:v1.{k}"],
            "sizeBytes": rng.randrange(10_000_000, 3_000_000_000),
        }
        for k in range(25)
    ]  # fmt: skip
    conditions = [
        {"type": t, "status": "False" if t != "Ready" else "True", "lastHeartbeatTime": "2026-12-02T10:14:55Z",
         "lastTransitionTime": "2026-11-30T08:00:00Z", "reason": f"Kubelet{t}", "message": f"kubelet reports {t}"}
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready", "NetworkUnavailable")
    ]  # fmt: skip
    capacity = {"cpu": "64", "memory": "263856544Ki", "ephemeral-storage": "1855793132Ki", "pods": "110",
                "hugepages-1Gi": "0", "hugepages-2Mi": "0", "nvidia.com/gpu": "8"}  # fmt: skip
    return {
        "metadata": {
            "name": name,
            "uid": f"{i:08x}-1111-2222-3333-444444444444",
            "resourceVersion": str(1_000_000 + i),
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "g4dn.16xlarge", "topology.kubernetes.io/region": "edge-1",
                "topology.kubernetes.io/zone": f"edge-1{'abc'[i % 3]}", "edgegpu.io/rack": f"rack-{i // 40:03d}",
                "accelerator": "nvidia-tesla", "nvidia.com/gpu.product": MODELS[i % 3][0].replace(" ", "-"),
                "nvidia.com/gpu.count": "8", "nvidia.com/cuda.driver.major": "570",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
            },
        },
        "spec": {"podCIDR": f"10.{i // 250}.{i % 250}.0/24", "podCIDRs": [f"10.{i // 250}.{i % 250}.0/24"],
                 "providerID": f"aws:///edge-1a/i-{i:017x}"},
        "status": {
            "capacity": capacity,
            "allocatable": {**capacity, "cpu": "63500m", "memory": "261234567Ki"},
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 250}.{i % 250}"},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": f"{i:032x}", "systemUUID": f"{i:032x}", "bootID": f"{i:032x}",
                         "kernelVersion": "6.8.0-1019-aws", "osImage": "Ubuntu 24.04.1 LTS",
                         "containerRuntimeVersion": "containerd://1.7.24", "kubeletVersion": "v1.34.2",
                         "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images,
        },
    }  # fmt: skip


QOS_MIX = ("inference", "inference", "inference", "best-effort", "training", "realtime")


def pod(k: int) -> dict[str, Any]:
    """The k-th pod of a mix of classes and requests (blocks, whole GPUs, groups)."""
    qos = QOS_MIX[k % len(QOS_MIX)]
    if k % 7 == 0:
        limits = {"nvidia.com/gpu": str(1 + k % 2)}
    else:
        limits = {"edgegpu.io/gpu-mem-block": str(1 + k % 3)}
    meta: dict[str, Any] = {
        "name": f"pod-{k}", "namespace": "bench", "uid": f"uid-{k:08d}",
        "annotations": {"edgegpu.io/qos": qos}, "creationTimestamp": "2026-12-02T10:00:00Z",
    }  # fmt: skip
    if qos == "training":
        meta["labels"] = {"edgegpu.io/group": f"job-{k % 5}"}
    return {
        "metadata": meta,
        "spec": {
            "schedulerName": "edgegpu-scheduler",
            "priority": 0,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example.com/app:1",
                    "resources": {"limits": limits},
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def filter_body(k: int, nodes: int, full: list[dict[str, Any]] | None) -> bytes:
    """ExtenderArgs for pod k in names mode (full is None) or full-Node mode."""
    if full is None:
        return orjson.dumps(
            {"Pod": pod(k), "Nodes": None, "NodeNames": [node_name(i) for i in range(nodes)]}
        )
    return orjson.dumps(
        {"Pod": pod(k), "Nodes": {"metadata": {}, "items": full[:nodes]}, "NodeNames": None}
    )
