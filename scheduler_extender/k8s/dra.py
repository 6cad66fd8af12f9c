"""What the extender sees of Dynamic Resource Allocation: our slices, the claims on our GPUs.

Fed by two reflectors (every replica): the slices of driver ``gpu.edgegpu.io``, which the leader
publishes (``remediation.slices``), and every ResourceClaim, of which those allocated a device of
ours are kept. A node's agent lists its claims from here when kubelet prepares them.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scheduler_extender.k8s.client import JsonDict
from scheduler_extender.names import DRA_DRIVER, DRA_MEMORY_CAPACITY

log = logging.getLogger("scheduler_extender.dra")

_BYTES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
          "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}  # fmt: skip
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?")


def mib_of(quantity: object) -> int | None:
    """A memory quantity (``8Gi``, ``4096Mi``, ``8589934592``) in whole MiB; None if not one."""
    text = str(quantity).strip()
    match = _QUANTITY.fullmatch(text) if len(text) <= 64 else None
    if match is None:
        return None
    number, suffix = match.groups()
    value = float(number) * _BYTES.get(suffix or "", 1) / 2**20
    return int(value) if 0 < value < 2**40 else None


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One device of ours a claim was allocated."""

    request: str
    pool: str
    device: str
    share_id: str | None
    memory_mib: int | None
    """What it consumes of the device's memory; None: no capacity (the whole device)."""
    admin: bool = False
    """Admin access (monitoring, diagnostics): the GPU is seen, not held."""


@dataclass(frozen=True, slots=True)
class Claim:
    """An allocated ResourceClaim with at least one device of ours."""

    uid: str
    namespace: str
    name: str
    node: str
    devices: tuple[ClaimDevice, ...]
    reserved_for: tuple[str, ...]
    """The pod uids it is reserved for."""


@dataclass(frozen=True, slots=True)
class ClaimWant:
    """What a claim's request of our driver asks: a count of GPUs, or memory of one."""

    count: int
    memory_mib: int | None
    """None: whole GPUs."""


MAX_COUNT = 64


def want_of(obj: JsonDict) -> ClaimWant | None:
    """What the claim asks of our driver (its request of ``gpu.edgegpu.io``); None if nothing.

    A ``firstAvailable`` request is read by its first subrequest of ours, the one the scheduler
    tries first. Admin access holds no GPU; ``allocationMode: All`` is weighed as one whole GPU
    at least. Part of one GPU's memory is one request of one device with a memory capacity;
    anything more is whole GPUs, all requests of ours added up.
    """
    found: list[tuple[int, int | None]] = []
    requests = ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []
    for r in requests if isinstance(requests, list) else []:
        if not isinstance(r, dict):
            continue
        exact = r.get("exactly")
        if not isinstance(exact, dict):
            first = r.get("firstAvailable")
            exact = next((s for s in first if isinstance(s, dict)
                          and s.get("deviceClassName") == DRA_DRIVER), None) if isinstance(
                first, list) else None  # fmt: skip
        if not isinstance(exact, dict) or exact.get("deviceClassName") != DRA_DRIVER:
            continue
        if exact.get("adminAccess") is True:
            continue
        count = 1 if exact.get("allocationMode") == "All" else exact.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= MAX_COUNT:
            count = 1  # the API server validates it; a whole GPU at least
        capacity = exact.get("capacity")
        asked = capacity.get("requests") if isinstance(capacity, dict) else None
        memory = asked.get(DRA_MEMORY_CAPACITY) if isinstance(asked, dict) else None
        found.append((count, mib_of(memory) if memory is not None else None))
    if not found:
        return None
    if len(found) == 1 and found[0][0] == 1 and found[0][1] is not None:
        return ClaimWant(1, found[0][1])
    return ClaimWant(min(sum(c for c, _ in found), MAX_COUNT), None)


def claim_of(obj: JsonDict) -> Claim | None:
    """The claim if it is allocated one of our devices on one node; None otherwise."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    devices = []
    pools = set()
    for r in results:
        if not isinstance(r, dict) or r.get("driver") != DRA_DRIVER:
            continue
        consumed = (r.get("consumedCapacity") or {}).get(DRA_MEMORY_CAPACITY)
        devices.append(
            ClaimDevice(
                request=str(r.get("request", "")),
                pool=str(r.get("pool", "")),
                device=str(r.get("device", "")),
                share_id=str(r["shareID"]) if r.get("shareID") else None,
                memory_mib=mib_of(consumed) if consumed is not None else None,
                admin=r.get("adminAccess") is True,
            )
        )
        pools.add(str(r.get("pool", "")))
    if not devices or len(pools) != 1 or _allocated_node(status) != next(iter(pools)):
        return None  # our pools are nodes: a claim of ours is on one, the one it is usable on
    reserved = tuple(
        str(ref.get("uid", "")) for ref in status.get("reservedFor") or [] if isinstance(ref, dict)
    )
    return Claim(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node=pools.pop(),
        devices=tuple(devices),
        reserved_for=reserved,
    )


def _allocated_node(status: JsonDict) -> str | None:
    """The node an allocation is usable on (its nodeSelector's ``metadata.name``)."""
    selector = (status.get("allocation") or {}).get("nodeSelector") or {}
    terms = selector.get("nodeSelectorTerms") or []
    if len(terms) != 1:
        return None
    for field in terms[0].get("matchFields") or []:
        values = field.get("values") or []
        if (field.get("key"), field.get("operator"), len(values)) == ("metadata.name", "In", 1):
            return str(values[0])
    return None


def _claim_names(pod: JsonDict) -> tuple[str, list[str]]:
    """The pod's namespace and the names of its claims (a template's from the pod's status)."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    spec = pod.get("spec") or {}
    names = [str(r["resourceClaimName"]) for r in spec.get("resourceClaims") or []
             if isinstance(r, dict) and r.get("resourceClaimName")]  # fmt: skip
    names += [str(s["resourceClaimName"])
              for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
              if isinstance(s, dict) and s.get("resourceClaimName")]  # fmt: skip
    return namespace, list(dict.fromkeys(names))


DRA_MANAGED_BY = "edgegpu"
"""``app.kubernetes.io/managed-by`` of the slices the leader publishes."""


def _ours(obj: JsonDict) -> str | None:
    """The node a slice of ours is for: our driver, our label, its pool named after its node.

    None for any other slice (one a node made for itself under our driver is not taken).
    """
    spec = obj.get("spec") or {}
    labels = (obj.get("metadata") or {}).get("labels") or {}
    node = spec.get("nodeName")
    if (
        spec.get("driver") == DRA_DRIVER
        and labels.get("app.kubernetes.io/managed-by") == DRA_MANAGED_BY
        and node
        and (spec.get("pool") or {}).get("name") == node
    ):
        return str(node)
    return None


class DraView:
    """Our ResourceSlices by node and the claims allocated our devices, by uid."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        """``now``: the clock the deletions of slices are timed on (the telemetry store's)."""
        self._now = now
        self.slices: dict[str, JsonDict] = {}
        """Our slices by name."""
        self._by_node: dict[str, set[str]] = {}
        """The names of each node's slices of ours (more than one only until the extras go)."""
        self._devices: dict[tuple[str, str], JsonDict] = {}
        """The last device of each name a slice of ours said, by (node, device): a device is
        named after its GPU's uuid, so what it says of the GPU outlives a wiped slice."""
        self._gone: set[str] = set()
        """Names of our slices the watch showed deleted since the last relist (a create's
        answer handled after its deletion is not put back)."""
        self.orphans: dict[str, JsonDict] = {}
        """Slices of ours edited to look like none of ours, as they are now, by name: still
        publishing the node's GPUs, without what we keep in them (the publisher deletes them)."""
        self.slices_synced = False
        self.deleted_at: dict[str, float] = {}
        """By node: when its last slice of ours was seen deleted."""
        self.claims: dict[str, Claim] = {}
        self.claims_synced = False
        self._named: dict[tuple[str, str], str] = {}
        """Claim uids by (namespace, name)."""
        self._wants: dict[tuple[str, str], ClaimWant] = {}
        """What each claim of our driver not allocated yet asks, by (namespace, name)."""

    # -- slices ---------------------------------------------------------------------------------
    def replace_slices(self, items: list[JsonDict]) -> None:
        """A relist of our driver's slices."""
        before = set(self._by_node)
        self.slices, self._by_node, self._gone = {}, {}, set()
        for s in items:
            self.slice_event("ADDED", s)
        for node in before - set(self._by_node):
            self.deleted_at[node] = self._now()
        self.slices_synced = True

    def slice_event(self, kind: str, obj: JsonDict) -> None:
        """One watch event on a slice."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        node = _ours(obj)
        if node is None:
            if name in self.orphans:
                if kind == "DELETED":
                    del self.orphans[name]
                else:
                    self.orphans[name] = obj
                return
            known = self.slices.get(name)
            if known is None:
                return
            if kind != "DELETED":
                self.orphans[name] = obj
            # One of ours no longer looks it (its label or pool edited): gone from our view,
            # so that it is made again rather than replaced at a version it no longer has.
            log.warning("resourceslice %s no longer has our label, driver or pool: not ours now",
                        name)  # fmt: skip
            kind, obj, node = "DELETED", known, _ours(known)
            if node is None:
                return
        names = self._by_node.setdefault(node, set())
        if kind == "DELETED":
            self.slices.pop(name, None)
            self._gone.add(name)
            names.discard(name)
            if not names:
                del self._by_node[node]
                self.deleted_at[node] = self._now()
            return
        self.slices[name] = obj
        names.add(name)
        if self.of_node(node) is obj:  # the kept one speaks for the node's GPUs
            for d in (obj.get("spec") or {}).get("devices") or []:
                if isinstance(d, dict) and d.get("name"):
                    self._devices[(node, str(d["name"]))] = d

    def written(self, sent: JsonDict | None, answer: JsonDict) -> None:
        """Our write's answer, unless the watch has shown something newer of the slice already.

        ``sent``: the slice as it was before a replace (None: a create). A created slice's
        name is new, so its answer is stored when the watch has not shown it yet; a replaced
        one's when the stored slice is still the one replaced.
        """
        name = str(answer["metadata"]["name"])
        stored = self.slices.get(name)
        if sent is None:
            if stored is None and name not in self._gone:
                self.slice_event("ADDED", answer)
            return
        if stored is not None and (stored.get("metadata") or {}).get("resourceVersion") == (
            sent.get("metadata") or {}
        ).get("resourceVersion"):
            self.slice_event("MODIFIED", answer)

    def slices_of(self, node: str) -> list[JsonDict]:
        """The node's slices of ours, the one it keeps first (the oldest, then by name)."""
        found = [self.slices[n] for n in self._by_node.get(node, ()) if n in self.slices]
        return sorted(found, key=lambda s: (str(s["metadata"].get("creationTimestamp") or ""),
                                            str(s["metadata"]["name"])))  # fmt: skip

    def of_node(self, node: str) -> JsonDict | None:
        """The node's slice of ours, if it has one."""
        found = self.slices_of(node)
        return found[0] if found else None

    def nodes(self) -> list[str]:
        """The nodes with a slice of ours."""
        return list(self._by_node)

    def _device(self, node: str, device: str) -> JsonDict | None:
        """The device as the node's slice says it, else as the last one of ours said it."""
        for d in ((self.of_node(node) or {}).get("spec") or {}).get("devices") or []:
            if isinstance(d, dict) and d.get("name") == device:
                return d
        return self._devices.get((node, device))

    def forget_node(self, node: str) -> None:
        """What the node's slices said of its devices, once the Node is gone."""
        for key in [k for k in self._devices if k[0] == node]:
            del self._devices[key]

    def gpu_uuid(self, node: str, device: str) -> str | None:
        """The GPU uuid our slice of ``node`` gives ``device``; None when not known."""
        d = self._device(node, device) or {}
        uuid = ((d.get("attributes") or {}).get("uuid") or {}).get("string")
        return str(uuid) if uuid else None

    def gpu_index(self, node: str, device: str) -> int | None:
        """The GPU index our slice of ``node`` gives ``device``; None when not known."""
        d = self._device(node, device) or {}
        index = ((d.get("attributes") or {}).get("index") or {}).get("int")
        return index if isinstance(index, int) and not isinstance(index, bool) else None

    def memory_mib(self, node: str, device: str) -> int | None:
        """The memory capacity our slice of ``node`` gives ``device``; None when not known."""
        d = self._device(node, device) or {}
        value = ((d.get("capacity") or {}).get(DRA_MEMORY_CAPACITY) or {}).get("value")
        return mib_of(value) if value is not None else None

    # -- claims ---------------------------------------------------------------------------------
    def replace_claims(self, items: list[JsonDict]) -> None:
        """A relist of every ResourceClaim."""
        claims = (claim_of(c) for c in items)
        self.claims = {c.uid: c for c in claims if c is not None}
        self._named = {(c.namespace, c.name): c.uid for c in self.claims.values()}
        self._wants = {}
        for c in items:
            self._want_event("ADDED", c)
        self.claims_synced = True

    def _want_event(self, kind: str, obj: JsonDict) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
        allocated = (obj.get("status") or {}).get("allocation")
        want = None if kind == "DELETED" or allocated else want_of(obj)
        if want is None:
            self._wants.pop(key, None)
        else:
            self._wants[key] = want

    def claim_event(self, kind: str, obj: JsonDict) -> None:
        """One watch event on a claim."""
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        claim = None if kind == "DELETED" else claim_of(obj)
        old = self.claims.pop(uid, None)
        if old is not None:
            self._named.pop((old.namespace, old.name), None)
        if claim is not None:
            self.claims[uid] = claim
            self._named[(claim.namespace, claim.name)] = uid
        self._want_event(kind, obj)

    def claim_named(self, namespace: str, name: str) -> Claim | None:
        """The allocated claim of that name, if it is one of ours."""
        uid = self._named.get((namespace, name))
        return self.claims.get(uid) if uid is not None else None

    def claims_of(self, pod: JsonDict) -> list[Claim]:
        """The pod's claims that were allocated devices of ours."""
        namespace, names = _claim_names(pod)
        found = (self.claim_named(namespace, n) for n in names)
        return [c for c in found if c is not None]

    def wants_of(self, pod: JsonDict) -> list[ClaimWant]:
        """What the pod's claims not allocated yet ask of our driver (the scheduler's to place).

        A claim allocated already (shared with a pod placed before) takes no more GPUs.
        """
        namespace, names = _claim_names(pod)
        found = (self._wants.get((namespace, n)) for n in names)
        return [w for w in found if w is not None]

    def claims_on(self, node: str) -> list[dict[str, Any]]:
        """The node's claims as its agent reads them (``/v1/nodes/{node}/claims``)."""
        rows = []
        for c in self.claims.values():
            if c.node != node:
                continue
            devices = []
            for d in c.devices:
                uuid = self.gpu_uuid(node, d.device)
                if uuid is None:
                    log.warning("claim %s/%s: device %s of node %s is in no slice of ours",
                                c.namespace, c.name, d.device, node)  # fmt: skip
                    break
                devices.append({"request": d.request, "pool": d.pool, "device": d.device,
                                "uuid": uuid, "memory_mib": d.memory_mib,
                                "share_id": d.share_id})  # fmt: skip
            else:
                rows.append({"uid": c.uid, "namespace": c.namespace, "name": c.name,
                             "devices": devices})  # fmt: skip
        return rows
