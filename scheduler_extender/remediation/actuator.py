"""The one way remediation changes the cluster, and the one gate every action passes.

``refusal`` is that gate: every eviction, cordon, self-test ask and reboot ask of every
controller is refused while remediation is off or paused, while this replica does not lead, on
a node that opted out, and (unless the action rests on the node's Ready condition instead)
when the node's telemetry is older than the staleness bound. Evictions and cordons also spend
the fleet-wide disruption budget (``Breaker``, kept in the API server).

Every write is made only while this replica leads and will still lead when the write's timeout
runs out (``leading``), so a replica that lost the Lease, or was frozen and woke up, changes
nothing. Every call has a timeout: one that runs over is abandoned, logged and counted. Node
writes carry the resourceVersion they were computed from; on a conflict the node is read again,
and the write is retried only while what it was decided from is as it was (another writer's
change wins: ``RecordChanged``). Times are the API server's (``now``). Events repeat as
kubectl's recorder does: one Event per object and reason, its count and lastTimestamp raised.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from scheduler_extender.domain import Assignment
from scheduler_extender.k8s.client import JsonDict, KubeApi, KubeError, KubeTimeout
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.policy.remediation import RemediationArgs
from scheduler_extender.remediation import marks
from scheduler_extender.remediation.breaker import Breaker
from scheduler_extender.remediation.marks import opted_out, stamp
from scheduler_extender.telemetry.clock import Clock, ServerClock

log = logging.getLogger("scheduler_extender.remediation")

COMPONENT = "edgegpu-extender"
CALL_TIMEOUT_S = 5.0
"""The longest one API call of remediation may take before it is abandoned."""
EVENT_KEEP_S = 3600.0
"""An Event repeated within this long is counted on the same Event (kubectl's recorder)."""
DEFINITE = frozenset({400, 403, 404, 409, 422, 429})
"""Statuses that say a write was refused (not made); any other failure may have been made."""
EVICTED_KEEP_S = 120.0
"""A pod evicted this recently is on its way out: no second eviction, by any controller."""


def backoff_s(refusals: int) -> float:
    """Seconds to wait before trying again what the API refused ``refusals`` times in a row.

    1 s, 2 s, 4 s and so on, up to a minute, however many refusals.
    """
    return min(60.0, 2.0 ** min(refusals, 6))


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
        fresh: Callable[[str], bool] = lambda _node: True,
        identity: str = COMPONENT,
        timeout_s: float = CALL_TIMEOUT_S,
        namespace: str = "edgegpu-system",
    ) -> None:
        """``fresh(node)``: whether the node's telemetry is within the staleness bound.

        ``namespace``: the extender's own, where the circuit breaker's ConfigMap lives.
        """
        self.server = ServerClock(clock)
        self.kube = kube.with_timeout(timeout_s, on_date=self.server.observe)
        self.metrics = metrics
        self.clock = clock
        self.leading = leading
        """``leading(s)``: whether this replica leads now and still will ``s`` from now."""
        self.nodes = nodes
        self.fresh = fresh
        self.identity = identity
        self.timeout_s = timeout_s
        self.breaker = Breaker(self, namespace)
        self._blocked: dict[str, tuple[int, float]] = {}
        """Pod uids a PodDisruptionBudget (or an error) kept: (refusals in a row, next try)."""
        self._evicted: dict[str, float] = {}
        """Pod uids evicted, and when (monotonic)."""
        self._events: dict[tuple[str, ...], tuple[str, int, float]] = {}
        """(namespace, kind, name, uid, reason, type) → (Event name, count, monotonic)."""
        self._no_time_said: float | None = None
        """When "the API server's time is not known" was last logged (monotonic)."""

    def now(self) -> float:
        """Seconds since the epoch on the API server's clock (see ``ServerClock``)."""
        return self.server.now()

    async def sync_clock(self, namespace: str, name: str) -> None:
        """Learn the API server's time (one read) when no answer has told it yet."""
        if self.server.known:
            return
        why = "its answers carry no readable Date header"
        try:
            await self.read_config_map(namespace, name)
        except KubeError as exc:
            why = str(exc)
        mono = self.clock.monotonic()
        if not self.server.known and (
            self._no_time_said is None or mono - self._no_time_said >= 60.0
        ):
            self._no_time_said = mono  # said once a minute: nothing is done until it is known
            log.warning("remediation: the API server's time is not known (%s): acting on "
                        "nothing until it is", why)  # fmt: skip

    # -- the gate ------------------------------------------------------------------------------
    def refusal(self, node: str, args: RemediationArgs, *, fresh: bool = True) -> str | None:
        """Why no action may be taken on ``node`` now (None: it may).

        ``fresh``: the action rests on the node's telemetry, which must then be within the
        staleness bound (an unreachable node's cordon rests on its Ready condition instead).
        """
        if not args.enabled:
            return "disabled"
        if args.paused:
            return "paused"
        if not self.leading(self.timeout_s):
            return "not_leading"
        if not self.server.known:
            return "no_server_time"  # windows and deadlines need the API server's clock
        if self.opted_out(node):
            return "opted_out"
        if fresh and not self.fresh(node):
            return "stale"
        return None

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
            # The client's own timeout is the same: whichever fires first, it is one timeout.
            return await asyncio.wait_for(asyncio.to_thread(fenced), self.timeout_s + 0.5)
        except (TimeoutError, KubeTimeout):
            log.error("remediation: %s took over %.0f s: abandoned", what, self.timeout_s)
            self.metrics.remediation_timeouts.labels(what.split(" ", 1)[0]).inc()
            raise KubeError(0, f"{what}: no answer in {self.timeout_s:g} s") from None

    async def call(self, what: str, write: bool, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` as every call of ours is made: in a thread, timed out, writes fenced."""
        return await self._call(what, write, fn, *args)

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

    async def write_config_map(
        self, namespace: str, name: str, data: dict[str, str], version: str | None
    ) -> JsonDict:
        """Create a ConfigMap of ours (``version`` None) or replace it at that resourceVersion."""
        doc: JsonDict = await self._call(
            f"put configmap {name}", True, self.kube.write_config_map, namespace, name, data,
            version,
        )  # fmt: skip
        return doc

    async def set_condition(self, name: str, condition: JsonDict) -> None:
        """One condition of the node's status (best effort: logged when it fails)."""
        try:
            await self._call(
                f"condition node {name}", True, self.kube.set_node_condition, name, condition
            )
        except KubeError as exc:
            log.warning("node %s: condition %s not written: %s", name, condition["type"], exc)

    async def event(self, ref: JsonDict, reason: str, message: str, kind: str) -> None:
        """A core/v1 Event on a Node or Pod (a failure to record one is logged, not fatal).

        The same reason on the same object again within ``EVENT_KEEP_S`` raises the count and
        lastTimestamp of the Event made the first time (and takes the latest message).
        """
        namespace = ref.get("namespace") or "default"
        wall = stamp(self.now())
        key = (namespace, ref.get("kind", ""), ref["name"], ref.get("uid", ""), reason, kind)
        mono = self.clock.monotonic()
        self._events = {k: v for k, v in self._events.items() if mono - v[2] < EVENT_KEEP_S}
        seen = self._events.get(key)
        if seen is not None:
            name, count = seen[0], seen[1] + 1
            patch = {"count": count, "lastTimestamp": wall, "message": message[:1024]}
            try:
                await self._call(
                    f"event {reason}", True, self.kube.patch_event, namespace, name, patch
                )
                self._events[key] = (name, count, mono)
                return
            except KubeError as exc:
                if exc.status != 404:
                    log.debug("event %s on %s: %s", reason, ref["name"], exc)
                    return
                # expired or deleted: a new one
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
            name = await self._call(
                f"event {reason}", True, self.kube.create_event, namespace, event
            )
        except KubeError as exc:
            log.debug("event %s on %s: %s", reason, ref["name"], exc)
            return
        if name:
            self._events[key] = (str(name), 1, mono)

    # -- evictions -----------------------------------------------------------------------------
    def forget_backoffs(self, older_than_s: float = 600.0) -> None:
        """Drop PodDisruptionBudget back-offs not tried for a while, and old evictions."""
        now = self.clock.monotonic()
        self._blocked = {k: v for k, v in self._blocked.items() if now - v[1] < older_than_s}
        self._evicted = {k: t for k, t in self._evicted.items() if now - t < EVICTED_KEEP_S}

    def _count(self, action: str, why: str, result: str) -> None:
        self.metrics.remediation.labels(action, why, result).inc()

    async def evict(
        self, pod: Assignment, why: str, message: str, args: RemediationArgs, *, fresh: bool = True
    ) -> bool:
        """Evict one pod (or, in a dry run, say so); False when it should be tried again.

        Through the gate (``refusal``) for the pod's node, then the disruption budget; a pod a
        budget kept is tried again after a back-off (up to a minute); a pod evicted already (by
        any controller) is not again. Only this pod: a new one of the same name is left alone.
        """
        name = f"{pod.namespace}/{pod.name}"
        ref = {"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.pod_uid}
        refused = self.refusal(pod.node, args, fresh=fresh)
        if refused is not None:
            self._count("evict", why, refused)
            return False
        if args.dry_run:
            log.warning("remediation (dry run): would evict %s: %s", name, message)
            self._count("evict", why, "dry_run")
            await self.event(ref, "DryRunEdgeGPUEvicted", message, "Warning")
            return True
        now = self.clock.monotonic()
        if pod.pod_uid in self._evicted:
            return True  # on its way out already
        refusals, retry_at = self._blocked.get(pod.pod_uid, (0, 0.0))
        if now < retry_at:
            return False
        budget = await self.breaker.may_evict(args)
        entry = await self.breaker.reserve("evict", pod.node, args) if budget is None else None
        if entry is None:
            self._count("evict", why, budget or "breaker_unknown")
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
            self._count("evict", why, result)
            if exc.status in DEFINITE:
                self.breaker.cancel(entry)  # not made: it does not count
            if result != "gone":  # a budget or an error: back off, up to a minute
                self._blocked[pod.pod_uid] = (refusals + 1, now + backoff_s(refusals))
            return result == "gone"
        self._blocked.pop(pod.pod_uid, None)
        self._evicted[pod.pod_uid] = now
        log.warning("remediation: evicted %s: %s", name, message)
        self._count("evict", why, "evicted")
        await self.event(ref, "EdgeGPUEvicted", message, "Warning")
        return True

    def blocked_for(self, pod_uid: str) -> int:
        """How many times in a row the pod's eviction was refused (0: not refused)."""
        return self._blocked.get(pod_uid, (0, 0.0))[0]
