"""Pod spec → ``PodDemand``: QoS class, GPU memory blocks, whole GPUs, job group.

Reads open Pod dicts as the scheduler sends them. Imports ``domain``, ``names``, ``errors`` and
``policy.qos`` (the class mapping is a policy rule).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from scheduler_extender.domain import PodDemand
from scheduler_extender.errors import RequestError
from scheduler_extender.names import (
    GROUP_LABEL,
    GROUP_LABEL_FALLBACKS,
    MEM_BLOCK_RESOURCE,
    QOS_ANNOTATION,
    WHOLE_GPU_RESOURCE,
)
from scheduler_extender.policy.qos import QosArgs, resolve_class

_WHOLE_NUMBER = re.compile(r"^\+?\d+$")


def _quantity(value: Any, where: str) -> int:
    """An extended-resource quantity: Kubernetes allows whole numbers only."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and _WHOLE_NUMBER.match(value.strip()):
        return int(value.strip())
    raise RequestError(f"{where}: {value!r} is not a whole number")


def _container_amount(container: Any, resource: str, where: str) -> int:
    if not isinstance(container, dict):
        raise RequestError(f"{where} must be an object")
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise RequestError(f"{where}.resources must be an object")
    # For extended resources requests default to limits and must equal them when both are set.
    for kind in ("limits", "requests"):
        table = resources.get(kind) or {}
        if not isinstance(table, dict):
            raise RequestError(f"{where}.resources.{kind} must be an object")
        if resource in table:
            return _quantity(table[resource], f"{where}.resources.{kind}[{resource!r}]")
    return 0


def requested(pod: Mapping[str, Any], resource: str, where: str) -> int:
    """Effective request of one resource: max(Σ containers, max init container)."""
    spec = pod.get("spec") or {}
    if not isinstance(spec, dict):
        raise RequestError(f"{where}: spec must be an object")
    total = 0
    init_max = 0
    for field, is_init in (("containers", False), ("initContainers", True)):
        containers = spec.get(field) or []
        if not isinstance(containers, list):
            raise RequestError(f"{where}: spec.{field} must be a list")
        for i, container in enumerate(containers):
            amount = _container_amount(container, resource, f"{where}: spec.{field}[{i}]")
            if is_init:
                init_max = max(init_max, amount)
            else:
                total += amount
    return max(total, init_max)


def group_of(labels: Mapping[str, Any]) -> str | None:
    """The pod's job group, from our label or the usual gang-scheduling labels."""
    for key in (GROUP_LABEL, *GROUP_LABEL_FALLBACKS):
        value = labels.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def pod_demand(pod: Mapping[str, Any], qos: QosArgs) -> PodDemand:
    """Read what a pod asks of GPUs; raises RequestError naming the bad field."""
    meta = pod.get("metadata") or {}
    if not isinstance(meta, dict):
        raise RequestError("Pod.metadata must be an object")
    namespace = meta.get("namespace") or "default"
    name = meta.get("name") or ""
    if not isinstance(namespace, str) or not isinstance(name, str):
        raise RequestError("Pod.metadata.name and namespace must be strings")
    where = f"pod {namespace}/{name}"
    uid = meta.get("uid") or f"{namespace}/{name}"
    if not isinstance(uid, str):
        raise RequestError(f"{where}: metadata.uid must be a string")
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    if not isinstance(annotations, dict) or not isinstance(labels, dict):
        raise RequestError(f"{where}: metadata.labels and annotations must be objects")
    spec = pod.get("spec") or {}
    priority = spec.get("priority") if isinstance(spec, dict) else None
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
        raise RequestError(f"{where}: spec.priority must be an integer")
    annotation = annotations.get(QOS_ANNOTATION)
    if annotation is not None and not isinstance(annotation, str):
        raise RequestError(f"{where}: annotation {QOS_ANNOTATION} must be a string")
    try:
        qos_class = resolve_class(annotation, priority, qos)
    except ValueError as exc:
        raise RequestError(f"{where}: annotation {QOS_ANNOTATION}: {exc}") from None
    blocks = requested(pod, MEM_BLOCK_RESOURCE, where)
    whole = requested(pod, WHOLE_GPU_RESOURCE, where)
    if blocks and whole:
        raise RequestError(
            f"{where}: asks for both {MEM_BLOCK_RESOURCE} and {WHOLE_GPU_RESOURCE}; use one"
        )
    return PodDemand(
        uid=uid,
        namespace=namespace,
        name=name,
        qos=qos_class,
        mem_blocks=blocks,
        whole_gpus=whole,
        group=group_of(labels),
        priority=priority or 0,
    )
