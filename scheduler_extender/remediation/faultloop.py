"""The GPU fault loop's controller: observe each GPU node, decide with ``faults.step``, act.

The loop's state lives in each node's ``edgegpu.io/remediation`` annotation, so a new leader (or
this one after a restart) carries on where the last one was. The annotation is read back when
leadership is new, and again whenever the node shows one other than the record this replica
wrote: a person's edit is honoured by the current leader, a record nobody can read is cleaned
up (or adopted, with an Event that says which). With ``dryRun`` it plans, logs, counts and
records Events, changes no Node or Pod, ends a plan when the fault does and holds no place
under the cap. A node NotReady with its agent silent is a node fault only after
``unreachableAfter`` as this replica saw it, and is cordoned without evicting anything. Every
cordon, eviction and agent ask passes the actuator's gate; cordons also the circuit breaker.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import orjson

from scheduler_extender.domain import Assignment
from scheduler_extender.k8s.client import JsonDict, KubeError
from scheduler_extender.policy.remediation import RemediationArgs
from scheduler_extender.policy.rules import thermal
from scheduler_extender.remediation import marks
from scheduler_extender.remediation.actuator import (
    DEFINITE,
    Actuator,
    NotLeading,
    RecordChanged,
    backoff_s,
)
from scheduler_extender.remediation.faults import (
    CORDONED,
    NODE_SILENT,
    WORKING,
    Action,
    Observation,
    Phase,
    Record,
    places,
    repeats,
    step,
)
from scheduler_extender.remediation.thermal import leaving
from scheduler_extender.state.cluster import ClusterState

log = logging.getLogger("scheduler_extender.remediation")

_NEXT = {
    Phase.SUSPECT: "cordon once the fault has lasted confirmAfter (and the cap and the circuit "
    "breaker allow)",
    Phase.DRAINING: "evict the pods on the faulty GPUs, then ask for a self-test",
    Phase.SELF_TEST: "wait for the agent's self-test verdict",
    Phase.REBOOT_REQUESTED: "wait for the node to come back, then verify",
    Phase.VERIFYING: "wait for the self-test after the reboot",
    Phase.NEEDS_HUMAN: "an operator: fix the node, then kubectl uncordon it",
    Phase.RELEASED: "nothing until the fault clears (an operator uncordoned the node)",
}


class FaultLoop:
    """Every GPU node's record, advanced one round at a time."""

    def __init__(
        self,
        state: ClusterState,
        act: Actuator,
        *,
        nodes: Callable[[], Mapping[str, JsonDict]],
        pods: Callable[[], Mapping[str, JsonDict]],
        synced: Callable[[], bool],
        identity: str,
    ) -> None:
        self.state = state
        self.act = act
        self.breaker = act.breaker
        self.nodes = nodes
        self.pods = pods
        self.synced = synced
        self.identity = identity
        self.records: dict[str, Record] = {}
        """The records, while leading (read back from the annotations first)."""
        self._known: dict[str, str | None] = {}
        """The annotation each node has as far as this replica knows (read, or written)."""
        self._loaded = False
        self._dry_run: bool | None = None
        self._planned: set[tuple[str, str]] = set()
        """Dry run: pods already logged as ones the loop would evict."""
        self._unreachable: dict[str, float] = {}
        """Nodes NotReady with a silent agent: since when this replica saw it (monotonic)."""
        self._refused: dict[str, tuple[int, float]] = {}
        """Node → cordons the API refused in a row, and when to try again (monotonic)."""
        self.aside: Callable[[str], bool] = lambda _node: False
        """Whether a GPU maintenance holds a node (set by the maintainer): we stand aside."""
        self._acting_since = 0.0
        """When this replica began acting, API clock: every wait is measured from then at the
        earliest (a gap with no leader, or remediation paused, is nobody's drain time)."""

    def reset(self) -> None:
        """Leadership lost or remediation off: forget everything but what the nodes hold."""
        self._loaded = False
        self.records.clear()
        self._known.clear()
        self._planned.clear()
        self._unreachable.clear()  # seen again from the start when acting again
        self._refused.clear()
        self.breaker.reset()

    # -- what the agents are asked -------------------------------------------------------------
    def requests(self, node: str, args: RemediationArgs) -> dict[str, Any]:
        """Requests for the node's agent, through the gate (the caller checks the dry run)."""
        rec = self.records.get(node)
        if rec is None or self.aside(node) or self.act.refusal(node, args) is not None:
            return {}
        if rec.phase in (Phase.SELF_TEST, Phase.VERIFYING):
            return {"self_test": {"id": rec.request}}
        if rec.phase is Phase.REBOOT_REQUESTED and self._boot(node) == rec.boot:
            # The boot it was decided for: the agent refuses it on any other boot.
            return {"reboot": {"id": rec.request, "boot": rec.boot}}
        return {}

    def _boot(self, node: str) -> str | None:
        """The node's boot as its agent reports it: the host's, else the agent's own."""
        status = self.state.node_status(node)
        return None if status is None else status.boot

    # -- observing -----------------------------------------------------------------------------
    def observe(self, name: str, node: JsonDict, args: RemediationArgs) -> Observation:
        """The node now: its faults (from its agent, or unreachable long enough), pods, verdicts."""
        record = self.state.store.get(name)
        spec = self.state.policy.spec
        now = self.state.clock.monotonic()
        faults: list[str] = []
        gpus: set[int] = set()
        verdict = boot = None
        cooling = False
        silent = True
        if record is not None:
            status = record.status
            for fault in status.faults:
                faults += [f"gpu{fault.index}:{r}" for r in fault.reasons]
                gpus.add(fault.index)
            interval = record.digest.interval_s
            silent = now - record.received_at > spec.stale_telemetry.stale_after_s(interval)
            verdict = status.self_test
            boot = status.boot
            cooling = any(
                thermal.hot_or_cooling(st, now, spec.thermal_throttling)
                for st in record.thermal.values()
            )
        conditions = (node.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        if not ready and silent:
            # An edge link that drops looks the same: only a long outage, seen by this replica
            # (not right after its start), counts; Kubernetes evicts by the pods' tolerations.
            since = self._unreachable.setdefault(name, now)
            if now - since >= args.unreachable_after_s:
                faults.append(NODE_SILENT)
        else:
            self._unreachable.pop(name, None)
        at = tuple(sorted(gpus))
        return Observation(
            faults=tuple(faults),
            gpus=at,
            cordoned=bool((node.get("spec") or {}).get("unschedulable")),
            pods_left=len(self._affected(name, at)),
            verdict=verdict,
            boot=boot,
            cooling=cooling,
            tainted=(taint := marks.our_taint(node)) is not None,
            ours_cordon=taint is not None and taint.get("value") == marks.OWNS_CORDON,
            repeats=repeats(
                marks.history(node), places(tuple(faults)), self.act.now(), args.repeat_window_s
            ),
        )

    def _maintained(self, name: str, node: JsonDict) -> bool:
        """Whether a GPU maintenance holds the node: its taint, and its status saying so."""
        return marks.maintenance_taint(node) is not None and self.aside(name)

    def affected(self, name: str, gpus: tuple[int, ...] | None) -> list[Assignment]:
        """Pods on the GPUs (every GPU pod for None) not leaving yet, in eviction order."""
        return self._affected(name, gpus)

    def _affected(self, name: str, gpus: tuple[int, ...] | None) -> list[Assignment]:
        """Pods on the faulty GPUs (every GPU pod for None) not leaving yet.

        Lowest QoS first, the most recently placed of a class first.
        """
        pods = self.pods()
        out = [
            a
            for a in self.state.allocations.on_node(name)
            if (gpus is None or set(a.gpu_indices) & set(gpus)) and not leaving(pods.get(a.pod_uid))
        ]
        return sorted(out, key=lambda a: (a.qos, -a.assigned_at))

    def _adopt(self, name: str, text: str | None) -> None:
        """Take the node's annotation as the record (unreadable: none, and say so)."""
        self._known[name] = text
        self.records.pop(name, None)
        if not text:
            return
        try:
            self.records[name] = Record.from_json(orjson.loads(text))
        except (ValueError, orjson.JSONDecodeError) as exc:
            log.warning("node %s: its remediation annotation is unreadable: %s", name, exc)

    def _load(self) -> None:
        """Read the records back from the node annotations (a new leader, or a restart)."""
        self.records.clear()
        self._known.clear()
        for name, node in self.nodes().items():
            self._adopt(name, marks.annotation(node))
        self._loaded = True

    async def _current(self, name: str, node: JsonDict, args: RemediationArgs) -> JsonDict | None:
        """The node as the API server has it, when the watch may be behind.

        That is when the watch shows another record than the one we know (our own write not
        seen yet, or a person edited or removed it: then it is what counts now), or shows a node
        we hold uncordoned (an operator's uncordon, or our cordon not seen yet). None when the
        node cannot be read (tried again next round).
        """
        rec = self.records.get(name)
        held = not args.dry_run and rec is not None and rec.phase in CORDONED
        uncordoned = not (node.get("spec") or {}).get("unschedulable")
        if marks.annotation(node) == self._known.get(name) and not (held and uncordoned):
            return node
        try:
            node = await self.act.read_node(name)
        except KubeError as exc:
            log.warning("remediation: node %s: reading it: %s", name, exc)
            return None
        text = marks.annotation(node)
        if text != self._known.get(name):
            log.warning("node %s: its remediation record was changed by someone else", name)
            self._adopt(name, text)
        return node

    # -- one round -----------------------------------------------------------------------------
    async def step(self, args: RemediationArgs) -> None:
        """One round over every GPU node."""
        if not self.synced():
            return  # the records must be read back from a full list of the nodes
        if not self.act.server.known:
            return  # every deadline is measured by the API server's clock
        if args.dry_run != self._dry_run:
            self._dry_run, self._loaded = args.dry_run, False  # a dry run's plan is not real
            self._planned.clear()
        wall = self.act.now()
        if not self._loaded:
            self._load()
            self._acting_since = wall
        nodes = self.nodes()
        names = sorted(set(self.state.store.nodes()) | set(self.records) | marks.gpu_nodes(nodes))
        cap = args.cordon_cap(len(names))
        for name in names:
            try:
                await self._node(name, nodes.get(name), args, wall, cap, len(names))
            except NotLeading:
                raise
            except Exception:  # one node's odd data never stops the others
                log.exception("remediation: node %s: round failed; carrying on", name)

    async def _node(
        self,
        name: str,
        watched: JsonDict | None,
        args: RemediationArgs,
        wall: float,
        cap: int,
        gpu_nodes: int,
    ) -> None:
        """One node's round: observe, decide, act."""
        if watched is None:
            self.records.pop(name, None)
            self._known.pop(name, None)
            self._unreachable.pop(name, None)
            self._refused.pop(name, None)
            return
        if marks.opted_out(watched) or self._maintained(name, watched):
            return  # opted out, or a GPU maintenance holds it (its validation judges the GPUs)
        node = await self._current(name, watched, args)
        if node is None or marks.opted_out(node) or self._maintained(name, node):
            return
        rec = self.records.get(name)
        obs = self.observe(name, node, args)
        if rec is not None and rec.phase in CORDONED:
            left = self._affected(name, _union(rec.gpus, obs.gpus))
            if args.dry_run:
                left = [a for a in left if (a.namespace, a.name) not in self._planned]
                obs = replace(obs, cordoned=True)
            obs = replace(obs, pods_left=len(left))
        room, held_by = True, ""
        due = rec is not None and rec.phase is Phase.SUSPECT and bool(obs.faults)
        if due and not args.dry_run and rec and wall - rec.started >= args.confirm_after_s:
            room, held_by = await self._room(name, obs, args, cap, gpu_nodes)  # a cordon
        new, actions = step(
            rec, obs, wall, args, owner=self.identity, room=room, held_by=held_by,
            new_id=lambda: uuid.uuid4().hex[:12], acting_since=self._acting_since,
        )  # fmt: skip
        if args.dry_run and rec is not None and rec.phase in CORDONED:
            # A dry run stops at planning the drain; it ends when the fault does.
            new, actions = (rec, ()) if obs.faults else (None, ())
        if args.dry_run and Action.CLEAN_UP in actions:
            actions = ()  # what a real run left is not a dry run's to plan
        if (
            new is not None
            and marks.written_fields(new) == marks.written_fields(rec)
            and not actions
        ):
            self.records[name] = new  # only the wording changed: not worth a node write
            return
        await self._apply(name, node, rec, new, actions, obs, args)

    async def _room(
        self, name: str, obs: Observation, args: RemediationArgs, cap: int, gpu_nodes: int
    ) -> tuple[bool, str]:
        """Whether the node may be cordoned now, else what holds it back ("": not worth saying).

        The gate (a node unreachable long enough is cordoned on its Ready condition, without
        fresh telemetry), then the cap on nodes in the workflow (nodes that opted out or were
        handed to a human hold no place), then the circuit breaker.
        """
        refused = self.act.refusal(name, args, fresh=NODE_SILENT not in obs.faults)
        if refused is not None:
            self.act.metrics.remediation.labels("cordon", "gpu_fault", refused).inc()
            return False, "stale telemetry" if refused == "stale" else ""
        mine = {n: r for n, r in self.records.items() if not self.act.opted_out(n)}
        if sum(r.phase in WORKING for r in mine.values()) >= cap:
            return False, "maxUnavailablePercent cap"
        if await self.breaker.may_cordon(name, gpu_nodes, args) is not None:
            return False, "circuit breaker"
        if args.breaker_percent > 0 and sum(r.phase in CORDONED for r in mine.values()) >= (
            args.breaker_allows(gpu_nodes)
        ):
            return False, "ceiling of nodes held cordoned (breakerPercent, needs-human included)"
        return True, ""

    async def _apply(
        self,
        name: str,
        node: JsonDict,
        old: Record | None,
        new: Record | None,
        actions: tuple[Action, ...],
        obs: Observation,
        args: RemediationArgs,
    ) -> None:
        """Write the node (record, taint, cordon, label) in one patch, then evict.

        The record is kept only once written: a failed call is tried again next round.
        """
        ref = {"kind": "Node", "name": name, "uid": (node.get("metadata") or {}).get("uid", "")}
        last = new or old
        reason = last.reason if last else "no fault, and no readable record"
        writes: list[Action] = [a for a in actions if a is not Action.EVICT]
        if args.dry_run:
            for action in writes:
                log.warning("remediation (dry run): node %s: would %s: %s", name, action, reason)
                self.act.metrics.remediation.labels(action.value, "gpu_fault", "dry_run").inc()
                kind = "Warning" if action is not Action.UNCORDON else "Normal"
                await self.act.event(ref, "DryRun" + marks.EVENT_REASON[action], reason, kind)
        else:
            text = marks.record_text(new)
            if writes or text != self._known.get(name):
                build = marks.node_patch(
                    new, writes, owns=last.owns_cordon if last else True,
                    ours_cordon=obs.ours_cordon, wall=self.act.now(),
                    window_s=args.repeat_window_s,
                )  # fmt: skip
                entry = None
                refusals, retry_at = self._refused.get(name, (0, 0.0))
                if Action.CORDON in writes:  # written down before it is made
                    if self.act.clock.monotonic() < retry_at:
                        return  # refused a moment ago: backing off (up to a minute)
                    entry = await self.breaker.reserve("cordon", name, args)
                    if entry is None:
                        return
                try:
                    await self.act.patch_node(name, node, build)
                except RecordChanged as exc:
                    log.warning("remediation: node %s: %s: deciding again", name, exc)
                    if entry is not None:
                        self.breaker.cancel(entry)
                    if marks.annotation(exc.node) != self._known.get(name):
                        self._adopt(name, marks.annotation(exc.node))  # another's record wins
                    return
                except KubeError as exc:
                    log.warning("remediation: node %s: %s failed: %s", name, writes, exc)
                    if entry is not None and exc.status in DEFINITE:
                        self.breaker.cancel(entry)
                    if entry is not None:
                        wait = backoff_s(refusals)
                        self._refused[name] = (refusals + 1, self.act.clock.monotonic() + wait)
                        log.warning("remediation: node %s: cordon again in %.0f s", name, wait)
                    for action in writes:
                        self.act.metrics.remediation.labels(
                            action.value, "gpu_fault", "failed"
                        ).inc()
                    return
                self._known[name] = text
                self._refused.pop(name, None)
                await self.act.set_condition(name, marks.condition(new, self.act.now()))
                if Action.CORDON in writes and obs.tainted:
                    message = (
                        f"our taint without a readable record, and a fault: adopted ({reason})"
                    )
                    await self.act.event(ref, "EdgeGPUAdopted", message, "Warning")
                for action in writes:
                    log.warning("remediation: node %s: %s: %s", name, action, reason)
                    self.act.metrics.remediation.labels(action.value, "gpu_fault", "done").inc()
                    kind = "Normal" if action in (Action.UNCORDON, Action.SELF_TEST) else "Warning"
                    message = f"{action}: {reason}"
                    if action is Action.WAIT and new is not None:
                        message = (
                            f"fault confirmed, cordon held back by the {new.waiting}: {reason}"
                        )
                    await self.act.event(ref, marks.EVENT_REASON[action], message, kind)
        if (old.phase if old else None) != (new.phase if new else None):
            self.act.metrics.remediation_transitions.labels(
                new.phase.value if new else "healthy"
            ).inc()
        if new is None:
            self.records.pop(name, None)
        else:
            self.records[name] = new
        if Action.EVICT in actions and new is not None:
            for pod in self._affected(name, new.gpus):
                if args.dry_run:
                    if (pod.namespace, pod.name) in self._planned:
                        continue
                    self._planned.add((pod.namespace, pod.name))
                await self.act.evict(pod, "gpu_fault", f"GPU fault on node {name}: {reason}", args)

    def view(self) -> list[dict[str, Any]]:
        """``GET /debug/remediation``: every node not healthy, its history and next step."""
        out = []
        for name, rec in sorted(self.records.items()):
            doc = rec.to_json()
            doc["node"] = name
            doc["next"] = _NEXT[rec.phase]
            out.append(doc)
        return out


def _union(a: tuple[int, ...] | None, b: tuple[int, ...] | None) -> tuple[int, ...] | None:
    return None if a is None or b is None else tuple(sorted({*a, *b}))
