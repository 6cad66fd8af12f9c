"""The DRA driver's ResourceSlices: one per node, one device per GPU, heat and faults as taints.

The elected leader publishes them from the agents' reports (an edge node holds no credential
for the API server, and the cool-down that decides the taints is the policy's, known here). A
node's slice exists while its agent reports that kubelet accepted its DRA plugin: kubelet
deletes a node's slices when it starts and when the plugin goes away, and a slice without a
plugin behind it would send pods to a node that cannot prepare their claims. A slice someone
deleted is made again only from a report received after that, and only a fresh one.

A GPU's device is named after its uuid, so that a claim names the same GPU whatever index it
has after a reboot. A slice is written only when what it says changes (a GPU added or lost, a
taint added or removed, the block size), never per sample: no taint has a value that moves
with the readings. Each write is fenced by leadership and made at the stored resourceVersion;
one an API server stores without some field (a feature gate off) is not sent again until what
it should say changes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from scheduler_extender.k8s.client import JsonDict, KubeError
from scheduler_extender.k8s.dra import DRA_MANAGED_BY, DraView
from scheduler_extender.names import (
    DRA_COOLING_TAINT,
    DRA_DRIVER,
    DRA_HOT_TAINT,
    DRA_MEMORY_CAPACITY,
    DRA_UNHEALTHY_TAINT,
    dra_device_name,
)
from scheduler_extender.remediation.actuator import Actuator, NotLeading
from scheduler_extender.state.cluster import ClusterState

log = logging.getLogger("scheduler_extender.dra")

API_VERSION = "resource.k8s.io/v1"
PERIOD_S = 2.0
UNPLUGGED_GRACE_S = 30.0
"""How long a node's agent must say its plugin is not registered before its slice goes: an
agent that restarts says so for a moment (kubelet waits as long before it wipes a slice)."""
MAX_WRITES = 50
"""Slice writes per round at most (the rest wait for the next round)."""
ATTRIBUTE_MAX = 64
"""The longest string a device attribute may hold, in bytes (the API server counts bytes)."""
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


def quantity(mib: int) -> str:
    """``mib`` MiB as the API server writes a quantity back (``12Gi``, not ``12288Mi``).

    A slice read back then says what ours says.
    """
    for suffix, size in (("Ti", 1 << 20), ("Gi", 1 << 10)):
        if mib % size == 0:
            return f"{mib // size}{suffix}"
    return f"{mib}Mi"


_NUMERIC_VERSION = re.compile(r"^(\d{1,9})\.(\d{1,9})(?:\.(\d{1,9}))?$")


def semantic_version(driver: str | None) -> str | None:
    """A driver version as a DRA ``version`` attribute (semver), for CEL's ``compareTo``.

    ``570.86.15`` and ``535.104.05`` (read 535.104.5) are; a version of another shape (Intel's
    ``I915_23.10.32_PSB_...``) is only the ``driver`` string.
    """
    found = _NUMERIC_VERSION.match(driver or "")
    if found is None:
        return None
    major, minor, patch = found.groups()
    return f"{int(major)}.{int(minor)}.{int(patch or 0)}"


def _cut(text: str) -> str:
    """``text`` in at most ``ATTRIBUTE_MAX`` bytes of UTF-8, no character split."""
    return text.encode()[:ATTRIBUTE_MAX].decode(errors="ignore")


def _taint_value(text: str) -> str:
    """``text`` as a label value (what a device taint's value must be)."""
    return _LABEL_VALUE.sub("-", text)[:63].strip("-_.")


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
    names: set[str] = set()
    for gpu in sorted(report.gpus, key=lambda g: g.index):
        name = dra_device_name(gpu.uuid)
        if len(gpu.uuid.encode()) > ATTRIBUTE_MAX or name in names:
            log.warning("node %s: gpu %d's uuid %r cannot name a device of its own: left out",
                        node, gpu.index, gpu.uuid[:80])  # fmt: skip
            continue
        names.add(name)
        attributes: dict[str, Any] = {"index": {"int": gpu.index}, "uuid": {"string": gpu.uuid}}
        for key, value in (("model", gpu.model), ("vendor", gpu.vendor or report.agent.backend),
                           ("rack", rack), ("driver", gpu.driver_version),
                           ("vbiosVersion", gpu.vbios_version),
                           ("firmwareVersion", gpu.firmware_version)):  # fmt: skip
            if value:
                attributes[key] = {"string": _cut(value)}
        version = semantic_version(gpu.driver_version)
        if version is not None:
            attributes["driverVersion"] = {"version": version}
        device: JsonDict = {"name": name, "attributes": attributes}
        total = gpu.memory_total_mib
        blocks = int(total // block) if total is not None and math.isfinite(total) else 0
        if blocks > 0:
            attributes["memoryTotalMiB"] = {"int": int(total or 0)}
            whole = quantity(blocks * block)
            memory: JsonDict = {"value": whole}
            if blocks > 1:
                # A claim that asks no memory takes all of it (the whole GPU); one that asks
                # some gets whole blocks, and the GPU is shared until its blocks are taken.
                memory["requestPolicy"] = {
                    "default": whole,
                    "validRange": {"min": quantity(block), "step": quantity(block)},
                }
                device["allowMultipleAllocations"] = True
            device["capacity"] = {DRA_MEMORY_CAPACITY: memory}
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


def _keep_taint_times(spec: JsonDict, have: JsonDict) -> JsonDict:
    """``spec`` with the timeAdded of every taint ``have`` has already (it is not reset)."""
    times = {
        (d.get("name"), t.get("key"), t.get("value"), t.get("effect")): t["timeAdded"]
        for d in (have.get("spec") or {}).get("devices") or []
        for t in d.get("taints") or []
        if t.get("timeAdded")
    }
    devices = []
    for d in spec["devices"]:
        if d.get("taints"):
            d = {**d, "taints": [
                {**t, **({"timeAdded": stamp} if (stamp := times.get(
                    (d["name"], t["key"], t.get("value"), t["effect"]))) else {})}
                for t in d["taints"]]}  # fmt: skip
        devices.append(d)
    return {**spec, "devices": devices}


class SlicePublisher:
    """Keeps every node's ResourceSlice equal to what its agent's reports say (leader only)."""

    def __init__(
        self,
        state: ClusterState,
        act: Actuator,
        nodes: Callable[[], Mapping[str, JsonDict]],
        view: DraView,
        synced: Callable[[], bool] = lambda: True,
    ) -> None:
        """``synced``: whether the Node cache (and the policy) are there to decide from."""
        self.state = state
        self.act = act
        self.nodes = nodes
        self.view = view
        self.synced = synced
        self._left: dict[str, tuple[str, Any]] = {}
        """By node: the resourceVersion of the slice as our last write left it, and what that
        write asked for (the stored slice may lack what the API server does not serve)."""
        self._said_dropped: set[str] = set()
        self._unplugged: dict[str, float] = {}
        """By node: since when its agent has said it serves no registered plugin."""
        self._next: str | None = None
        """The node the last round's write cap stopped at."""

    async def run(self) -> None:
        """``step`` every ``PERIOD_S``; no error ends the loop."""
        while True:
            await asyncio.sleep(PERIOD_S)
            try:
                await self.step()
            except NotLeading as exc:
                log.warning("resourceslices: leadership lost before %s", exc)
            except Exception:
                log.exception("resourceslices: the round failed; carrying on")

    async def step(self) -> None:
        """One pass over every node: create, replace or delete what differs."""
        if not (self.view.slices_synced and self.synced()):
            return
        if not self.act.leading(self.act.timeout_s):
            self._unplugged.clear()  # a grace counted while another replica led is not ours
            return
        nodes = self.nodes()
        writes = 0
        # Each round starts where the last one's cap stopped it, so that no node waits on
        # the ones before it in the list forever.
        order = sorted(nodes)
        if self._next is not None:
            at = next((i for i, n in enumerate(order) if n >= self._next), 0)
            order = order[at:] + order[:at]
        self._next = None
        for node in order:
            if writes >= MAX_WRITES:
                self._next = node
                break
            obj = nodes[node]
            slices = self.view.slices_of(node)
            for extra in slices[1:]:  # made by a create whose answer never came back
                if writes < MAX_WRITES:
                    await self._delete(node, extra, "a second slice of the node")
                    writes += 1
            have = slices[0] if slices else None
            spec = desired_spec(self.state, node)
            if spec is None:
                # A node not heard of since this replica started keeps its slice until its
                # agent speaks: a restart of ours is not its plugin going away.
                if have is not None and self.state.store.get(node) is not None:
                    since = self._unplugged.setdefault(node, self.state.clock.monotonic())
                    if self.state.clock.monotonic() - since >= UNPLUGGED_GRACE_S:
                        await self._delete(node, have, f"{node} serves no DRA plugin now")
                        writes += 1
                continue
            self._unplugged.pop(node, None)
            if not (obj.get("metadata") or {}).get("uid"):
                continue
            if have is None:
                if not self._may_create(node):
                    continue
            elif _essence(have.get("spec") or {}) == _essence(spec) or self._left.get(node) == (
                have["metadata"].get("resourceVersion"),
                _essence(spec),
            ):
                continue  # as it should be, or as our last write of the same spec left it
            await self._write(node, spec, have, obj)
            writes += 1
        for node in self.view.nodes():
            if node in nodes:
                continue
            for have in self.view.slices_of(node):
                if writes < MAX_WRITES:  # its Node is gone (the garbage collector may lag)
                    await self._delete(node, have, f"node {node} is gone")
                    writes += 1
            if not self.view.slices_of(node):
                self.view.forget_node(node)
        for name, orphan in list(self.view.orphans.items()):
            if writes < MAX_WRITES:
                await self._delete_orphan(name, orphan)
                writes += 1

    def _may_create(self, node: str) -> bool:
        """A new slice needs a fresh report, received after any deletion of the last one."""
        record = self.state.store.get(node)
        if record is None or not self.state.telemetry_fresh(node):
            return False
        deleted = self.view.deleted_at.get(node)
        return deleted is None or record.received_at > deleted

    async def _write(
        self, node: str, spec: JsonDict, have: JsonDict | None, node_obj: JsonDict
    ) -> None:
        meta: JsonDict = {
            "labels": {"app.kubernetes.io/managed-by": DRA_MANAGED_BY},
            # Deleted with its Node by the garbage collector.
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                                 "uid": node_obj["metadata"]["uid"], "controller": True}],
        }  # fmt: skip
        generation = 0
        if have is None:
            meta["generateName"] = f"{node[:200].rstrip('.-')}-{DRA_DRIVER}-"
        else:
            meta["name"] = have["metadata"]["name"]
            meta["resourceVersion"] = have["metadata"].get("resourceVersion")
            generation = int(((have.get("spec") or {}).get("pool") or {}).get("generation", 0)) + 1
            spec = _keep_taint_times(spec, have)
        sent: JsonDict = {**spec, "pool": {**spec["pool"], "generation": generation}}
        body = {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta,
                "spec": sent}  # fmt: skip
        kube = self.act.kube
        what = f"resourceslice of {node}"
        try:
            if have is None:
                out = await self.act.call(f"create {what}", True, kube.create_resource_slice,
                                          body)  # fmt: skip
            else:
                out = await self.act.call(f"replace {what}", True, kube.replace_resource_slice,
                                          meta["name"], body)  # fmt: skip
        except KubeError as exc:
            if exc.status in (409, 404):  # changed or gone since the watch showed it
                log.info("%s: %s; the watch will show it again", what, exc)
                if exc.status == 404 and have is not None:
                    self.view.slice_event("DELETED", have)
            else:
                log.warning("%s not written: %s", what, exc)
            return
        self.view.written(have, out)
        self.act.metrics.slice_writes.labels("create" if have is None else "replace").inc()
        self._left[node] = (str(out["metadata"].get("resourceVersion")), _essence(spec))
        dropped = _essence(out.get("spec") or {}) != _essence(sent)
        if dropped and node not in self._said_dropped:
            self._said_dropped.add(node)
            log.error("%s: the API server stored it without some of what was sent (device "
                      "taints and shared memory need Kubernetes 1.36, or the feature gates "
                      "DRADeviceTaints and DRAConsumableCapacity on the API server and the "
                      "scheduler): hot and faulty GPUs are not kept from new claims",
                      what)  # fmt: skip
        taints = sorted({f"{t['key'].split('/')[-1]}(gpu {d['attributes']['index']['int']})"
                         for d in spec["devices"]
                         for t in d.get("taints", [])})  # fmt: skip
        log.info("%s: %d devices%s", what, len(spec["devices"]),
                 f", tainted {' '.join(taints)}" if taints else "")  # fmt: skip

    async def _delete_orphan(self, name: str, orphan: JsonDict) -> None:
        """A slice of ours someone edited away from our label, driver or pool."""
        status = await self._deleted(orphan)
        if status in (None, 409):  # 409: edited again; the watch shows it again if ours
            self.view.orphans.pop(name, None)
        if status is None:
            log.warning("resourceslice %s deleted: edited to be none of ours, it still "
                        "published the node's GPUs without the taints the leader keeps in it",
                        name)  # fmt: skip

    async def _deleted(self, obj: JsonDict) -> int | None:
        """Delete a slice at its uid and resourceVersion.

        None when it is gone, else the status of the refusal.
        """
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        try:
            await self.act.call(
                f"delete resourceslice {name}", True, self.act.kube.delete_resource_slice,
                name, str(meta.get("uid", "")), str(meta.get("resourceVersion", "")),
            )  # fmt: skip
        except KubeError as exc:
            if exc.status != 404:
                log.warning("resourceslice %s not deleted: %s", name, exc)
                return exc.status
        self.act.metrics.slice_writes.labels("delete").inc()
        return None

    async def _delete(self, node: str, have: JsonDict, why: str) -> None:
        if await self._deleted(have) is not None:
            return
        name = str((have.get("metadata") or {}).get("name", ""))
        self.view.slice_event("DELETED", have)
        if self.view.of_node(node) is None:
            self._left.pop(node, None)
            self._unplugged.pop(node, None)
        log.info("resourceslice %s deleted: %s", name, why)
