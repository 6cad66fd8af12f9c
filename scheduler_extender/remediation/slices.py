"""The DRA driver's ResourceSlices: one per node, one device per GPU, heat and faults as taints.

The elected leader publishes them from the agents' reports (an edge node holds no credential
for the API server, and the cool-down that decides the taints is the policy's, known here). A
node's slice exists while its agent reports that kubelet accepted its DRA plugin: kubelet
deletes a node's slices when it starts and when the plugin goes away, and a slice without a
plugin behind it would send pods to a node that cannot prepare their claims.

A slice is written only when what it says changes (a GPU added or lost, a taint added or
removed, the block size), never per sample: a taint has no value that moves with the readings.
Each write is fenced by leadership and made at the stored resourceVersion; a slice someone else
changed is read again from the watch and replaced with what the reports say.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from scheduler_extender.k8s.client import JsonDict, KubeError
from scheduler_extender.k8s.dra import DraView
from scheduler_extender.names import (
    DRA_COOLING_TAINT,
    DRA_DRIVER,
    DRA_HOT_TAINT,
    DRA_MEMORY_CAPACITY,
    DRA_UNHEALTHY_TAINT,
)
from scheduler_extender.remediation.actuator import Actuator
from scheduler_extender.state.cluster import ClusterState

log = logging.getLogger("scheduler_extender.dra")

API_VERSION = "resource.k8s.io/v1"
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


def slice_name(node: str) -> str:
    """The name of the node's slice: ``<node>-gpu.edgegpu.io``, hashed where that is too long."""
    name = f"{node}-{DRA_DRIVER}"
    if len(name) <= 253:
        return name
    return f"{node[:200]}-{hashlib.sha256(node.encode()).hexdigest()[:16]}-{DRA_DRIVER}"


def quantity(mib: int) -> str:
    """``mib`` MiB as the API server writes a quantity back (``12Gi``, not ``12288Mi``).

    A slice read back then says what ours says.
    """
    for suffix, size in (("Ti", 1 << 20), ("Gi", 1 << 10)):
        if mib % size == 0:
            return f"{mib // size}{suffix}"
    return f"{mib}Mi"


def _taint_value(text: str) -> str:
    """``text`` as a label value (what a device taint's value must be)."""
    value = _LABEL_VALUE.sub("-", text)[:63].strip("-_.")
    return value


def desired_spec(state: ClusterState, node: str) -> JsonDict | None:
    """The spec the node's slice should have now; None when it should have none."""
    record = state.store.get(node)
    row = state.table.row(node)
    if record is None or row is None:
        return None
    report = record.report
    if not report.node_health.dra_plugin_registered:
        return None
    spec = state.policy.spec
    block = spec.memory.block_mib
    now = state.clock.monotonic()
    batch = state.table.gather(np.array([row]), now, spec.thermal_throttling)
    rack = state.table.rack_name(int(state.table.column("rack")[row]))
    devices = []
    for gpu in sorted(report.gpus, key=lambda g: g.index):
        attributes: dict[str, Any] = {"index": {"int": gpu.index}, "uuid": {"string": gpu.uuid}}
        for key, value in (("model", gpu.model), ("vendor", gpu.vendor or report.agent.backend),
                           ("rack", rack)):  # fmt: skip
            if value:
                attributes[key] = {"string": value}
        device: JsonDict = {"name": f"gpu-{gpu.index}", "attributes": attributes}
        total = gpu.memory_total_mib
        blocks = int(total // block) if total is not None and math.isfinite(total) else 0
        if blocks > 0:
            attributes["memoryTotalMiB"] = {"int": int(total or 0)}
            whole = quantity(blocks * block)
            device["capacity"] = {
                DRA_MEMORY_CAPACITY: {
                    "value": whole,
                    # A claim that asks no memory takes all of it (the whole GPU); one that
                    # asks some gets whole blocks.
                    "requestPolicy": {
                        "default": whole,
                        "validRange": {"min": quantity(block), "step": quantity(block)},
                    },
                }
            }
            device["allowMultipleAllocations"] = True
        taints = []
        columns = batch.excluded_until.shape[1]
        until = float(batch.excluded_until[0, gpu.index]) if gpu.index < columns else 0.0
        if until == float("inf"):
            taints.append({"key": DRA_HOT_TAINT, "effect": "NoSchedule"})
        elif until > now:
            taints.append({"key": DRA_COOLING_TAINT, "effect": "NoSchedule"})
        if gpu.health == "unhealthy":
            why = _taint_value(gpu.health_reasons[0]) if gpu.health_reasons else ""
            taint = {"key": DRA_UNHEALTHY_TAINT, "effect": "NoSchedule"}
            if why:
                taint["value"] = why
            taints.append(taint)
        if taints:
            device["taints"] = taints
        devices.append(device)
    return {
        "driver": DRA_DRIVER,
        "nodeName": node,
        "pool": {"name": node, "resourceSliceCount": 1},
        "devices": devices,
    }


def _essence(spec: JsonDict) -> Any:
    """What a slice says, less what the API server fills in (timeAdded, the pool's generation)."""
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    devices = []
    for device in spec.get("devices") or []:
        device = dict(device)
        if device.get("taints"):
            device["taints"] = [
                {k: v for k, v in t.items() if k != "timeAdded"} for t in device["taints"]
            ]
        devices.append(device)
    return {**{k: v for k, v in spec.items() if k not in ("pool", "devices")},
            "pool": pool, "devices": devices}  # fmt: skip


class SlicePublisher:
    """Keeps every node's ResourceSlice equal to what its agent's reports say (leader only)."""

    def __init__(
        self,
        state: ClusterState,
        act: Actuator,
        nodes: Callable[[], Mapping[str, JsonDict]],
        view: DraView,
    ) -> None:
        self.state = state
        self.act = act
        self.nodes = nodes
        self.view = view
        """Our slices by name, as the watch (or our own last write) shows them."""
        self.writes = 0

    # -- the loop -------------------------------------------------------------------------------
    async def step(self) -> None:
        """One pass over every node: create, replace or delete what differs."""
        if not self.view.slices_synced or not self.act.leading(self.act.timeout_s):
            return
        nodes = self.nodes()
        wanted: dict[str, tuple[str, JsonDict]] = {}
        for node, obj in nodes.items():
            spec = desired_spec(self.state, node)
            if spec is not None and (obj.get("metadata") or {}).get("uid"):
                wanted[slice_name(node)] = (node, spec)
        for name, (node, spec) in wanted.items():
            have = self.view.slices.get(name)
            if have is not None and _essence(have.get("spec") or {}) == _essence(spec):
                continue
            await self._write(name, node, spec, have, nodes[node])
        for name, have in list(self.view.slices.items()):
            node = str((have.get("spec") or {}).get("nodeName") or "")
            if name in wanted or (node in nodes and self.state.store.get(node) is None):
                # A node that has not reported since this replica started keeps its slice
                # until its agent speaks: a restart of ours is not its plugin going away.
                continue
            await self._delete(name, have)

    async def _write(
        self, name: str, node: str, spec: JsonDict, have: JsonDict | None, node_obj: JsonDict
    ) -> None:
        meta: JsonDict = {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "edgegpu"},
            # Deleted with its Node by the garbage collector.
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                                 "uid": node_obj["metadata"]["uid"], "controller": True}],
        }  # fmt: skip
        generation = 0
        if have is not None:
            meta["resourceVersion"] = have["metadata"].get("resourceVersion")
            generation = int(((have.get("spec") or {}).get("pool") or {}).get("generation", 0)) + 1
        body = {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta,
                "spec": {**spec, "pool": {**spec["pool"], "generation": generation}}}  # fmt: skip
        kube = self.act.kube
        try:
            if have is None:
                out = await self.act.call(f"create resourceslice {name}", True,
                                          kube.create_resource_slice, body)  # fmt: skip
            else:
                out = await self.act.call(f"replace resourceslice {name}", True,
                                          kube.replace_resource_slice, name, body)  # fmt: skip
        except KubeError as exc:
            if exc.status in (409, 404):  # changed or gone since the watch showed it
                log.info("resourceslice %s: %s; the watch will show it again", name, exc)
            else:
                log.warning("resourceslice %s not written: %s", name, exc)
            return
        self.view.slices[name] = out
        self.writes += 1
        taints = sorted({t["key"].split("/")[-1] + f"(gpu {d['name'][4:]})"
                         for d in spec["devices"] for t in d.get("taints", [])})  # fmt: skip
        log.info("resourceslice %s: %d devices%s", name, len(spec["devices"]),
                 f", tainted {' '.join(taints)}" if taints else "")  # fmt: skip

    async def _delete(self, name: str, have: JsonDict) -> None:
        meta = have.get("metadata") or {}
        try:
            await self.act.call(
                f"delete resourceslice {name}", True, self.act.kube.delete_resource_slice,
                name, str(meta.get("uid", "")), str(meta.get("resourceVersion", "")),
            )  # fmt: skip
        except KubeError as exc:
            if exc.status != 404:
                log.warning("resourceslice %s not deleted: %s", name, exc)
                return
        self.view.slices.pop(name, None)
        log.info("resourceslice %s deleted: its agent serves no DRA plugin now", name)
