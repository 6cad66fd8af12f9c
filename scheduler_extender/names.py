"""Every name edgegpu defines on pods and nodes (DESIGN.md §4), in one place.

Imports the standard library only: the policy, the wire layer and the agent all read these.
"""

import hashlib
import re
from typing import Final

PREFIX: Final = "edgegpu.io/"

# Pod annotations and labels.
QOS_ANNOTATION: Final = "edgegpu.io/qos"
GROUP_LABEL: Final = "edgegpu.io/group"
GROUP_LABEL_FALLBACKS: Final = (
    "scheduling.x-k8s.io/pod-group",
    "volcano.sh/job-name",
    "training.kubeflow.org/job-name",
)
GROUP_SIZE_ANNOTATION: Final = "edgegpu.io/group-size"
GPU_INDEX_ANNOTATION: Final = "edgegpu.io/gpu-index"
GPU_UUID_ANNOTATION: Final = "edgegpu.io/gpu-uuid"
ASSIGNED_AT_ANNOTATION: Final = "edgegpu.io/assigned-at"

# Extended resources.
MEM_BLOCK_RESOURCE: Final = "edgegpu.io/gpu-mem-block"
WHOLE_GPU_RESOURCE: Final = "nvidia.com/gpu"
WHOLE_GPU_RESOURCES: Final = (
    WHOLE_GPU_RESOURCE,
    "amd.com/gpu",
    "gpu.intel.com/i915",
    "gpu.intel.com/xe",
)
"""Whole-GPU resources of the vendors' device plugins (the policy's default list)."""
MANAGED_RESOURCES: Final = (MEM_BLOCK_RESOURCE, *WHOLE_GPU_RESOURCES)

# Node labels, annotations and taints.
RACK_LABEL: Final = "edgegpu.io/rack"
RACK_LABEL_FALLBACK: Final = "topology.kubernetes.io/zone"
RDMA_LABEL: Final = "edgegpu.io/rdma"
REMEDIATION_ANNOTATION: Final = "edgegpu.io/remediation"
REMEDIATION_HISTORY_ANNOTATION: Final = "edgegpu.io/remediation-history"
"""Node annotation: when each GPU (``gpu0``…, or ``node``) was last drained, for repeats."""
REMEDIATION_STATE_LABEL: Final = "edgegpu.io/remediation-state"
"""Node label: the fault loop's phase while it holds the node (``kubectl get nodes -l``)."""
UNHEALTHY_TAINT: Final = "edgegpu.io/gpu-unhealthy"
REMEDIATION_OPT_OUT: Final = "edgegpu.io/remediation"
"""Node label: ``disabled`` keeps the fault loop off the node."""
HEALTH_CONDITION: Final = "EdgeGPUHealthy"
MAINTENANCE_TAINT: Final = "edgegpu.io/maintenance"
"""Node taint (NoSchedule) of a node a GPU maintenance holds; the value names the maintenance."""
MAINTENANCE_STATE_LABEL: Final = "edgegpu.io/maintenance-state"
"""Node label: where the node is in the last GPU maintenance that took it (``kubectl get -L``)."""
MAINTENANCE_FINALIZER: Final = "edgegpu.io/maintenance"
"""Finalizer of a GPUMaintenance: deleting one in flight lets its nodes go first."""

# Telemetry.
TELEMETRY_SCHEMA: Final = "edgegpu.io/telemetry/v1"

# Policy document.
POLICY_API_VERSION: Final = "kepler.io/v1"
POLICY_KIND: Final = "GPUSchedulingPolicy"
POLICY_PLURAL: Final = "gpuschedulingpolicies"

# GPU maintenance (edgegpu.io/v1alpha1).
MAINTENANCE_API_VERSION: Final = "edgegpu.io/v1alpha1"
MAINTENANCE_KIND: Final = "GPUMaintenance"
MAINTENANCE_PLURAL: Final = "gpumaintenances"

# Dynamic Resource Allocation (resource.k8s.io/v1).
DRA_DRIVER: Final = "gpu.edgegpu.io"
"""The DRA driver's name: its DeviceClass, its ResourceSlices' driver, its kubelet plugin."""
DRA_HOT_TAINT: Final = "gpu.edgegpu.io/hot"
"""Device taint (NoSchedule) of a GPU over maxTemp."""
DRA_COOLING_TAINT: Final = "gpu.edgegpu.io/cooling-down"
"""Device taint (NoSchedule) of a GPU in its cool-down after it was hot."""
DRA_UNHEALTHY_TAINT: Final = "gpu.edgegpu.io/unhealthy"
"""Device taint (NoSchedule) of a GPU its agent reports unhealthy; the value is the reason."""
DRA_MEMORY_CAPACITY: Final = "memory"
"""The devices' consumable capacity: memory, in whole memory blocks."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def dra_device_name(uuid: str) -> str:
    """A GPU's DRA device name: its uuid in lower case where that is a DNS label (``gpu-8f3c…``).

    Else a hash of it: the same GPU, the same name, whatever its index (the extender's slices
    and the agent's health reports name it alike).
    """
    name = uuid.lower()
    if _DNS_LABEL.fullmatch(name):
        return name if name.startswith("gpu-") else f"gpu-{name}"[:63].rstrip("-")
    return f"gpu-{hashlib.sha256(uuid.encode()).hexdigest()[:16]}"
