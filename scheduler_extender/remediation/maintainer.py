"""GPU maintenances, run by the leader: ``GPUMaintenance`` resources taken wave by wave.

Each round lists the maintenances (one call), takes the oldest one not finished (the others
wait, and say so), decides with ``maintenance.advance`` and writes the status at the
resourceVersion it read: a write that lost a race (another leader, a person) decides nothing,
and the next round starts from what the API server holds. That status is the whole memory, so
a new leader, or this one after a restart, goes on from it without redoing a node: a step is
asked by an id the agent runs once. Then each node is made to match (our cordon and taint
``edgegpu.io/maintenance=<name>`` while it is in the workflow, the state label), its GPU pods
are evicted while it drains, and its agent is asked, in its push answers, for the step, the
reboot and the validation. Every cordon, eviction and ask passes the actuator's gate, as the
fault loop's do; the fault loop stands aside on a node the maintenance holds. A maintenance
being deleted is aborted first; its finalizer goes once its nodes are let go.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from scheduler_extender.k8s.client import JsonDict, KubeError
from scheduler_extender.names import (
    MAINTENANCE_API_VERSION,
    MAINTENANCE_FINALIZER,
    MAINTENANCE_KIND,
    MAINTENANCE_STATE_LABEL,
    MAINTENANCE_TAINT,
)
from scheduler_extender.policy.remediation import RemediationArgs
from scheduler_extender.remediation import marks
from scheduler_extender.remediation.actuator import Actuator, NotLeading, RecordChanged
from scheduler_extender.remediation.faultloop import FaultLoop
from scheduler_extender.remediation.maintenance import (
    ACTIVE,
    FINISHED,
    MaintenanceSpec,
    NodeRun,
    Phase,
    Progress,
    Seen,
    State,
    advance,
    start,
)
from scheduler_extender.state.cluster import ClusterState

log = logging.getLogger("scheduler_extender.remediation")

MAX_NODES = 2000
"""Nodes one maintenance may take: its status (every node's entry) must fit in etcd's 1.5 MiB."""

EVENT_REASON = {
    State.PENDING: "EdgeGPUMaintenanceHandedBack",
    State.DRAINING: "EdgeGPUMaintenanceStarted",
    State.STEP: "EdgeGPUMaintenanceStep",
    State.REBOOTING: "EdgeGPUMaintenanceReboot",
    State.VALIDATING: "EdgeGPUMaintenanceValidating",
    State.DONE: "EdgeGPUMaintenanceDone",
    State.FAILED: "EdgeGPUMaintenanceFailed",
    State.SKIPPED: "EdgeGPUMaintenanceSkipped",
}
"""The reason of the Event on a node entering each state."""


@dataclass(frozen=True, slots=True)
class Running:
    """The maintenance this leader runs now, as it last wrote it."""

    name: str
    spec: MaintenanceSpec
    progress: Progress


def _meta(doc: JsonDict) -> JsonDict:
    return doc.get("metadata") or {}


def _ready(node: JsonDict) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _ours(node: JsonDict, name: str) -> bool:
    taint = marks.maintenance_taint(node)
    return taint is not None and taint.get("value") == name


class Maintainer:
    """Every GPUMaintenance, one round at a time, while this replica leads."""

    def __init__(
        self,
        state: ClusterState,
        act: Actuator,
        faults: FaultLoop,
        *,
        nodes: Callable[[], Mapping[str, JsonDict]],
        synced: Callable[[], bool] = lambda: True,
    ) -> None:
        self.state = state
        self.act = act
        self.faults = faults
        self.nodes = nodes
        self.synced = synced
        self._holding: set[str] | None = None
        """Nodes some maintenance holds, as last read (None: not read yet)."""
        self.fresh = True
        """No round run yet since this replica started leading (or remediation came back)."""
        self._stuck: dict[str, float] = {}
        """Nodes unavailable and out of reach: since when this replica saw it (monotonic)."""
        faults.aside = self.holds
        self.running: Running | None = None
        """The maintenance in progress, as last written (None: none, or not leading)."""
        self._said: set[str] = set()
        self._gauged: set[tuple[str, str]] = set()

    def reset(self) -> None:
        """Leadership lost or remediation off: nothing is known but what the API holds."""
        self.running = None
        self._holding = None
        self.fresh = True
        self._stuck.clear()  # seen again from the start: never shorter

    def holds(self, node: str) -> bool:
        """Whether a maintenance holds the node (the fault loop then stands aside on it).

        Before this replica has read the maintenances, any node carrying our taint counts.
        """
        if self._holding is None:
            obj = self.nodes().get(node)
            return obj is not None and marks.maintenance_taint(obj) is not None
        return node in self._holding

    # -- what the agents are asked ----------------------------------------------------------
    def requests(self, node: str, args: RemediationArgs) -> dict[str, Any]:
        """The step, reboot or validation the node's agent is asked for (through the gate)."""
        if self.running is None or self.running.spec.paused:
            return {}
        run = self.running.progress.nodes.get(node)
        if run is None or run.state not in ACTIVE or self.act.refusal(node, args) is not None:
            return {}
        if run.state is State.STEP:
            return {"maintenance": {"id": run.request, "step": self.running.spec.step}}
        if run.state is State.VALIDATING:
            level = run.level or self.running.spec.validation_level
            return {"self_test": {"id": run.request, "level": level}}
        status = self.state.node_status(node)
        if run.state is State.REBOOTING and status is not None and status.boot == run.boot:
            return {"reboot": {"id": run.request, "boot": run.boot}}
        return {}

    # -- one round ----------------------------------------------------------------------------
    async def step(self, args: RemediationArgs) -> None:
        """One round over every GPUMaintenance."""
        if args.dry_run or not self.act.server.known or not self.synced():
            self.reset()  # a full node list first: an empty cache would look like no nodes
            return
        try:
            items: list[JsonDict] = await self.act.call(
                "list gpumaintenances", False, self.act.kube.list_maintenances
            )
        except KubeError as exc:
            self.reset()
            self._say(
                "list",
                f"GPU maintenances cannot be listed ({exc}); is the "
                "gpumaintenances.edgegpu.io CRD installed?",
            )
            return
        self._said.discard("list")
        items.sort(key=lambda d: (str(_meta(d).get("creationTimestamp", "")), _meta(d)["name"]))
        read: list[tuple[JsonDict, MaintenanceSpec | None, Progress | None, str]] = []
        for doc in items:
            read.append(self._read(doc))
        self._holding = self._held(read, None)
        # The one to run: a maintenance with nodes in the workflow first (never two at once),
        # else the oldest not finished. An unreadable or frozen one blocks the rest.
        live = [r for r in read if r[2] is None or r[2].phase not in FINISHED]
        busy = [r for r in live if r[2] is not None and any(
            e.state in ACTIVE for e in r[2].nodes.values())]  # fmt: skip
        first = (busy or live)[0] if busy or live else None
        running: Running | None = None
        for doc, spec, progress, problem in read:
            name = str(_meta(doc)["name"])
            try:
                if spec is None or problem:
                    await self._invalid(doc, progress, problem, args)
                elif progress is not None and progress.phase in FINISHED:
                    await self._settle(doc, name, progress, args)
                elif first is not None and doc is not first[0]:
                    if progress is None or not progress.nodes:
                        other = _meta(first[0])["name"]
                        if progress is None or progress.message != f"waiting for {other}":
                            waiting = Progress(Phase.PENDING, message=f"waiting for {other}",
                                               since=self.act.now())  # fmt: skip
                            await self._write(doc, waiting, progress)
                        if _meta(doc).get("deletionTimestamp"):
                            await self._let_go(doc, progress, args)
                else:
                    running = await self._run(doc, name, spec, progress, args)
            except NotLeading:
                raise
            except Exception:  # one maintenance's odd data never stops the others
                log.exception("maintenance %s: round failed; carrying on", name)
        self.running = running
        self._holding = self._held(read, running)  # with what this round wrote
        if running is not None:
            self.fresh = False
        await self._sweep({_meta(d)["name"] for d in items}, args)

    def _held(
        self,
        read: list[tuple[JsonDict, MaintenanceSpec | None, Progress | None, str]],
        running: Running | None,
    ) -> set[str]:
        """The nodes some maintenance holds.

        Its status says so, or (a status that cannot be read) the node carries its taint.
        """
        nodes = self.nodes()
        held: set[str] = set()
        for doc, _, progress, problem in read:
            name = str(_meta(doc)["name"])
            if running is not None and name == running.name:
                progress = running.progress
            if progress is not None:
                held |= {n for n, r in progress.nodes.items() if r.wants_marks}
            if problem:
                held |= {n for n, obj in nodes.items() if _ours(obj, name)}
        return held

    def _read(self, doc: JsonDict) -> tuple[JsonDict, MaintenanceSpec | None, Progress | None, str]:
        """(the object, its spec, its status, what is wrong with them: "" for nothing)."""
        try:
            progress = Progress.from_json(doc.get("status"))
        except ValueError as exc:
            return doc, None, None, f"unreadable status: {exc}"
        try:
            spec = MaintenanceSpec.model_validate(doc.get("spec") or {})
        except ValidationError as exc:
            errors = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg']}" for e in exc.errors()
            )
            return doc, None, progress, errors[:1024]
        if progress is not None and progress.phase is Phase.INVALID:
            progress = None  # fixed since: it starts now
        if _meta(doc).get("deletionTimestamp"):
            spec = spec.model_copy(update={"abort": True})
        return doc, spec, progress, ""

    async def _invalid(
        self, doc: JsonDict, progress: Progress | None, problem: str, args: RemediationArgs
    ) -> None:
        """A maintenance whose spec or status cannot be read: said, its nodes kept as they are.

        One with nodes in the workflow is frozen (nothing advances, nothing is let go) until a
        person fixes it; one that never started is marked Invalid.
        """
        name = str(_meta(doc)["name"])
        if (progress is not None and progress.nodes and progress.phase not in FINISHED) or (
            problem.startswith("unreadable status")
        ):
            self._say(f"invalid:{name}:{problem}", f"maintenance {name}: {problem}: frozen "
                      "until a person fixes it (its nodes stay as they are)")  # fmt: skip
            return
        if progress is None or progress.phase is not Phase.INVALID or progress.message != problem:
            invalid = Progress(Phase.INVALID, message=problem, since=self.act.now())
            await self._write(doc, invalid, progress)
        await self._let_go(doc, None, args)

    async def _settle(
        self, doc: JsonDict, name: str, progress: Progress, args: RemediationArgs
    ) -> None:
        """A finished maintenance: its nodes made to match its status, let go when deleted.

        An uncordon that failed in its last round is tried again here.
        """
        nodes = self.nodes()
        for node, entry in progress.nodes.items():
            obj = nodes.get(node)
            if obj is not None and _ours(obj, name):  # never a later maintenance's node
                await self._match(name, node, obj, entry, args)
        await self._let_go(doc, progress, args)

    async def _sweep(self, names: set[str], args: RemediationArgs) -> None:
        """Our taint naming a maintenance that no longer exists: removed, with a Warning Event.

        The cordon is left: no record says whose it was.
        """
        for node, obj in self.nodes().items():
            taint = marks.maintenance_taint(obj)
            if taint is None or str(taint.get("value")) in names:
                continue
            if self.act.refusal(node, args, fresh=False) is not None:
                continue

            def build(current: JsonDict) -> JsonDict:
                taints = [t for t in (current.get("spec") or {}).get("taints") or []
                          if t.get("key") != MAINTENANCE_TAINT]  # fmt: skip
                return {"metadata": {"labels": {MAINTENANCE_STATE_LABEL: None}},
                        "spec": {"taints": taints}}  # fmt: skip

            try:
                await self.act.patch_node(node, obj, build)
            except KubeError as exc:
                log.warning("maintenance: node %s: orphaned taint not removed: %s", node, exc)
                continue
            why = (f"our taint named maintenance {taint.get('value')!r}, which no longer "
                   "exists: taint removed, the cordon left for a person")  # fmt: skip
            log.warning("maintenance: node %s: %s", node, why)
            ref = {"kind": "Node", "name": node, "uid": _meta(obj).get("uid", "")}
            await self.act.event(ref, "EdgeGPUMaintenanceOrphaned", why, "Warning")

    async def _run(
        self,
        doc: JsonDict,
        name: str,
        spec: MaintenanceSpec,
        progress: Progress | None,
        args: RemediationArgs,
    ) -> Running | None:
        """One round of the maintenance in progress; what it wrote (None: nothing stands)."""
        nodes = self.nodes()
        gpu = marks.gpu_nodes(nodes) | (set(self.state.store.nodes()) & set(nodes))
        if progress is None or (progress.phase is Phase.PENDING and not progress.nodes):
            labels = {n: dict(_meta(nodes[n]).get("labels") or {}) for n in gpu}
            progress = start(spec, labels, self.act.now())
            if len(progress.nodes) > MAX_NODES:
                problem = (f"it selects {len(progress.nodes)} nodes; at most {MAX_NODES} per "
                           "maintenance (split it by label)")  # fmt: skip
                await self._write(doc, Progress(Phase.INVALID, message=problem,
                                                since=self.act.now()), None)  # fmt: skip
                return None
            written = await self._write(doc, progress, None)
            if written is None:
                return None
            doc = written
            log.warning(
                "maintenance %s: started on %d node(s): %s",
                name,
                len(progress.nodes),
                ", ".join(progress.nodes) or "none",
            )
        now = self.act.now()
        if self.fresh:
            # The first round of this leader, or after remediation was off or paused: every
            # deadline starts over (longer, never shorter than the status says).
            progress = replace(progress, nodes={
                n: replace(r, since=max(r.since, now)) if r.state in ACTIVE else r
                for n, r in progress.nodes.items()})  # fmt: skip
        seen = {n: self._seen(n, nodes.get(n), name, args, n in gpu) for n in progress.nodes}
        new = advance(spec, progress, seen, now, lambda: uuid.uuid4().hex[:12])
        if new != progress or self.fresh:
            if await self._write(doc, new, progress) is None:
                return None
        running = Running(name, spec, new)
        self._gauge(name, new)
        for node, entry in new.nodes.items():
            try:
                await self._match(name, node, nodes.get(node), entry, args)
                if entry.state is State.DRAINING and entry.marked and not spec.paused:
                    await self._drain(name, node, args)
            except NotLeading:
                raise
            except Exception:  # one node's odd data never stops the others
                log.exception("maintenance %s: node %s: round failed; carrying on", name, node)
        return running

    def _seen(
        self, node: str, obj: JsonDict | None, name: str, args: RemediationArgs, gpu: bool
    ) -> Seen:
        """The node now, for ``advance`` (``gpu``: it is a GPU node, with an agent)."""
        if obj is None or (not gpu and not _ours(obj, name)):
            return Seen(exists=False)
        cordoned = bool((obj.get("spec") or {}).get("unschedulable"))
        ours = _ours(obj, name)
        record = self.faults.records.get(node)
        status = self.state.node_status(node)
        verdict = step = None
        faults: tuple[str, ...] = ()
        boot = None
        if status is not None:
            if status.self_test is not None:
                verdict = (*status.self_test, status.self_test_detail)
            step = status.step
            boot = status.boot or None
            faults = tuple(f"gpu{f.index}:{r}" for f in status.faults for r in f.reasons)
        unavailable = not _ready(obj) or (cordoned and not ours)
        may_act = self.act.refusal(node, args) is None
        mono = self.act.clock.monotonic()
        if unavailable and (record is not None or not may_act):
            stuck_s = mono - self._stuck.setdefault(node, mono)
        else:
            self._stuck.pop(node, None)
            stuck_s = 0.0
        return Seen(
            exists=True,
            cordoned=cordoned,
            ours=ours,
            unavailable=unavailable,
            stuck_s=stuck_s,
            held_elsewhere="" if record is None else f"the fault loop holds it ({record.phase})",
            opted_out=marks.opted_out(obj),
            may_act=may_act,
            # Leaving pods count until they are gone: a step never runs under a GPU still used.
            pods_left=len(self.state.allocations.on_node(node)),
            step=step,
            verdict=verdict,
            boot=boot,
            faults=faults,
            drivers=self._drivers(node),
        )

    def _drivers(self, node: str) -> tuple[str, ...]:
        """The driver version each GPU of the node reports ("" where it says none)."""
        record = self.state.store.get(node)
        if record is None:
            return ()
        return tuple(g.driver_version or "" for g in record.report.gpus)

    # -- writes -------------------------------------------------------------------------------
    async def _write(
        self, doc: JsonDict, progress: Progress, old: Progress | None
    ) -> JsonDict | None:
        """Write the status at the resourceVersion read (and our finalizer on a first write).

        Returns the object written; None when it was not (a conflict: decided again next round).
        """
        name = str(_meta(doc)["name"])
        meta = _meta(doc)
        if (
            progress.phase is not Phase.INVALID
            and MAINTENANCE_FINALIZER not in (meta.get("finalizers") or [])
            and not meta.get("deletionTimestamp")
        ):
            patch = {
                "metadata": {
                    "finalizers": [*(meta.get("finalizers") or []), MAINTENANCE_FINALIZER],
                    "resourceVersion": meta.get("resourceVersion"),
                }
            }
            try:
                doc = await self.act.call(
                    f"patch gpumaintenance {name}",
                    True,
                    self.act.kube.patch_maintenance,
                    name,
                    patch,
                )
            except KubeError as exc:
                log.warning("maintenance %s: finalizer not added: %s", name, exc)
                return None
            meta = _meta(doc)
        if Progress.from_json_safe(doc.get("status")) == progress:
            return doc
        body = {
            "apiVersion": MAINTENANCE_API_VERSION,
            "kind": MAINTENANCE_KIND,
            "metadata": {"name": name, "resourceVersion": meta.get("resourceVersion")},
            "status": progress.to_json(),
        }
        try:
            out: JsonDict = await self.act.call(
                f"status gpumaintenance {name}",
                True,
                self.act.kube.replace_maintenance_status,
                name,
                body,
            )
        except KubeError as exc:
            log.warning(
                "maintenance %s: status not written (%s): deciding again next round", name, exc
            )
            return None
        await self._said_so(doc, progress, old)
        return out

    async def _said_so(self, doc: JsonDict, new: Progress, old: Progress | None) -> None:
        """Log, count and record Events for what changed between ``old`` and ``new``."""
        name = str(_meta(doc)["name"])
        ref = {
            "kind": MAINTENANCE_KIND,
            "apiVersion": MAINTENANCE_API_VERSION,
            "name": name,
            "uid": _meta(doc).get("uid", ""),
        }
        if old is None or old.phase is not new.phase:
            kind = "Warning" if new.phase in (Phase.FAILED, Phase.INVALID) else "Normal"
            log.warning("maintenance %s: %s: %s", name, new.phase, new.message)
            await self.act.event(ref, f"EdgeGPUMaintenance{new.phase.value}", new.message, kind)
        before = old.nodes if old is not None else {}
        for node, run in new.nodes.items():
            was = before.get(node)
            if was is not None and was.state is run.state:
                continue
            self.act.metrics.maintenance_transitions.labels(run.state.value).inc()
            if was is None and run.state is State.PENDING:
                continue
            log.warning("maintenance %s: node %s: %s: %s", name, node, run.state, run.message)
            node_ref = {
                "kind": "Node",
                "name": node,
                "uid": _meta(self.nodes().get(node) or {}).get("uid", ""),
            }
            kind = "Warning" if run.state is State.FAILED else "Normal"
            await self.act.event(
                node_ref, EVENT_REASON[run.state], f"maintenance {name}: {run.message}", kind
            )

    def _gauge(self, name: str, progress: Progress) -> None:
        counts = {s.value: 0 for s in State}
        for run in progress.nodes.values():
            counts[run.state.value] += 1
        for state, n in counts.items():
            self.act.metrics.maintenance_nodes.labels(name, state).set(n)
            self._gauged.add((name, state))

    async def _match(
        self, name: str, node: str, obj: JsonDict | None, run: NodeRun, args: RemediationArgs
    ) -> None:
        """Make the node carry what its entry says: our cordon and taint, the state label."""
        if obj is None:
            return
        has = _ours(obj, name)
        want = run.wants_marks
        labels = _meta(obj).get("labels") or {}
        label = None if run.state in (State.PENDING, State.SKIPPED) else run.state.value
        uncordon = has and not want and run.owns_cordon and run.state in (State.DONE, State.PENDING)
        cordoned = bool((obj.get("spec") or {}).get("unschedulable"))
        cordon = want and run.owns_cordon and not cordoned and not run.marked
        if has == want and not cordon and labels.get(MAINTENANCE_STATE_LABEL) == label:
            return
        refused = self.act.refusal(node, args, fresh=want and not has)
        if refused is not None:
            self.act.metrics.remediation.labels(
                "cordon" if want else "uncordon", "maintenance", refused
            ).inc()
            return
        wall = self.act.now()

        def build(current: JsonDict) -> JsonDict:
            taints = [
                t
                for t in (current.get("spec") or {}).get("taints") or []
                if t.get("key") != MAINTENANCE_TAINT
            ]
            spec: JsonDict = {}
            if want:
                taints.append(
                    {
                        "key": MAINTENANCE_TAINT,
                        "value": name,
                        "effect": "NoSchedule",
                        "timeAdded": marks.stamp(wall),
                    }
                )
                if cordon:
                    spec["unschedulable"] = True
            elif uncordon:
                spec["unschedulable"] = None
            if want != _ours(current, name):
                spec["taints"] = taints
            patch: JsonDict = {"metadata": {"labels": {MAINTENANCE_STATE_LABEL: label}}}
            if spec:
                patch["spec"] = spec
            return patch

        try:
            await self.act.patch_node(node, obj, build)
        except RecordChanged as exc:
            log.warning("maintenance %s: node %s: %s: deciding again next round", name, node, exc)
            return
        except KubeError as exc:
            log.warning("maintenance %s: node %s: not written: %s", name, node, exc)
            self.act.metrics.remediation.labels(
                "cordon" if want else "uncordon", "maintenance", "failed"
            ).inc()
            return
        action = "cordon" if want and not has else "uncordon" if uncordon else "label"
        self.act.metrics.remediation.labels(action, "maintenance", "done").inc()

    async def _drain(self, name: str, node: str, args: RemediationArgs) -> None:
        """Evict the node's GPU pods, lowest class first (through the gate and the budget)."""
        for pod in self.faults.affected(node, None):
            await self.act.evict(pod, "maintenance", f"GPU maintenance {name} on node {node}", args)

    async def _let_go(
        self, doc: JsonDict, progress: Progress | None, args: RemediationArgs
    ) -> None:
        """A finished maintenance being deleted: our taints and labels off, then the finalizer.

        A failed node a person has not handed back stays cordoned (only our taint and label
        go): deleting the maintenance is not a verdict on the node.
        """
        meta = _meta(doc)
        name = str(meta["name"])
        if not meta.get("deletionTimestamp") or MAINTENANCE_FINALIZER not in (
            meta.get("finalizers") or []
        ):
            return
        for node, obj in self.nodes().items():
            labels = _meta(obj).get("labels") or {}
            if not _ours(obj, name) and not (
                progress is not None
                and node in progress.nodes
                and labels.get(MAINTENANCE_STATE_LABEL) is not None
                and node not in (self._holding or ())  # another maintenance's label now
            ):
                continue
            if self.act.refusal(node, args, fresh=False) is not None:
                return  # opted out, paused...: the finalizer waits
            entry = progress.nodes.get(node) if progress is not None else None
            # A done or handed-back node whose uncordon never landed is uncordoned now.
            lift = entry is not None and entry.owns_cordon and entry.state in (
                State.DONE, State.PENDING)  # fmt: skip

            def build(current: JsonDict, name: str = name, lift: bool = lift) -> JsonDict:
                patch: JsonDict = {"metadata": {"labels": {MAINTENANCE_STATE_LABEL: None}}}
                if _ours(current, name):
                    patch["spec"] = {
                        "taints": [
                            t
                            for t in (current.get("spec") or {}).get("taints") or []
                            if t.get("key") != MAINTENANCE_TAINT
                        ]
                    }
                    if lift:
                        patch["spec"]["unschedulable"] = None
                return patch

            try:
                await self.act.patch_node(node, obj, build)
            except KubeError as exc:
                log.warning("maintenance %s: node %s: not let go yet: %s", name, node, exc)
                return
        finalizers = [f for f in meta.get("finalizers") or [] if f != MAINTENANCE_FINALIZER]
        patch = {
            "metadata": {
                "finalizers": finalizers or None,
                "resourceVersion": meta.get("resourceVersion"),
            }
        }
        try:
            await self.act.call(
                f"patch gpumaintenance {name}", True, self.act.kube.patch_maintenance, name, patch
            )
        except KubeError as exc:
            log.warning("maintenance %s: finalizer not removed: %s", name, exc)
            return
        for key in [k for k in self._gauged if k[0] == name]:
            self.act.metrics.maintenance_nodes.remove(*key)
            self._gauged.discard(key)
        log.warning("maintenance %s: deleted; its nodes let go", name)

    def _say(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning("%s", message)

    def view(self) -> dict[str, Any] | None:
        """``GET /debug/maintenance``: the maintenance in progress as this leader last wrote it."""
        if self.running is None:
            return None
        return {
            "name": self.running.name,
            "spec": self.running.spec.model_dump(by_alias=True),
            **self.running.progress.to_json(),
        }
