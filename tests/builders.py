"""Builders for pods, nodes and telemetry reports, shared by every test module."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from scheduler_extender.policy.batch import NodeBatch
from scheduler_extender.telemetry.fields import KEPT

_seq = itertools.count(1)


def gpu(
    index: int = 0,
    *,
    temperature_c: float | None = 50.0,
    power_w: float | None = 30.0,
    power_limit_w: float | None = 70.0,
    utilization_pct: float | None = 20.0,
    memory_total_mib: float | None = 16384.0,
    memory_used_mib: float | None = 0.0,
    health: str = "healthy",
    processes: list[dict[str, Any]] | None = None,
    uuid: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": uuid or f"GPU-{index:04d}",
        "model": "Tesla T4",
        "temperature_c": temperature_c,
        "power_w": power_w,
        "power_limit_w": power_limit_w,
        "utilization_pct": utilization_pct,
        "memory_total_mib": memory_total_mib,
        "memory_used_mib": memory_used_mib,
        "health": health,
        "processes": processes or [],
        **extra,
    }


def report(
    node: str = "node-a",
    gpus: list[dict[str, Any]] | None = None,
    *,
    seq: int | None = None,
    boot_id: str = "boot-1",
    interval_s: float = 5.0,
    labels: dict[str, str] | None = None,
    driver_ok: bool | None = True,
) -> dict[str, Any]:
    return {
        "schema": "edgegpu.io/telemetry/v1",
        "node": node,
        "agent": {
            "version": "0.1.0",
            "backend": "simulated",
            "boot_id": boot_id,
            "seq": next(_seq) if seq is None else seq,
        },
        "sampled_at": "2026-12-02T10:15:00.123Z",
        "interval_s": interval_s,
        "labels": labels or {},
        "node_health": {"driver_ok": driver_ok, "device_nodes_ok": True},
        "gpus": [gpu(0)] if gpus is None else gpus,
    }


def pod(
    name: str = "pod-0",
    *,
    blocks: int | str | None = 1,
    whole: int | None = None,
    qos: str | None = None,
    priority: int | None = None,
    group: str | None = None,
    uid: str | None = None,
    namespace: str = "default",
    requests: dict[str, Any] | None = None,
) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if blocks is not None:
        limits["edgegpu.io/gpu-mem-block"] = str(blocks)
    if whole is not None:
        limits["nvidia.com/gpu"] = str(whole)
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"}
    if qos is not None:
        meta["annotations"] = {"edgegpu.io/qos": qos}
    if group is not None:
        meta["labels"] = {"edgegpu.io/group": group}
    resources: dict[str, Any] = {"limits": limits}
    if requests is not None:
        resources["requests"] = requests
    spec: dict[str, Any] = {"containers": [{"name": "app", "resources": resources}]}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def args_names(pod_obj: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """ExtenderArgs as a nodeCacheCapable scheduler sends it."""
    return {"Pod": pod_obj, "Nodes": None, "NodeNames": names}


def node_object(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A realistic-looking Node object (abridged)."""
    return {
        "metadata": {
            "name": name,
            "uid": f"node-uid-{name}",
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {
            "capacity": {"cpu": "16", "memory": "65536Mi", "nvidia.com/gpu": "4"},
            "allocatable": {"cpu": "15", "memory": "64000Mi", "nvidia.com/gpu": "4"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "images": [{"names": ["nginx:1.27"], "sizeBytes": 187000000}],
        },
    }


def args_nodes(pod_obj: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """ExtenderArgs as a scheduler without nodeCacheCapable sends it."""
    return {"Pod": pod_obj, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}


def batch(
    n: int = 1,
    g: int = 1,
    *,
    temperature_c: float | list[Any] = 50.0,
    power_w: float | list[Any] = 30.0,
    power_limit_w: float | list[Any] = 70.0,
    utilization_pct: float | list[Any] = 20.0,
    memory_total_mib: float | list[Any] = 16384.0,
    unaccounted_used_mib: float | list[Any] = 0.0,
    allocated_blocks: int | list[Any] = 0,
    lent_blocks: int | list[Any] = 0,
    borrowed_blocks: int | list[Any] = 0,
    whole_taken: bool | list[Any] = False,
    health: int | list[Any] = 0,
    present: bool | list[Any] = True,
    excluded_until: float | list[Any] = -np.inf,
    known: bool | list[Any] = True,
    age_s: float | list[Any] = 1.0,
    interval_s: float = 5.0,
    driver_ok: bool | list[Any] = True,
    rack: int | list[Any] = -1,
    rdma: bool | list[Any] = False,
    host_cpu_free: float | list[Any] = np.nan,
    host_memory_free: float | list[Any] = np.nan,
    readings: dict[str, float | list[Any]] | None = None,
) -> NodeBatch:
    """A NodeBatch for direct policy tests; scalars broadcast, lists give per-node/GPU values.

    ``readings`` gives kept GPU fields beyond the named ones; a field given nowhere is NaN.
    """

    def grid(value: Any, dtype: Any) -> Any:
        # A scalar fills every slot; a flat list is per GPU when n == 1, else per node.
        arr = np.asarray(value, dtype=dtype)
        if arr.ndim == 1:
            arr = arr.reshape(1, -1) if n == 1 else arr.reshape(-1, 1)
        return np.broadcast_to(arr, (n, g)).copy()

    def line(value: Any, dtype: Any) -> Any:
        return np.broadcast_to(np.asarray(value, dtype=dtype), (n,)).copy()

    given = {
        "temperature_c": temperature_c,
        "power_w": power_w,
        "power_limit_w": power_limit_w,
        "utilization_pct": utilization_pct,
        "memory_total_mib": memory_total_mib,
        **(readings or {}),
    }
    return NodeBatch(
        known=line(known, np.bool_),
        age_s=line(age_s, np.float64),
        interval_s=line(interval_s, np.float64),
        driver_ok=line(driver_ok, np.bool_),
        present=grid(present, np.bool_),
        health=grid(health, np.int8),
        readings={name: grid(given.get(name, np.nan), np.float64) for name in KEPT},
        unaccounted_used_mib=grid(unaccounted_used_mib, np.float64),
        excluded_until=grid(excluded_until, np.float64),
        allocated_blocks=grid(allocated_blocks, np.int64),
        lent_blocks=grid(lent_blocks, np.int64),
        borrowed_blocks=grid(borrowed_blocks, np.int64),
        whole_taken=grid(whole_taken, np.bool_),
        rack=line(rack, np.int64),
        rdma=line(rdma, np.bool_),
        host_cpu_free=line(host_cpu_free, np.float64),
        host_memory_free=line(host_memory_free, np.float64),
    )
