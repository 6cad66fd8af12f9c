"""The leader's remediation loop: thermal migration and the GPU fault loop, every few seconds.

Acts only while this replica leads (or when leader election is off) and ``spec.remediation``
is enabled. The fault loop's state lives in each node's ``edgegpu.io/remediation`` annotation,
so a new leader (or this one after a restart) carries on where the last one was, without
repeating what was done. With ``dryRun`` it plans, logs, counts and records Events, and
changes no Node or Pod. Evictions go through the Eviction API only, so PodDisruptionBudgets
hold (a refused one is tried again next round).
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson

from scheduler_extender.domain import Assignment
from scheduler_extender.k8s.client import JsonDict, KubeApi, KubeError
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.names import (
    HEALTH_CONDITION,
    MANAGED_RESOURCES,
    REMEDIATION_ANNOTATION,
    REMEDIATION_OPT_OUT,
    UNHEALTHY_TAINT,
)
from scheduler_extender.policy.remediation import RemediationArgs
from scheduler_extender.remediation import thermal
from scheduler_extender.remediation.faults import CORDONED, Action, Observation, Phase, Record, step
from scheduler_extender.state.cluster import ClusterState

log = logging.getLogger("scheduler_extender.remediation")

PERIOD_S = 2.0
COMPONENT = "edgegpu-extender"

_CONDITION_REASON = {
    Phase.DRAINING: "Draining",
    Phase.SELF_TEST: "SelfTest",
    Phase.REBOOT_REQUESTED: "RebootRequested",
    Phase.VERIFYING: "Verifying",
    Phase.NEEDS_HUMAN: "NeedsHuman",
    Phase.RELEASED: "ReleasedByOperator",
}
_EVENT_REASON = {
    Action.CORDON: "EdgeGPUCordoned",
    Action.SELF_TEST: "EdgeGPUSelfTestRequested",
    Action.REBOOT: "EdgeGPURebootRequested",
    Action.UNCORDON: "EdgeGPUUncordoned",
    Action.RELEASE: "EdgeGPUReleased",
    Action.NEEDS_HUMAN: "EdgeGPUNeedsHuman",
}


def _stamp(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod_key(a: Assignment) -> tuple[str, str]:
    return a.namespace, a.name


class Remediator:
    """Runs ``step`` every ``PERIOD_S`` while the app runs."""

    def __init__(
        self,
        state: ClusterState,
        kube: KubeApi,
        metrics: ExtenderMetrics,
        leading: Callable[[], bool],
        *,
        nodes: Callable[[], Mapping[str, JsonDict]] = dict,
        pods: Callable[[], Mapping[tuple[str, str], JsonDict]] = dict,
        synced: Callable[[], bool] = lambda: True,
        identity: str = COMPONENT,
    ) -> None:
        self.state = state
        self.kube = kube
        self.metrics = metrics
        self.leading = leading
        self.nodes = nodes
        """The Node objects the watch holds, by name."""
        self.pods = pods
        """The Pod objects the watch holds, by (namespace, name)."""
        self.synced = synced
        """Whether the watches have listed everything once (records are read back only then)."""
        self.identity = identity
        self._last: dict[thermal.GpuKey, float] = {}
        self._dry_run: bool | None = None
        self._over: dict[str, float] = {}
        """Pods over their memory blocks: uid → since when (monotonic)."""
        self._reclaimed: set[str] = set()
        """Best-effort pods evicted to give lent blocks back (not evicted twice)."""
        self._blocked: dict[tuple[str, str], tuple[int, float]] = {}
        """Pods a PodDisruptionBudget kept: (refusals in a row, when to try again)."""
        self.records: dict[str, Record] = {}
        """The fault loop's records, while leading (read back from the annotations first)."""
        self._loaded = False
        self._evictions: deque[float] = deque()
        self._planned: set[tuple[str, str]] = set()
        """Dry run: pods already logged as ones the loop would evict."""

    # -- what the agents are asked -------------------------------------------------------------
    def requests(self, node: str) -> dict[str, Any]:
        """Requests for the node's agent, sent in the answer to its push."""
        rec = self.records.get(node)
        if rec is None or self.state.policy.spec.remediation.dry_run or not self.leading():
            return {}
        if rec.phase in (Phase.SELF_TEST, Phase.VERIFYING):
            return {"self_test": {"id": rec.request}}
        if rec.phase is Phase.REBOOT_REQUESTED and self._boot(node) == rec.boot:
            return {"reboot": {"id": rec.request}}  # not again once the node is back
        return {}

    def _boot(self, node: str) -> str | None:
        """The node's boot as its agent reports it: the host's, else the agent's own."""
        store = self.state.store.get(node)
        if store is None:
            return None
        return store.report.host_boot_id or store.digest.boot_id

    # -- thermal migration ---------------------------------------------------------------------
    def hot_gpus(self) -> list[thermal.HotGpu]:
        """Every GPU the telemetry shows at or above maxTemp, with how long it has been."""
        now = self.state.clock.monotonic()
        out = []
        for node in self.state.store.nodes():
            record = self.state.store.get(node)
            if record is None or not record.thermal:
                continue
            index_of = dict(zip(record.digest.uuids, record.digest.column("index"), strict=True))
            for uuid_, st in record.thermal.items():
                if st.hot_since is not None and uuid_ in index_of:
                    out.append(thermal.HotGpu(node, int(index_of[uuid_]), now - st.hot_since))
        return out

    async def migrate(self) -> list[thermal.Eviction]:
        """Thermal migration: the evictions due, taken (or, with dryRun, only logged)."""
        spec = self.state.policy.spec
        now = self.state.clock.monotonic()
        hot = self.hot_gpus()
        pods = {gpu.node: self.state.allocations.on_node(gpu.node) for gpu in hot}
        due = thermal.evictions(hot, pods, spec.thermal_throttling, self._last, now)
        for ev in due:
            self._last[ev.gpu] = now
            if not await self._evict(ev.pod, "thermal", ev.reason, spec.remediation):
                self._last.pop(ev.gpu, None)  # not taken: try again next round
        return due

    async def _evict(self, pod: Assignment, why: str, message: str, args: RemediationArgs) -> bool:
        """Evict one pod (or, in a dry run, say so); False when it should be tried again."""
        name = f"{pod.namespace}/{pod.name}"
        ref = {"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.pod_uid}
        if args.dry_run:
            log.warning("remediation (dry run): would evict %s: %s", name, message)
            self.metrics.remediation.labels("evict", why, "dry_run").inc()
            await self._event(ref, "DryRunEdgeGPUEvicted", message, "Warning")
            return True
        now = self.state.clock.monotonic()
        refusals, retry_at = self._blocked.get(_pod_key(pod), (0, 0.0))
        if now < retry_at:
            return False
        while self._evictions and now - self._evictions[0] > 60.0:
            self._evictions.popleft()
        if len(self._evictions) >= args.evictions_per_minute:
            self.metrics.remediation.labels("evict", why, "rate_limited").inc()
            return False
        try:
            await asyncio.to_thread(self.kube.evict_pod, pod.namespace, pod.name)
        except KubeError as exc:
            result = {404: "gone", 429: "blocked"}.get(exc.status, "failed")
            log.warning("remediation: evicting %s: %s (%s)", name, exc, result)
            self.metrics.remediation.labels("evict", why, result).inc()
            if result != "gone":  # a budget or an error: back off, up to a minute
                self._blocked[_pod_key(pod)] = (refusals + 1, now + min(60.0, 2.0**refusals))
            return result == "gone"
        self._blocked.pop(_pod_key(pod), None)
        self._evictions.append(now)
        log.warning("remediation: evicted %s: %s", name, message)
        self.metrics.remediation.labels("evict", why, "evicted").inc()
        await self._event(ref, "EdgeGPUEvicted", message, "Warning")
        return True

    # -- memory budgets -----------------------------------------------------------------------
    async def budgets(self) -> None:
        """A warning Event as soon as a pod is seen over its blocks.

        With ``memory.overBudget: evict``, its eviction once it has stayed over for
        ``overBudgetGrace``.
        """
        spec = self.state.policy.spec
        now = self.state.clock.monotonic()
        over = over_budget(self.state)
        self._over = {uid: t for uid, t in self._over.items() if uid in over}
        for uid, (pod, used, budget) in over.items():
            message = (
                f"uses {used:.0f} MiB of GPU memory on {pod.node}, over its "
                f"{pod.mem_blocks} block(s) ({budget:.0f} MiB)"
            )
            since = self._over.get(uid)
            if since is None:
                self._over[uid] = now
                log.warning("pod %s/%s %s", pod.namespace, pod.name, message)
                self.metrics.remediation.labels("warn", "over_budget", "done").inc()
                ref = {"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": uid}
                await self._event(ref, "EdgeGPUOverBudget", message, "Warning")
            elif (
                spec.memory.over_budget == "evict"
                and now - since >= spec.memory.over_budget_grace_s
            ):
                if await self._evict(pod, "over_budget", message, spec.remediation):
                    self._over[uid] = math.inf  # on its way out: not again

    async def reclaim(self) -> None:
        """Take lent blocks back: evict the best-effort pods of a GPU whose owners need them.

        The latest assigned first, from the leader, at once (``memory.idleRelease``).
        """
        spec = self.state.policy.spec
        due = self.state.borrowers_to_evict()
        # Evicted once: not again while the pod is still there (on its way out).
        self._reclaimed = {u for u in self._reclaimed if self.state.allocations.get(u)}
        for pod, short in due:
            if pod.pod_uid in self._reclaimed:
                continue
            message = (
                f"its GPU on {pod.node} is {short} block(s) short, and best-effort pods give "
                "memory back first (idle blocks lent are needed again)"
            )
            if await self._evict(pod, "reclaim", message, spec.remediation):
                self._reclaimed.add(pod.pod_uid)

    # -- the fault loop ------------------------------------------------------------------------
    def observe(self, name: str, node: JsonDict) -> Observation:
        """The node now: its faults (from its agent, or NotReady and silent), pods, verdicts."""
        store = self.state.store.get(name)
        spec = self.state.policy.spec
        faults: list[str] = []
        gpus: set[int] | None = set()
        verdict = boot = None
        cooling = False
        silent = True
        if store is not None:
            report = store.report
            for g in report.gpus:
                if g.health == "unhealthy":
                    reasons = [r for r in g.health_reasons if r not in DEGRADED_REASONS]
                    faults += [f"gpu{g.index}:{r}" for r in reasons or ("unhealthy",)]
                    assert gpus is not None
                    gpus.add(g.index)
            now = self.state.clock.monotonic()
            silent = now - store.received_at > spec.stale_telemetry.stale_after_s(report.interval_s)
            if report.self_test is not None:
                verdict = (report.self_test.id, report.self_test.verdict)
            boot = self._boot(name)
            cool_down = spec.thermal_throttling.cool_down_s
            cooling = any(
                st.hot_since is not None
                or (st.below_since is not None and now < st.below_since + cool_down)
                for st in store.thermal.values()
            )
        conditions = (node.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        if not ready and silent:
            faults.append("node:not-ready-silent")
            gpus = None
        affected = self._affected(name, None if gpus is None else tuple(sorted(gpus)))
        return Observation(
            faults=tuple(faults),
            gpus=None if gpus is None else tuple(sorted(gpus)),
            cordoned=bool((node.get("spec") or {}).get("unschedulable")),
            pods_left=len(affected),
            verdict=verdict,
            boot=boot,
            cooling=cooling,
        )

    def _affected(self, name: str, gpus: tuple[int, ...] | None) -> list[Assignment]:
        """Pods on the faulty GPUs (every GPU pod for a node fault) not leaving yet.

        Lowest QoS first, the most recently placed of a class first.
        """
        pods = self.pods()
        out = []
        for a in self.state.allocations.on_node(name):
            if gpus is not None and not set(a.gpu_indices) & set(gpus):
                continue
            obj = pods.get(_pod_key(a))
            if obj is not None and (obj.get("metadata") or {}).get("deletionTimestamp"):
                continue
            out.append(a)
        return sorted(out, key=lambda a: (a.qos, -a.assigned_at))

    def _load(self) -> None:
        """Read the records back from the node annotations (a new leader, or a restart)."""
        self.records.clear()
        for name, node in self.nodes().items():
            text = ((node.get("metadata") or {}).get("annotations") or {}).get(
                REMEDIATION_ANNOTATION
            )
            if not text:
                continue
            try:
                self.records[name] = Record.from_json(orjson.loads(text))
            except (ValueError, orjson.JSONDecodeError) as exc:
                log.warning("node %s: ignoring its remediation annotation: %s", name, exc)
        self._loaded = True

    async def faults_round(self) -> None:
        """One round of the fault loop over every GPU node."""
        args = self.state.policy.spec.remediation
        if not self.synced():
            return  # the records must be read back from a full list of the nodes
        if args.dry_run != self._dry_run:
            self._dry_run, self._loaded = args.dry_run, False  # a dry run's plan is not real
            self._planned.clear()
        if not self._loaded:
            self._load()
        nodes = self.nodes()
        wall = self.state.clock.wall()
        names = sorted(set(self.state.store.nodes()) | set(self.records) | _gpu_nodes(nodes))
        cap = args.cordon_cap(len(names))
        for name in names:
            node = nodes.get(name)
            if node is None:
                self.records.pop(name, None)
                continue
            labels = (node.get("metadata") or {}).get("labels") or {}
            if labels.get(REMEDIATION_OPT_OUT) == "disabled":
                continue
            rec = self.records.get(name)
            obs = self.observe(name, node)
            if rec is not None and rec.phase in CORDONED:
                if args.dry_run:
                    left = self._affected(name, rec.gpus)
                    todo = [a for a in left if _pod_key(a) not in self._planned]
                    obs = replace(obs, cordoned=True, pods_left=len(todo))
                elif not obs.cordoned:  # an uncordon, or a watch that lags our cordon?
                    obs = replace(obs, cordoned=await self._cordoned_now(name))
                if rec.gpus != obs.gpus:  # evict from every GPU that faulted since
                    wider = _union(rec.gpus, obs.gpus)
                    obs = replace(obs, pods_left=len(self._affected(name, wider)))
            held = sum(1 for r in self.records.values() if r.phase in CORDONED)
            new, actions = step(
                rec, obs, wall, args, owner=self.identity, room=held < cap,
                new_id=lambda: uuid.uuid4().hex[:12],
            )  # fmt: skip
            if args.dry_run and rec is not None and rec.phase is Phase.DRAINING:
                if new is None or new.phase is not Phase.DRAINING:
                    # A dry run stops at planning the drain; it ends when the fault does.
                    new, actions = (rec, ()) if obs.faults else (None, ())
            await self._apply(name, node, rec, new, actions, args)

    async def _cordoned_now(self, name: str) -> bool:
        """The node's ``spec.unschedulable`` as the API server has it (the watch may lag)."""
        try:
            node = await asyncio.to_thread(self.kube.get_node, name)
        except KubeError:
            return True  # cannot tell: assume nobody uncordoned it
        return bool((node.get("spec") or {}).get("unschedulable"))

    async def _apply(
        self,
        name: str,
        node: JsonDict,
        old: Record | None,
        new: Record | None,
        actions: tuple[Action, ...],
        args: RemediationArgs,
    ) -> None:
        """Take the actions, then keep the record (not before: a failed call is tried again)."""
        ref = {"kind": "Node", "name": name, "uid": (node.get("metadata") or {}).get("uid", "")}
        last = new or old
        reason = last.reason if last else ""
        owns = last.owns_cordon if last else True
        for action in actions:
            if action is Action.EVICT:
                assert new is not None
                for pod in self._affected(name, new.gpus):
                    if args.dry_run:
                        if _pod_key(pod) in self._planned:
                            continue
                        self._planned.add(_pod_key(pod))
                    message = f"GPU fault on node {name}: {new.reason}"
                    await self._evict(pod, "gpu_fault", message, args)
                continue
            message = f"{action.value}: {reason}"
            if args.dry_run:
                log.warning("remediation (dry run): node %s: would %s", name, message)
                self.metrics.remediation.labels(action.value, "gpu_fault", "dry_run").inc()
                kind = "Warning" if action is not Action.UNCORDON else "Normal"
                await self._event(ref, "DryRun" + _EVENT_REASON[action], message, kind)
                continue
            try:
                await asyncio.to_thread(self._act, name, node, action, new, owns)
            except KubeError as exc:
                log.warning("remediation: node %s: %s failed: %s", name, action.value, exc)
                self.metrics.remediation.labels(action.value, "gpu_fault", "failed").inc()
                return  # the record stays where it was: tried again next round
            log.warning("remediation: node %s: %s", name, message)
            self.metrics.remediation.labels(action.value, "gpu_fault", "done").inc()
            kind = "Normal" if action in (Action.UNCORDON, Action.SELF_TEST) else "Warning"
            await self._event(ref, _EVENT_REASON[action], message, kind)
        if (old.phase if old else None) != (new.phase if new else None):
            self.metrics.remediation_transitions.labels(new.phase.value if new else "healthy").inc()
        if new is None:
            if old is not None and old.phase is Phase.RELEASED and not args.dry_run:
                try:  # the fault is over: drop the record we kept while standing aside
                    await asyncio.to_thread(self._act, name, node, Action.RELEASE, None, False)
                except KubeError as exc:
                    log.warning("remediation: node %s: clearing the record: %s", name, exc)
                    return
            self.records.pop(name, None)
            return
        wrote = any(a is not Action.EVICT for a in actions)
        if not args.dry_run and new.phase is not Phase.SUSPECT and not wrote and new != old:
            try:
                await asyncio.to_thread(self._write, name, new)
            except KubeError as exc:
                log.warning("remediation: node %s: writing the record: %s", name, exc)
                return
        self.records[name] = new

    def _write(self, name: str, rec: Record) -> None:
        text = orjson.dumps(rec.to_json()).decode()
        self.kube.patch_node(name, {"metadata": {"annotations": {REMEDIATION_ANNOTATION: text}}})

    def _act(
        self, name: str, node: JsonDict, action: Action, rec: Record | None, owns: bool
    ) -> None:
        """One action on the node (blocking: run in a thread).

        ``rec``: the record after it (None: drop it); ``owns``: whether we set
        ``spec.unschedulable``.
        """
        annotation = None if rec is None else orjson.dumps(rec.to_json()).decode()
        meta: JsonDict = {"annotations": {REMEDIATION_ANNOTATION: annotation}}
        if action in (Action.CORDON, Action.UNCORDON, Action.RELEASE):
            # Taints are one list: the resourceVersion makes a concurrent change a 409.
            meta["resourceVersion"] = (node.get("metadata") or {}).get("resourceVersion")
            spec: JsonDict = {
                "taints": [
                    t
                    for t in (node.get("spec") or {}).get("taints") or []
                    if t.get("key") != UNHEALTHY_TAINT
                ]
            }
            if action is Action.CORDON:
                wall = _stamp(self.state.clock.wall())
                spec["taints"].append(
                    {"key": UNHEALTHY_TAINT, "effect": "NoSchedule", "timeAdded": wall}
                )
                if owns:
                    spec["unschedulable"] = True
            elif action is Action.UNCORDON and owns:
                spec["unschedulable"] = None
            self.kube.patch_node(name, {"metadata": meta, "spec": spec})
        else:
            self.kube.patch_node(name, {"metadata": meta})
        self._condition(name, rec)

    def _condition(self, name: str, rec: Record | None) -> None:
        """The node condition ``EdgeGPUHealthy`` that ``kubectl describe node`` shows.

        Best effort: the node's annotation, written first, is what the loop goes by.
        """
        wall = _stamp(self.state.clock.wall())
        try:
            self.kube.set_node_condition(
                name,
                {
                    "type": HEALTH_CONDITION,
                    "status": "True" if rec is None else "False",
                    "reason": "GPUsHealthy" if rec is None else _CONDITION_REASON[rec.phase],
                    "message": "no GPU fault"
                    if rec is None
                    else f"{rec.phase.value}: {rec.reason}",
                    "lastHeartbeatTime": wall,
                    "lastTransitionTime": wall,
                },
            )
        except KubeError as exc:
            log.warning("node %s: condition %s not written: %s", name, HEALTH_CONDITION, exc)

    async def _event(self, ref: JsonDict, reason: str, message: str, kind: str) -> None:
        """A core/v1 Event on a Node or Pod (a failure to record one is logged, not fatal)."""
        namespace = ref.get("namespace") or "default"
        wall = _stamp(self.state.clock.wall())
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
            await asyncio.to_thread(self.kube.create_event, namespace, event)
        except KubeError as exc:
            log.debug("event %s on %s: %s", reason, ref["name"], exc)

    # -- the loop ------------------------------------------------------------------------------
    async def step(self) -> list[thermal.Eviction]:
        """One round: thermal migration, memory budgets, lent blocks taken back, the fault loop.

        Nothing unless leading and enabled; the records are read back from the annotations
        whenever leadership is new.
        """
        spec = self.state.policy.spec
        if not spec.remediation.enabled or not self.leading():
            self._loaded = False
            self.records.clear()
            self._planned.clear()
            return []
        now = self.state.clock.monotonic()
        self._blocked = {k: v for k, v in self._blocked.items() if now - v[1] < 600.0}
        due = await self.migrate()
        await self.budgets()
        await self.reclaim()
        await self.faults_round()
        return due

    def view(self) -> list[dict[str, Any]]:
        """``GET /debug/remediation``: every node not healthy, its history and next step."""
        out = []
        for name, rec in sorted(self.records.items()):
            doc = rec.to_json()
            doc["node"] = name
            doc["next"] = _NEXT[rec.phase]
            out.append(doc)
        return out

    async def run(self) -> None:
        """``step`` every ``PERIOD_S``; no error ends the loop."""
        while True:
            await asyncio.sleep(PERIOD_S)
            try:
                await self.step()
            except Exception:
                log.exception("remediation round failed; carrying on")


def over_budget(state: ClusterState) -> dict[str, tuple[Assignment, float, float]]:
    """Pods whose processes use more GPU memory than their blocks: uid → (pod, MiB, budget).

    From fresh reports only.
    """
    spec = state.policy.spec
    block_mib = spec.memory.block_mib
    now = state.clock.monotonic()
    out: dict[str, tuple[Assignment, float, float]] = {}
    for node in state.store.nodes():
        record = state.store.get(node)
        if record is None:
            continue
        if now - record.received_at > spec.stale_telemetry.stale_after_s(record.report.interval_s):
            continue  # an old sample: staleness alone never evicts
        for g in record.report.gpus:
            used_by: dict[str, float] = {}
            for proc in g.processes:
                if proc.pod_uid and proc.used_mib is not None:
                    used_by[proc.pod_uid] = used_by.get(proc.pod_uid, 0.0) + proc.used_mib
            for uid, used in used_by.items():
                a = state.allocations.get(uid)
                if a is None or a.whole or not a.mem_blocks:
                    continue
                budget = float(a.mem_blocks * block_mib)
                if used > budget:
                    out[uid] = (a, used, budget)
    return out


DEGRADED_REASONS = frozenset({"temp:over-max", "throttle:hw-slowdown", "cuda:ctx-flaky"})
"""Reasons the agent gives at the ``degraded`` level: not faults, even on an unhealthy GPU."""


def _gpu_nodes(nodes: Mapping[str, JsonDict]) -> set[str]:
    """Nodes that advertise GPUs (a node silent since before our start is still seen)."""
    out = set()
    for name, node in nodes.items():
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        if any(str(allocatable.get(r, "0")) not in ("0", "") for r in MANAGED_RESOURCES):
            out.add(name)
    return out


def _union(a: tuple[int, ...] | None, b: tuple[int, ...] | None) -> tuple[int, ...] | None:
    return None if a is None or b is None else tuple(sorted({*a, *b}))


_NEXT = {
    Phase.SUSPECT: "cordon once the fault has lasted confirmAfter (and the cap allows)",
    Phase.DRAINING: "evict the pods on the faulty GPUs, then ask for a self-test",
    Phase.SELF_TEST: "wait for the agent's self-test verdict",
    Phase.REBOOT_REQUESTED: "wait for the node to come back, then verify",
    Phase.VERIFYING: "wait for the self-test after the reboot",
    Phase.NEEDS_HUMAN: "an operator: fix the node, then kubectl uncordon it",
    Phase.RELEASED: "nothing until the fault clears (an operator uncordoned the node)",
}
