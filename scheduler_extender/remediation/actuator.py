"""The one way remediation changes the cluster: fenced, bounded, rate-limited, opt-out aware.

Every write is made only while this replica leads and will still lead when the write's timeout
runs out (``leading``), so a replica that lost the Lease, or was frozen and woke up, changes
nothing. Every call has a timeout: one that runs over is abandoned, logged and counted. Node
writes carry the resourceVersion they were computed from; on a conflict the node is read again,
and the write is retried only while what it was decided from is as it was (another writer's
change wins: ``RecordChanged``). Imports ``k8s``, ``metrics`` and ``names``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from scheduler_extender.domain import Assignment
from scheduler_extender.k8s.client import JsonDict, KubeApi, KubeError
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.policy.remediation import RemediationArgs
from scheduler_extender.remediation import marks
from scheduler_extender.remediation.marks import opted_out, stamp
from scheduler_extender.telemetry.clock import Clock

log = logging.getLogger("scheduler_extender.remediation")

COMPONENT = "edgegpu-extender"
CALL_TIMEOUT_S = 5.0
"""The longest one API call of remediation may take before it is abandoned."""


class NotLeading(Exception):
    """This replica does not lead (or may not by the time a write lands): nothing was written."""


class RecordChanged(KubeError):
    """The node's record, cordon or our taint changed under us (a person, another leader)."""

    def __init__(self, name: str, node: JsonDict) -> None:
        super().__init__(409, f"node {name}: its record, cordon or taint changed since it was read")
        self.node = node
        """The node as it is now."""


class Actuator:
    """Evictions, node patches, conditions and Events, for every remediation controller."""

    def __init__(
        self,
        kube: KubeApi,
        metrics: ExtenderMetrics,
        clock: Clock,
        leading: Callable[[float], bool],
        *,
        nodes: Callable[[], Mapping[str, JsonDict]] = dict,
        identity: str = COMPONENT,
        timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        self.kube = kube.with_timeout(timeout_s)
        self.metrics = metrics
        self.clock = clock
        self.leading = leading
        """``leading(s)``: whether this replica leads now and still will ``s`` from now."""
        self.nodes = nodes
        self.identity = identity
        self.timeout_s = timeout_s
        self._evictions: deque[float] = deque()
        self._blocked: dict[tuple[str, str], tuple[int, float]] = {}
        """Pods a PodDisruptionBudget (or an error) kept: (refusals in a row, next try)."""

    # -- calls ---------------------------------------------------------------------------------
    async def _call(self, what: str, write: bool, fn: Callable[..., Any], *args: Any) -> Any:
        """One API call in a thread, given up after the timeout (and for a write, fenced).

        A write asks again in its thread, right before it is sent: a thread that started late
        (a busy or frozen process) sends nothing once leadership is in doubt.
        """

        def fenced() -> Any:
            if write and not self.leading(self.timeout_s):
                raise NotLeading(what)
            return fn(*args)

        if write and not self.leading(self.timeout_s):
            raise NotLeading(what)
        try:
            return await asyncio.wait_for(asyncio.to_thread(fenced), self.timeout_s)
        except TimeoutError:
            log.error("remediation: %s took over %.0f s: abandoned", what, self.timeout_s)
            self.metrics.remediation_timeouts.labels(what.split(" ", 1)[0]).inc()
            raise KubeError(0, f"{what}: no answer in {self.timeout_s:g} s") from None

    async def read_node(self, name: str) -> JsonDict:
        """The node as the API server has it now (a watch may lag)."""
        node: JsonDict = await self._call(f"get node {name}", False, self.kube.get_node, name)
        return node

    def opted_out(self, name: str) -> bool:
        """Whether the node opted out of every remediation (label; unknown nodes have not)."""
        node = self.nodes().get(name)
        return node is not None and opted_out(node)

    async def patch_node(
        self,
        name: str,
        node: JsonDict,
        build: Callable[[JsonDict], JsonDict],
    ) -> JsonDict:
        """Merge-patch the node with ``build(node)``, at the node's resourceVersion.

        On a conflict the node is read again; the patch is rebuilt and sent once more only
        while what the decision was made from (our record, the cordon, our taint) is as it was
        (else ``RecordChanged``: decide again from the node as it is). Returns the node written.
        """
        decided_on = marks.decided_on(node)
        for attempt in range(2):
            patch = build(node)
            meta = patch.setdefault("metadata", {})
            meta["resourceVersion"] = (node.get("metadata") or {}).get("resourceVersion")
            try:
                out: JsonDict = await self._call(
                    f"patch node {name}", True, self.kube.patch_node, name, patch
                )
                return out
            except KubeError as exc:
                if exc.status != 409 or attempt:
                    raise
            node = await self.read_node(name)
            if marks.decided_on(node) != decided_on:
                raise RecordChanged(name, node)
        raise AssertionError("unreachable")

    async def read_config_map(self, namespace: str, name: str) -> JsonDict | None:
        """A ConfigMap of ours, or None when there is none."""
        doc: JsonDict | None = await self._call(
            f"get configmap {name}", False, self.kube.get_config_map, namespace, name
        )
        return doc

    async def write_config_map(self, namespace: str, name: str, data: dict[str, str]) -> None:
        """Create or update a ConfigMap of ours."""
        await self._call(
            f"put configmap {name}", True, self.kube.put_config_map, namespace, name, data
        )

    async def set_condition(self, name: str, condition: JsonDict) -> None:
        """One condition of the node's status (best effort: logged when it fails)."""
        try:
            await self._call(
                f"condition node {name}", True, self.kube.set_node_condition, name, condition
            )
        except KubeError as exc:
            log.warning("node %s: condition %s not written: %s", name, condition["type"], exc)

    async def event(self, ref: JsonDict, reason: str, message: str, kind: str) -> None:
        """A core/v1 Event on a Node or Pod (a failure to record one is logged, not fatal)."""
        namespace = ref.get("namespace") or "default"
        wall = stamp(self.clock.wall())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref['name']}.edgegpu-", "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", **ref},
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.identity,
            "firstTimestamp": wall,
            "lastTimestamp": wall,
            "count": 1,
        }
        try:
            await self._call(f"event {reason}", True, self.kube.create_event, namespace, event)
        except KubeError as exc:
            log.debug("event %s on %s: %s", reason, ref["name"], exc)

    # -- evictions -----------------------------------------------------------------------------
    def forget_backoffs(self, older_than_s: float = 600.0) -> None:
        """Drop PodDisruptionBudget back-offs not tried for a while."""
        now = self.clock.monotonic()
        self._blocked = {k: v for k, v in self._blocked.items() if now - v[1] < older_than_s}

    async def evict(self, pod: Assignment, why: str, message: str, args: RemediationArgs) -> bool:
        """Evict one pod (or, in a dry run, say so); False when it should be tried again.

        Never on a node that opted out; at most ``evictionsPerMinute``; a pod a budget kept is
        tried again after a back-off (up to a minute). Only this pod: a new one of the same
        name is left alone.
        """
        name = f"{pod.namespace}/{pod.name}"
        ref = {"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.pod_uid}
        if self.opted_out(pod.node):
            self.metrics.remediation.labels("evict", why, "opted_out").inc()
            return False
        if args.dry_run:
            log.warning("remediation (dry run): would evict %s: %s", name, message)
            self.metrics.remediation.labels("evict", why, "dry_run").inc()
            await self.event(ref, "DryRunEdgeGPUEvicted", message, "Warning")
            return True
        now = self.clock.monotonic()
        key = (pod.namespace, pod.name)
        refusals, retry_at = self._blocked.get(key, (0, 0.0))
        if now < retry_at:
            return False
        while self._evictions and now - self._evictions[0] > 60.0:
            self._evictions.popleft()
        if len(self._evictions) >= args.evictions_per_minute:
            self.metrics.remediation.labels("evict", why, "rate_limited").inc()
            return False
        try:
            await self._call(
                f"evict pod {name}", True, self.kube.evict_pod, pod.namespace, pod.name, pod.pod_uid
            )
        except KubeError as exc:
            # A 409 on the uid precondition: a new pod of that name (ours is gone).
            gone = exc.status == 404 or (exc.status == 409 and "recondition" in str(exc))
            result = "gone" if gone else {429: "blocked"}.get(exc.status, "failed")
            log.warning("remediation: evicting %s: %s (%s)", name, exc, result)
            self.metrics.remediation.labels("evict", why, result).inc()
            if result != "gone":  # a budget or an error: back off, up to a minute
                self._blocked[key] = (refusals + 1, now + min(60.0, 2.0**refusals))
            return result == "gone"
        self._blocked.pop(key, None)
        self._evictions.append(now)
        log.warning("remediation: evicted %s: %s", name, message)
        self.metrics.remediation.labels("evict", why, "evicted").inc()
        await self.event(ref, "EdgeGPUEvicted", message, "Warning")
        return True
