"""Pod spec → ``PodDemand``: QoS class, GPU memory blocks, whole GPUs, host requests, group.

Reads open Pod dicts as the scheduler sends them. Imports ``domain``, ``names``, ``errors`` and
``policy.qos`` (the class mapping is a policy rule).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar

from kubernetes.utils.quantity import parse_quantity

from scheduler_extender.domain import PodDemand
from scheduler_extender.errors import RequestError
from scheduler_extender.names import (
    GROUP_LABEL,
    GROUP_LABEL_FALLBACKS,
    MEM_BLOCK_RESOURCE,
    QOS_ANNOTATION,
    WHOLE_GPU_RESOURCES,
)
from scheduler_extender.policy.qos import QosArgs, resolve_class

_WHOLE_NUMBER = re.compile(r"^\+?\d+$")
T = TypeVar("T", int, Decimal)


MAX_EXTENDED = 1 << 20
"""More GPUs or memory blocks than any node has by far: a larger request is refused as such
instead of overflowing the int64 arrays the policy counts in."""


def _quantity(value: Any, where: str) -> int:
    """An extended-resource quantity: Kubernetes allows whole numbers only."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        amount = value
    elif isinstance(value, str) and _WHOLE_NUMBER.match(value.strip()):
        amount = int(value.strip())
    else:
        raise RequestError(f"{where}: {value!r} is not a count (a whole number, 0 or more)")
    if amount > MAX_EXTENDED:
        raise RequestError(f"{where}: {value!r} is more than any node has (at most {MAX_EXTENDED})")
    return amount


def _container_value(
    container: Any, resource: str, where: str, kinds: tuple[str, str]
) -> tuple[Any, str] | None:
    """A resource's value in a container's ``kinds`` tables (first found), and where it was."""
    if not isinstance(container, dict):
        raise RequestError(f"{where} must be an object")
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise RequestError(f"{where}.resources must be an object")
    for kind in kinds:
        table = resources.get(kind) or {}
        if not isinstance(table, dict):
            raise RequestError(f"{where}.resources.{kind} must be an object")
        if resource in table:
            return table[resource], f"{where}.resources.{kind}[{resource!r}]"
    return None


def _effective(pod: Mapping[str, Any], where: str, amount: Callable[[Any, str], T], zero: T) -> T:
    """max(Σ containers, max init container) of a per-container ``amount``."""
    spec = pod.get("spec") or {}
    if not isinstance(spec, dict):
        raise RequestError(f"{where}: spec must be an object")
    total = init_max = zero
    for field, is_init in (("containers", False), ("initContainers", True)):
        containers = spec.get(field) or []
        if not isinstance(containers, list):
            raise RequestError(f"{where}: spec.{field} must be a list")
        for i, container in enumerate(containers):
            value = amount(container, f"{where}: spec.{field}[{i}]")
            if is_init:
                init_max = max(init_max, value)
            else:
                total = total + value
    return max(total, init_max)


def requested(pod: Mapping[str, Any], resource: str, where: str) -> int:
    """Effective request of one extended resource: max(Σ containers, max init container)."""

    def amount(container: Any, at: str) -> int:
        # For extended resources requests default to limits and must equal them when both are set.
        found = _container_value(container, resource, at, ("limits", "requests"))
        return 0 if found is None else _quantity(*found)

    return _effective(pod, where, amount, 0)


def _host_quantity(value: Any, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RequestError(f"{where}: {value!r} is not a quantity")
    try:
        amount: Decimal = parse_quantity(value)  # type: ignore[no-untyped-call]
    except (ValueError, ArithmeticError):
        raise RequestError(f"{where}: {value!r} is not a quantity") from None
    if amount < 0:
        raise RequestError(f"{where}: {value!r} is negative")
    return amount


_HOST_UNITS = (("cpu", Decimal("0.001")), ("memory", Decimal(1 << 20)))
"""Host resources in the units the extender keeps: millicores and MiB."""


def host_requests(pod: Mapping[str, Any], where: str) -> tuple[int, int]:
    """(CPU millicores, memory MiB) the pod requests: max(Σ containers, max init container).

    A container's request defaults to its limit (as the API server does). Rounded up, as the
    scheduler would never place a pod on less than it asks.
    """
    out = []
    for resource, unit in _HOST_UNITS:

        def amount(container: Any, at: str, resource: str = resource) -> Decimal:
            found = _container_value(container, resource, at, ("requests", "limits"))
            return Decimal(0) if found is None else _host_quantity(*found)

        out.append(math.ceil(_effective(pod, where, amount, Decimal(0)) / unit))
    return out[0], out[1]


def node_allocatable(node: Mapping[str, Any]) -> tuple[float, float]:
    """A Node's allocatable (CPU millicores, memory MiB); NaN for what is missing or unreadable."""
    status = node.get("status") or {}
    table = status.get("allocatable") if isinstance(status, dict) else None
    out = []
    for resource, unit in _HOST_UNITS:
        value = table.get(resource) if isinstance(table, dict) else None
        try:
            out.append(float(_host_quantity(value, resource) / unit))
        except RequestError:
            out.append(math.nan)
    return out[0], out[1]


def group_of(labels: Mapping[str, Any]) -> str | None:
    """The pod's job group, from our label or the usual gang-scheduling labels."""
    for key in (GROUP_LABEL, *GROUP_LABEL_FALLBACKS):
        value = labels.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def per_container(pod: Mapping[str, Any], resource: str, where: str) -> list[int]:
    """How much of ``resource`` each app container asks for (0 where none), in order."""
    containers = (pod.get("spec") or {}).get("containers") or []
    if not isinstance(containers, list):
        raise RequestError(f"{where}: spec.containers must be a list")
    out = []
    for i, container in enumerate(containers):
        found = _container_value(container, resource, f"{where}: spec.containers[{i}]",
                                 ("limits", "requests"))  # fmt: skip
        out.append(0 if found is None else _quantity(*found))
    return out


def whole_gpus(pod: Mapping[str, Any], resources: Sequence[str], where: str) -> int:
    """Whole GPUs a pod asks for, whichever vendor's resource names them."""
    return sum(requested(pod, r, where) for r in resources)


def pod_demand(
    pod: Mapping[str, Any], qos: QosArgs, whole_resources: Sequence[str] = WHOLE_GPU_RESOURCES
) -> PodDemand:
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
    whole = whole_gpus(pod, whole_resources, where)
    if blocks and whole:
        raise RequestError(f"{where}: asks for both {MEM_BLOCK_RESOURCE} and whole GPUs; use one")
    cpu, memory = host_requests(pod, where)
    return PodDemand(
        uid=uid,
        namespace=namespace,
        name=name,
        qos=qos_class,
        mem_blocks=blocks,
        whole_gpus=whole,
        group=group_of(labels),
        priority=priority or 0,
        cpu_milli=cpu,
        host_memory_mib=memory,
    )
