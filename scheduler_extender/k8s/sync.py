"""Keep the extender's caches in step with the cluster: Nodes, Pods and the policy resource.

Reflectors list and watch in threads; every change is applied on the event loop, so the
state stays single-threaded and the scheduler verbs never wait on the API server.

* Nodes: labels (rack, RDMA) into the node table; a deleted Node is forgotten.
* Pods: GPU assignments read back from the annotations bind wrote (authoritative: they hold
  until the pod is gone or finished), the reconciliation of bind's assume cache (a deleted pod
  frees its GPUs), and the pod → node map agent authentication checks tokens against.
* GPUSchedulingPolicy ``--policy-name``: hot reload; an invalid document is refused with every
  error in its status and the previous policy stays in force; deleting it restores the policy
  the extender started with.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from scheduler_extender.domain import Assignment, QosClass
from scheduler_extender.errors import PolicyError, RequestError
from scheduler_extender.k8s.client import JsonDict, KubeApi, KubeError
from scheduler_extender.k8s.dra import DraView
from scheduler_extender.k8s.translate import (
    group_of,
    host_requests,
    node_allocatable,
    requested,
    whole_gpus,
)
from scheduler_extender.k8s.watchers import Reflector
from scheduler_extender.names import (
    ASSIGNED_AT_ANNOTATION,
    GPU_INDEX_ANNOTATION,
    GPU_UUID_ANNOTATION,
    MEM_BLOCK_RESOURCE,
    POLICY_PLURAL,
    QOS_ANNOTATION,
)
from scheduler_extender.policy.document import Policy, parse_policy
from scheduler_extender.policy.qos import resolve_class
from scheduler_extender.state.cluster import ClusterState

log = logging.getLogger("scheduler_extender.sync")

_FINISHED = frozenset({"Succeeded", "Failed"})


def _iso_to_epoch(text: str | None, default: float) -> float:
    if not text:
        return default
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


def assignment_from_pod(pod: JsonDict, state: ClusterState) -> Assignment | None:
    """The GPU assignment a bound pod carries in its annotations, if any."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    index = annotations.get(GPU_INDEX_ANNOTATION)
    if not node or not index or (pod.get("status") or {}).get("phase") in _FINISHED:
        return None
    try:
        indices = tuple(int(i) for i in str(index).split(","))
    except ValueError:
        log.warning(
            "pod %s/%s: bad %s %r",
            meta.get("namespace"),
            meta.get("name"),
            GPU_INDEX_ANNOTATION,
            index,
        )
        return None
    where = f"pod {meta.get('namespace')}/{meta.get('name')}"
    try:
        blocks = requested(pod, MEM_BLOCK_RESOURCE, where)
        whole = whole_gpus(pod, state.policy.spec.whole_gpu_resources, where)
    except RequestError as exc:
        log.warning("%s", exc)
        return None
    try:
        qos = resolve_class(
            annotations.get(QOS_ANNOTATION),
            (pod.get("spec") or {}).get("priority"),
            state.policy.spec.qos,
        )
    except ValueError:
        qos = state.policy.spec.qos.default_class
    uuids = tuple(u for u in str(annotations.get(GPU_UUID_ANNOTATION, "")).split(",") if u)
    return Assignment(
        pod_uid=str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"),
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        node=str(node),
        gpu_indices=indices,
        gpu_uuids=uuids if len(uuids) == len(indices) else tuple("" for _ in indices),
        mem_blocks=blocks,
        whole=whole > 0 or qos is QosClass.REALTIME,
        qos=qos,
        group=group_of(meta.get("labels") or {}),
        assigned_at=_iso_to_epoch(annotations.get(ASSIGNED_AT_ANNOTATION), state.clock.wall()),
    )


def assignment_from_claims(pod: JsonDict, dra: DraView, state: ClusterState) -> Assignment | None:
    """The GPUs a bound pod holds through its ResourceClaims of our driver, if any.

    What the fault loop, thermal migration and the filter's memory accounting read, as they
    read a device-plugin pod's annotations: a GPU of the claim's node, all of it when the claim
    consumes all of its memory, else the claim's memory in blocks.
    """
    meta = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in _FINISHED:
        return None
    indices: list[int] = []
    uuids: list[str] = []
    partial: list[int] = []
    whole = False
    for claim in dra.claims_of(pod):
        if claim.node != node:
            continue
        for d in claim.devices:
            if d.admin:
                continue  # admin access (monitoring) sees the GPU, holds none of it
            index = dra.gpu_index(node, d.device)
            if index is None or index in indices:
                continue
            indices.append(index)
            uuids.append(dra.gpu_uuid(node, d.device) or "")
            capacity = dra.memory_mib(node, d.device)
            if d.memory_mib is None or capacity is None or d.memory_mib >= capacity:
                whole = True
            else:
                partial.append(d.memory_mib)
    if not indices:
        return None
    block = state.policy.spec.memory.block_mib
    if len(indices) > 1:
        whole = True  # blocks are counted on one GPU; a claim of several takes them all
    try:
        qos = resolve_class(
            (meta.get("annotations") or {}).get(QOS_ANNOTATION),
            (pod.get("spec") or {}).get("priority"),
            state.policy.spec.qos,
        )
    except ValueError:
        qos = state.policy.spec.qos.default_class
    return Assignment(
        pod_uid=str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"),
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        node=str(node),
        gpu_indices=tuple(indices),
        gpu_uuids=tuple(uuids),
        mem_blocks=0 if whole else -(-sum(partial) // block),
        whole=whole,
        qos=qos,
        group=group_of(meta.get("labels") or {}),
        assigned_at=_iso_to_epoch(meta.get("creationTimestamp"), state.clock.wall()),
    )


class ClusterSync:
    """Nodes, Pods and the policy resource, watched into a ClusterState."""

    def __init__(
        self,
        api: KubeApi,
        state: ClusterState,
        loop: asyncio.AbstractEventLoop,
        *,
        policy_name: str,
        base_policy: Policy,
        on_policy: Callable[[Policy, str], None] | None = None,
        on_restart: Callable[[str, str], Any] | None = None,
        watch_timeout_s: int = 300,
        dra: DraView | None = None,
    ) -> None:
        self.api = api
        self.state = state
        self.loop = loop
        self.policy_name = policy_name
        self.base_policy = base_policy
        self._on_policy = on_policy
        self.nodes: dict[str, JsonDict] = {}
        self.pods: dict[tuple[str, str], JsonDict] = {}
        """Pods by (namespace, name): the one of that name the watch showed last."""
        self.pods_by_uid: dict[str, JsonDict] = {}
        """Pods by uid: what a decision about one pod reads (never its predecessor's object)."""
        self._ours: set[str] = set()
        """Pod uids whose assignment came from their annotations (or their claims)."""
        self._by_claims: set[str] = set()
        """Pod uids whose assignment came from their ResourceClaims."""
        self.policy_errors: list[str] = []
        self.policy_generation: int | None = None
        self._last_spec: Any = None
        self._last_status: tuple[Any, ...] | None = None

        def reflector(
            name: str,
            apply_all: Callable[[list[JsonDict]], None],
            apply: Callable[[str, JsonDict], None],
        ) -> Reflector:
            return Reflector(
                name,
                lambda: api.list(name),
                lambda rv, timeout: api.watch(name, rv, timeout),
                lambda items: self._in_loop(apply_all, items),
                lambda kind, obj: self._in_loop(apply, kind, obj),
                watch_timeout_s=watch_timeout_s,
                on_restart=(lambda why: on_restart(name, why)) if on_restart else None,
            )

        self.reflectors = [
            reflector("nodes", self._replace_nodes, self._node_event),
            reflector("pods", self._replace_pods, self._pod_event),
            reflector(POLICY_PLURAL, self._replace_policies, self._policy_event),
        ]
        self._applied = {r.name: False for r in self.reflectors}
        self.dra = dra
        if dra is not None:  # not in ``synced``: a cluster without DRA still schedules
            self.reflectors += [
                reflector("resourceslices", self._replace_slices, self._slice_event),
                reflector("resourceclaims", self._replace_claims, self._claim_event),
            ]

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start every reflector."""
        for r in self.reflectors:
            r.start()

    def stop(self) -> None:
        """Stop every reflector."""
        for r in self.reflectors:
            r.stop(timeout_s=1.0)

    @property
    def synced(self) -> bool:
        """Every cache has been listed and applied at least once."""
        return all(self._applied.values())

    def _in_loop(self, fn: Callable[..., None], *args: Any) -> None:
        def run() -> None:
            try:
                fn(*args)
            except Exception:
                log.exception("applying a cluster change failed")

        self.loop.call_soon_threadsafe(run)

    # -- nodes ----------------------------------------------------------------------------------
    def _replace_nodes(self, items: list[JsonDict]) -> None:
        seen = {str(n["metadata"]["name"]) for n in items}
        for gone in set(self.nodes) - seen:
            self._node_event("DELETED", self.nodes[gone])
        for node in items:
            self._node_event("ADDED", node)
        self._applied["nodes"] = True

    def _node_event(self, kind: str, node: JsonDict) -> None:
        name = str(node["metadata"]["name"])
        if kind == "DELETED":
            self.nodes.pop(name, None)
            self.state.forget_node(name)
            if self.dra is not None:
                self.dra.forget_node(name)
            return
        previous = self.nodes.get(name)
        self.nodes[name] = node
        labels = node["metadata"].get("labels") or {}
        if previous is None or (previous["metadata"].get("labels") or {}) != labels:
            self.state.set_node_labels(name, labels)
        self.state.set_host_allocatable(name, *node_allocatable(node))

    # -- pods -----------------------------------------------------------------------------------
    def pod_lookup(self, namespace: str, name: str) -> JsonDict | None:
        """{uid, node, service_account} of a pod from the cache (agent authentication)."""
        pod = self.pods.get((namespace, name))
        if pod is None:
            return None
        return {
            "uid": pod["metadata"].get("uid"),
            "node": (pod.get("spec") or {}).get("nodeName"),
            "service_account": (pod.get("spec") or {}).get("serviceAccountName"),
        }

    def _replace_pods(self, items: list[JsonDict]) -> None:
        keep = {_pod_uid(p) for p in items}
        for pod in list(self.pods_by_uid.values()):
            if _pod_uid(pod) not in keep:
                self._pod_event("DELETED", pod)
        for pod in items:
            self._pod_event("ADDED", pod)
        self._applied["pods"] = True

    def _pod_event(self, kind: str, pod: JsonDict) -> None:
        key, uid = _pod_key(pod), _pod_uid(pod)
        if kind == "DELETED":
            if key in self.pods and _pod_uid(self.pods[key]) == uid:
                self.pods.pop(key, None)  # not a successor that took the name already
            self.pods_by_uid.pop(uid, None)
            self._ours.discard(uid)
            self._by_claims.discard(uid)
            self.state.release(uid)  # a deleted pod frees its GPUs, assumed or not
            self.state.host_pod_gone(uid)
            return
        old = self.pods.get(key)
        if old is not None and _pod_uid(old) != uid:
            # A name has one pod at a time: the one before is gone (its DELETED not seen yet).
            self._pod_event("DELETED", old)
        self.pods[key] = pod
        self.pods_by_uid[uid] = pod
        self._host_event(uid, pod)
        assignment = assignment_from_pod(pod, self.state)
        if assignment is not None:
            current = self.state.allocations.get(uid)
            if uid not in self._ours or current != assignment:
                self.state.assign(assignment, authoritative=True)
                self._ours.add(uid)
        elif self.dra is not None and (pod.get("spec") or {}).get("resourceClaims"):
            self._claims_changed(pod)
        elif uid in self._ours or (pod.get("status") or {}).get("phase") in _FINISHED:
            self._ours.discard(uid)
            self._by_claims.discard(uid)
            self.state.release(uid)

    def _host_event(self, uid: str, pod: JsonDict) -> None:
        """Count a bound, unfinished pod's CPU and memory requests against its node."""
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:  # pending: an older event than our bind's, which may hold room already
            return
        if (pod.get("status") or {}).get("phase") in _FINISHED:
            self.state.host_pod_gone(uid)
            return
        meta = pod["metadata"]
        try:
            cpu, memory = host_requests(pod, f"pod {meta.get('namespace')}/{meta.get('name')}")
        except RequestError as exc:
            log.warning("%s", exc)
            return
        self.state.host_pod(uid, str(node), cpu, memory)

    # -- DRA ------------------------------------------------------------------------------------
    def _replace_slices(self, items: list[JsonDict]) -> None:
        assert self.dra is not None
        self.dra.replace_slices(items)
        self._claim_pods_again(None)

    def _slice_event(self, kind: str, obj: JsonDict) -> None:
        assert self.dra is not None
        self.dra.slice_event(kind, obj)
        self._claim_pods_again(str((obj.get("spec") or {}).get("nodeName") or ""))

    def _claim_pods_again(self, node: str | None) -> None:
        """The claim pods (of ``node``, or all) read again: their GPUs are named by the slices."""
        for pod in list(self.pods_by_uid.values()):
            spec = pod.get("spec") or {}
            if spec.get("resourceClaims") and (node is None or spec.get("nodeName") == node):
                self._claims_changed(pod)

    def _replace_claims(self, items: list[JsonDict]) -> None:
        assert self.dra is not None
        self.dra.replace_claims(items)
        for pod in list(self.pods_by_uid.values()):
            self._claims_changed(pod)

    def _claim_event(self, kind: str, obj: JsonDict) -> None:
        assert self.dra is not None
        before = self.dra.claims.get(str((obj.get("metadata") or {}).get("uid", "")))
        self.dra.claim_event(kind, obj)
        after = self.dra.claims.get(str((obj.get("metadata") or {}).get("uid", "")))
        reserved = {ref.get("uid") for ref in (obj.get("status") or {}).get("reservedFor") or []
                    if isinstance(ref, dict)}  # fmt: skip
        for claim in (before, after):
            reserved |= set(claim.reserved_for) if claim is not None else set()
        for uid in reserved:
            pod = self.pods_by_uid.get(str(uid))
            if pod is not None:
                self._claims_changed(pod)

    def _claims_changed(self, pod: JsonDict) -> None:
        """A pod's GPUs held through claims, as its claims say now."""
        uid = _pod_uid(pod)
        if uid in self._ours and uid not in self._by_claims:
            return  # its annotations say (a device-plugin pod)
        assignment = (
            assignment_from_claims(pod, self.dra, self.state) if self.dra is not None else None
        )
        if assignment is not None:
            if self.state.allocations.get(uid) != assignment:
                self.state.assign(assignment, authoritative=True)
            self._ours.add(uid)
            self._by_claims.add(uid)
        elif uid in self._by_claims:
            self._by_claims.discard(uid)
            self._ours.discard(uid)
            self.state.release(uid)

    # -- policy ---------------------------------------------------------------------------------
    def _replace_policies(self, items: list[JsonDict]) -> None:
        mine = [p for p in items if p["metadata"].get("name") == self.policy_name]
        if mine:
            self._policy_event("ADDED", mine[0])
        elif self.policy_generation is not None:
            self._policy_event("DELETED", {"metadata": {"name": self.policy_name}})
        self._applied[POLICY_PLURAL] = True

    @property
    def policy_refused(self) -> bool:
        """The custom resource is there but refused, and no version of it was ever taken.

        The replica would be serving its start-up policy instead of the cluster's.
        """
        return bool(self.policy_errors) and self.policy_generation is None

    def _policy_event(self, kind: str, doc: JsonDict) -> None:
        if doc["metadata"].get("name") != self.policy_name:
            return
        if kind == "DELETED":
            log.warning(
                "policy %s deleted: back to the policy the extender started with", self.policy_name
            )
            self.policy_generation = None
            self.policy_errors = []  # nothing refused is left: the start-up policy is in force
            self._last_spec = None
            self._last_status = None
            self._apply_policy(self.base_policy, "start-up policy (custom resource deleted)")
            return
        generation = doc["metadata"].get("generation")
        if doc.get("spec") == self._last_spec and self.policy_generation is not None:
            return  # a status update, or nothing new: the policy in force stays as it is
        try:
            policy = parse_policy(doc)
        except PolicyError as exc:
            self.policy_errors = exc.errors
            log.error(
                "policy %s refused, previous policy stays: %s",
                self.policy_name,
                "; ".join(exc.errors),
            )
            self._write_status(False, "Invalid", "; ".join(exc.errors), generation)
            return
        self.policy_errors = []
        self._last_spec = doc.get("spec")
        self.policy_generation = generation if isinstance(generation, int) else 0
        self._apply_policy(policy, f"GPUSchedulingPolicy/{self.policy_name}")
        self._write_status(True, "Valid", "in force", generation)

    def _apply_policy(self, policy: Policy, source: str) -> None:
        for note in policy.spec.notes():
            log.warning("policy %s: %s", source, note)
        self.state.set_policy(policy)
        if self._on_policy is not None:
            self._on_policy(policy, source)

    def _write_status(self, ok: bool, reason: str, message: str, generation: Any) -> None:
        key = (ok, message, generation)
        if key == self._last_status:
            return  # writing it again would only echo back as another watch event
        self._last_status = key
        status = {
            "observedGeneration": generation,
            "conditions": [
                {
                    "type": "Accepted",
                    "status": "True" if ok else "False",
                    "reason": reason,
                    "message": message[:32_000],
                    "lastTransitionTime": datetime.now(UTC)
                    .isoformat(timespec="seconds")
                    .replace("+00:00", "Z"),
                    "observedGeneration": generation,
                }
            ],
        }

        def write() -> None:
            try:
                self.api.set_policy_status(self.policy_name, status)
            except KubeError as exc:
                log.warning("cannot write the status of policy %s: %s", self.policy_name, exc)

        self.loop.run_in_executor(None, write)


def _pod_key(pod: JsonDict) -> tuple[str, str]:
    meta = pod["metadata"]
    return str(meta.get("namespace") or "default"), str(meta.get("name"))


def _pod_uid(pod: JsonDict) -> str:
    key = _pod_key(pod)
    return str(pod["metadata"].get("uid") or f"{key[0]}/{key[1]}")
