"""A GPU maintenance, pure: the ``GPUMaintenance`` resource's spec, its progress, one round.

An operator declares which nodes, which step (a name the agents' own allow-lists know; never
a command), how many nodes at once and the validation to pass. The leader takes the nodes one
wave at a time::

    pending ─room─▶ draining (cordoned) ─GPU pods gone─▶ step ─pass─▶ [rebooting] ─▶ validating
                       │ drainTimeout                     │ fail, stepTimeout  │       │ pass
                       ▼                                  ▼                    ▼       ▼
                     failed ◀─────────────────────────────────────────────────────   done

``maxUnavailable`` counts the nodes of the maintenance in the workflow and those unavailable
for any other reason (NotReady, cordoned by someone else, held by the fault loop): a new node
starts only while fewer are. The first failure stops the maintenance: the failed node stays
cordoned for a person, no pending node is started, nodes already past their drain finish. A
person who uncordons a node, or removes our taint, during the workflow ends it on that node
(``failed``, handed back as they left it) and so stops the maintenance. ``paused`` freezes
everything (deadlines start over on resume); ``abort`` starts nothing new, hands back the nodes
still draining and lets the others finish. Times are the API server's seconds.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from scheduler_extender.policy.base import Duration
from scheduler_extender.remediation.faults import epoch as _epoch, stamp as _stamp
from scheduler_extender.telemetry.answer import STEP_PATTERN

_LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
_NODE_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
HISTORY = 6
"""Transitions kept per node in the status (2 once it is done or skipped: the status of a
large maintenance must fit in one object)."""
MESSAGE = 300
"""Characters of a node's message kept (a tool's output is cut here)."""

StepName = Annotated[str, StringConstraints(pattern=STEP_PATTERN)]
LabelValue = Annotated[str, StringConstraints(pattern=_LABEL_VALUE)]
NodeName = Annotated[str, StringConstraints(pattern=_NODE_NAME)]


LEVEL_3_VALIDATION_S = 7200.0
"""The default validationTimeout at level 3: ``dcgmi diag -r 3`` alone takes about 30 minutes."""


class MaintenanceSpec(BaseModel):
    """``spec`` of a ``GPUMaintenance`` (edgegpu.io/v1alpha1)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    node_selector: dict[str, LabelValue] | None = Field(
        None,
        alias="nodeSelector",
        description="Labels a node must carry to be maintained ({} = every GPU node).",
    )
    nodes: list[NodeName] | None = Field(
        None, max_length=2000, description="Node names to maintain (with nodeSelector: both)."
    )
    step: StepName = Field(
        description="The step each node's agent runs: a name in the agents' own allow-list "
        "(--maintenance-steps), never a command."
    )
    max_unavailable: int = Field(
        1,
        alias="maxUnavailable",
        ge=1,
        le=500,
        description="Nodes of the maintenance unavailable at once: in the workflow, or "
        "NotReady, cordoned or held by the fault loop for another reason.",
    )
    validation_level: int = Field(
        1,
        alias="validationLevel",
        ge=1,
        le=3,
        description="The agent's validation after the step: 1 quick (NVML, a CUDA context, "
        "dcgmi diag -r 1, deviceQuery and vectorAdd where installed), 2 medium (also "
        "bandwidths: dcgmi diag -r 2, bandwidthTest), 3 long (dcgmi diag -r 3, "
        "p2pBandwidthLatencyTest).",
    )
    driver_version: str | None = Field(
        None,
        alias="driverVersion",
        min_length=1,
        max_length=64,
        description="The target: a node whose GPUs all report this driver version already is "
        "skipped, and one that does not report it after its step fails its validation.",
    )
    paused: bool = Field(False, description="Freeze: nothing starts or advances until false.")
    abort: bool = Field(
        False,
        description="Start no new node; hand back the nodes still draining; nodes past their "
        "drain finish (a step cannot be stopped halfway).",
    )
    drain_timeout_s: Duration = Field(
        1800.0, alias="drainTimeout", description="A drain longer than this fails the node (30m)."
    )
    step_timeout_s: Duration = Field(
        3600.0, alias="stepTimeout", description="No step result in this long fails it (1h)."
    )
    reboot_timeout_s: Duration = Field(
        1800.0,
        alias="rebootTimeout",
        description="A node not back with a new boot in this long fails (30m).",
    )
    validation_timeout_s: Duration = Field(
        1800.0,
        alias="validationTimeout",
        description="No validation verdict in this long fails the node (30m; 2h at "
        "validationLevel 3).",
    )

    @field_validator("node_selector")
    @classmethod
    def _label_keys(cls, selector: dict[str, str] | None) -> dict[str, str] | None:
        for key in selector or {}:
            if re.fullmatch(_LABEL_KEY, key) is None:
                raise ValueError(f"{key!r} is not a label key")
        return selector

    def validation_deadline_s(self, level: int) -> float:
        """``validationTimeout`` as given, else 30 minutes (2 hours at level 3)."""
        if "validation_timeout_s" in self.model_fields_set:
            return self.validation_timeout_s
        return LEVEL_3_VALIDATION_S if level >= 3 else self.validation_timeout_s

    @model_validator(mode="after")
    def _some_nodes(self) -> MaintenanceSpec:
        if self.node_selector is None and self.nodes is None:
            raise ValueError("name the nodes: nodeSelector ({} for every GPU node), nodes, or both")
        return self

    def selects(self, name: str, labels: Mapping[str, str]) -> bool:
        """Whether a node of that name and those labels is one to maintain."""
        if self.nodes is not None and name not in self.nodes:
            return False
        selector = self.node_selector or {}
        return all(labels.get(k) == v for k, v in selector.items())


class Phase(enum.StrEnum):
    """The whole maintenance."""

    PENDING = "Pending"
    """Not started: waiting for another maintenance, or for its first round."""
    RUNNING = "Running"
    PAUSED = "Paused"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    ABORTED = "Aborted"
    INVALID = "Invalid"


FINISHED: frozenset[Phase] = frozenset(
    {Phase.SUCCEEDED, Phase.FAILED, Phase.ABORTED, Phase.INVALID}
)


class State(enum.StrEnum):
    """One node of a maintenance."""

    PENDING = "pending"
    DRAINING = "draining"
    STEP = "step"
    REBOOTING = "rebooting"
    VALIDATING = "validating"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"


ACTIVE: frozenset[State] = frozenset(
    {State.DRAINING, State.STEP, State.REBOOTING, State.VALIDATING}
)
"""States in which the node is in the workflow (cordoned by the maintenance)."""


@dataclass(frozen=True, slots=True)
class NodeRun:
    """A node's place in the maintenance, as the status holds it."""

    state: State
    since: float
    request: str = ""
    """The id of the step, reboot or validation asked of the agent."""
    boot: str = ""
    """The node's boot when its reboot was asked for."""
    owns_cordon: bool = True
    """False: the node was cordoned before the maintenance (it is never uncordoned by us)."""
    marked: bool = False
    """Our cordon and taint were seen on the node (from then on, their loss is a person's)."""
    held: bool = True
    """A failed node is kept cordoned for a person; False once a person handed it back."""
    message: str = ""
    history: tuple[tuple[str, float, str], ...] = ()
    level: int = 0
    """The validation level asked of the agent (0: none yet): an edit of the spec's
    ``validationLevel`` applies to the nodes validated after it, never to a running test."""

    def to(self, state: State, now: float, why: str, **changes: Any) -> NodeRun:
        """This node in ``state`` from ``now``, with ``why`` in its history."""
        why = why[:MESSAGE]
        history = (*self.history, (state.value, now, why))[-HISTORY:]
        return replace(self, state=state, since=now, message=why, history=history, **changes)

    @property
    def wants_marks(self) -> bool:
        """Whether the node should carry our cordon and taint now."""
        return self.state in ACTIVE or (self.state is State.FAILED and self.held and self.marked)

    def to_json(self) -> dict[str, Any]:
        """The node's entry in ``status.nodes``."""
        return {
            "state": self.state.value,
            "since": _stamp(self.since),
            "request": self.request,
            "boot": self.boot,
            "ownsCordon": self.owns_cordon,
            "marked": self.marked,
            "held": self.held,
            "message": self.message,
            **({"level": self.level} if self.level else {}),
            "history": [
                {"state": s, "at": _stamp(t), "why": w}
                for s, t, w in (
                    self.history[-2:]
                    if self.state in (State.DONE, State.SKIPPED, State.PENDING)
                    else self.history
                )
            ],
        }

    @classmethod
    def from_json(cls, doc: Any) -> NodeRun:
        """An entry read back from the status (``ValueError`` when it is not one)."""
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        try:
            return cls(
                state=State(doc["state"]),
                since=_epoch(doc["since"]),
                request=str(doc.get("request") or ""),
                boot=str(doc.get("boot") or ""),
                owns_cordon=doc.get("ownsCordon", True) is not False,
                marked=doc.get("marked") is True,
                held=doc.get("held", True) is not False,
                message=str(doc.get("message") or ""),
                level=doc["level"]
                if type(doc.get("level")) is int and 1 <= doc["level"] <= 3
                else 0,
                history=tuple(
                    (str(h["state"]), _epoch(h["at"]), str(h.get("why", "")))
                    for h in doc.get("history") or ()
                ),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a maintenance node entry: {exc}") from None


@dataclass(frozen=True, slots=True)
class Progress:
    """The maintenance's status: its phase and every node it maintains."""

    phase: Phase
    nodes: dict[str, NodeRun] = field(default_factory=dict)
    message: str = ""
    since: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """``status`` as it is written (counts for ``kubectl get``)."""
        counts = {s.value: 0 for s in State}
        for run in self.nodes.values():
            counts[run.state.value] += 1
        return {
            "phase": self.phase.value,
            "message": self.message,
            "since": _stamp(self.since),
            "done": counts["done"],
            "total": len(self.nodes),
            "counts": counts,
            "nodes": {name: run.to_json() for name, run in sorted(self.nodes.items())},
        }

    @classmethod
    def from_json_safe(cls, doc: Any) -> Progress | None:
        """``from_json``, None for a status that is not one."""
        try:
            return cls.from_json(doc)
        except ValueError:
            return None

    @classmethod
    def from_json(cls, doc: Any) -> Progress | None:
        """The status read back; None when there is none (not started). ``ValueError`` if odd."""
        if not isinstance(doc, dict) or not doc.get("phase"):
            return None
        try:
            nodes = doc.get("nodes") or {}
            if not isinstance(nodes, dict):
                raise ValueError("nodes is not an object")
            return cls(
                phase=Phase(doc["phase"]),
                nodes={str(n): NodeRun.from_json(r) for n, r in nodes.items()},
                message=str(doc.get("message") or ""),
                since=_epoch(doc["since"]) if doc.get("since") else 0.0,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a maintenance status: {exc}") from None


@dataclass(frozen=True, slots=True)
class Seen:
    """One node of the maintenance now, as the API server and its agent show it."""

    exists: bool = True
    cordoned: bool = False
    """``spec.unschedulable``."""
    ours: bool = False
    """The node carries this maintenance's taint."""
    unavailable: bool = False
    """NotReady, or cordoned by someone else (not by this maintenance)."""
    held_elsewhere: str = ""
    """What else holds the node so that it may not be started now (the fault loop)."""
    opted_out: bool = False
    may_act: bool = True
    """The gate allows an action on the node now (fresh telemetry, leadership...)."""
    pods_left: int = 0
    step: tuple[str, str, bool, str] | None = None
    """(id, ``pass`` | ``fail``, reboot wanted, detail) of the last step the agent ran."""
    verdict: tuple[str, str, str] | None = None
    """(id, ``pass`` | ``fail``, detail) of the last self-test the agent ran."""
    boot: str | None = None
    faults: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    """The driver versions the node's GPUs report (one each; empty: not known)."""
    stuck_s: float = 0.0
    """How long the node has been unavailable and out of reach, as this leader saw it."""


def _at(spec: MaintenanceSpec, s: Seen) -> bool:
    """Whether every GPU of the node reports the target driver version."""
    return (
        spec.driver_version is not None
        and bool(s.drivers)
        and all(d == spec.driver_version for d in s.drivers)
    )


def _gone_marks(run: NodeRun, seen: Seen) -> str:
    """What a person changed of our marks on a node that should carry them ("": nothing)."""
    if not run.marked or not seen.exists:
        return ""
    if not seen.ours:
        return "our taint was removed by someone else"
    if run.owns_cordon and not seen.cordoned:
        return "uncordoned by someone else"
    return ""


def advance(
    spec: MaintenanceSpec,
    progress: Progress,
    seen: Mapping[str, Seen],
    now: float,
    new_id: Callable[[], str],
) -> Progress:
    """The maintenance after one round: every node advanced, then new ones started.

    ``progress`` must be started (its nodes listed). Pure: the controller writes the result and
    makes the node match it (our cordon and taint where ``wants_marks``).
    """
    now = _epoch(_stamp(now))  # decide on the time a new leader reads back
    if progress.phase in FINISHED:
        return progress
    nodes = dict(progress.nodes)
    if progress.phase is Phase.PAUSED and not spec.paused:  # resumed: deadlines start over
        nodes = {n: replace(r, since=now) if r.state in ACTIVE else r for n, r in nodes.items()}
    for name, run in nodes.items():
        s = seen.get(name, Seen(exists=False))
        nodes[name] = _node(spec, run, s, now, new_id, frozen=spec.paused)
    failed = [n for n, r in nodes.items() if r.state is State.FAILED]
    active = [n for n, r in nodes.items() if r.state in ACTIVE]
    if spec.paused:
        return replace(
            progress,
            phase=Phase.PAUSED,
            nodes=nodes,
            message="paused: nothing starts or advances",
            since=(progress.since if progress.phase is Phase.PAUSED else now),
        )
    if spec.abort:
        for name in active:
            if nodes[name].state is State.DRAINING:
                nodes[name] = nodes[name].to(
                    State.PENDING, now, "aborted during its drain: handed back", marked=False
                )
        active = [n for n, r in nodes.items() if r.state in ACTIVE]
        if active:
            return replace(
                progress,
                phase=Phase.RUNNING,
                nodes=nodes,
                message=f"aborting: waiting for {', '.join(active)} to finish",
            )
        return replace(
            progress,
            phase=Phase.ABORTED,
            nodes=nodes,
            since=now,
            message="aborted" + (f"; failed: {', '.join(failed)}" if failed else ""),
        )
    if failed:
        why = "; ".join(f"{n}: {nodes[n].message[:120]}" for n in failed[:3])
        why += f" (and {len(failed) - 3} more)" if len(failed) > 3 else ""
        if active:
            return replace(
                progress,
                phase=Phase.RUNNING,
                nodes=nodes,
                message=f"stopping on a failure ({why}); waiting for {', '.join(active)} to finish",
            )
        return replace(
            progress,
            phase=Phase.FAILED,
            nodes=nodes,
            since=now,
            message=f"stopped on a failure: {why}",
        )
    busy = {n for n, r in nodes.items() if r.state in ACTIVE}
    busy |= {n for n in nodes if seen.get(n, Seen(exists=False)).unavailable}
    busy |= {n for n in nodes if seen.get(n, Seen(exists=False)).ours}  # an uncordon not made yet
    waiting = ""
    for name, run in sorted(nodes.items()):
        if run.state is not State.PENDING:
            continue
        s = seen.get(name, Seen(exists=False))
        if not s.exists:
            nodes[name] = run.to(State.SKIPPED, now, "no such GPU node")
            continue
        if s.opted_out:
            nodes[name] = run.to(State.SKIPPED, now, "opted out (edgegpu.io/remediation=disabled)")
            continue
        if _at(spec, s):
            nodes[name] = run.to(State.SKIPPED, now, f"already at driver {spec.driver_version}")
            continue
        if s.stuck_s > spec.drain_timeout_s:
            # NotReady or silent and out of reach for that long: it would hold a place forever.
            why = s.held_elsewhere or "unavailable, and its telemetry stale or the gate refusing"
            nodes[name] = run.to(
                State.SKIPPED,
                now,
                f"{why} for {s.stuck_s:.0f} s (drainTimeout) before it could start",
            )
            busy.discard(name)
            continue
        if len(busy | {name}) > spec.max_unavailable:  # one unavailable already adds nothing
            waiting = waiting or f"{len(busy)} of maxUnavailable {spec.max_unavailable} busy"
            break
        if s.held_elsewhere or not s.may_act:
            waiting = waiting or f"{name}: {s.held_elsewhere or 'the gate refuses it now'}"
            continue
        nodes[name] = run.to(
            State.DRAINING,
            now,
            "started",
            owns_cordon=not s.cordoned,
            marked=False,
            held=True,
            request="",
        )
        busy.add(name)
    left = [n for n, r in nodes.items() if r.state in (State.PENDING, *ACTIVE)]
    if not left:
        return replace(
            progress,
            phase=Phase.SUCCEEDED,
            nodes=nodes,
            since=now,
            message="every node done"
            if any(r.state is State.DONE for r in nodes.values())
            else "nothing to do",
        )
    active = sorted(n for n, r in nodes.items() if r.state in ACTIVE)
    message = f"in progress: {', '.join(active)}" if active else f"waiting: {waiting}"
    since = progress.since if progress.phase is Phase.RUNNING else now
    return replace(progress, phase=Phase.RUNNING, nodes=nodes, message=message, since=since)


def _node(
    spec: MaintenanceSpec,
    run: NodeRun,
    s: Seen,
    now: float,
    new_id: Callable[[], str],
    *,
    frozen: bool,
) -> NodeRun:
    """One node's next entry (nothing starts here: that is ``advance``'s)."""
    if run.wants_marks:
        gone = _gone_marks(run, s)
        if gone:
            return run.to(
                State.FAILED,
                now,
                f"{gone} during {run.state}: handed back as left",
                held=False,
                marked=False,
            )
        if not s.exists:
            return run.to(
                State.FAILED,
                now,
                f"the node was deleted during {run.state}",
                held=False,
                marked=False,
            )
        if s.ours and not run.marked and (s.cordoned or not run.owns_cordon):
            run = replace(run, marked=True)  # our cordon is on: its loss is a person's from now
    if run.state not in ACTIVE or frozen:
        return run
    waited = now - run.since
    if run.state is State.DRAINING:
        if not run.marked:
            return run  # the controller cordons it first
        if s.pods_left == 0:
            return run.to(State.STEP, now, "drained", request=new_id())
        if waited > spec.drain_timeout_s:
            return run.to(
                State.FAILED,
                now,
                f"drain not finished in {waited:.0f} s "
                f"(drainTimeout): {s.pods_left} GPU pod(s) left",
            )
        return run
    if run.state is State.STEP:
        if s.step is not None and s.step[0] == run.request:
            _, outcome, reboot, detail = s.step
            if outcome != "pass":
                return run.to(State.FAILED, now, f"step {spec.step} failed: {detail}".strip())
            if reboot:
                if not s.boot:
                    return run.to(
                        State.FAILED,
                        now,
                        "the step asks for a reboot but the node reports no boot id to tell one by",
                    )
                return run.to(
                    State.REBOOTING,
                    now,
                    f"step {spec.step} passed; reboot asked",
                    request=new_id(),
                    boot=s.boot,
                )
            return run.to(State.VALIDATING, now, f"step {spec.step} passed", request=new_id(),
                          level=spec.validation_level)  # fmt: skip
        if waited > spec.step_timeout_s:
            return run.to(
                State.FAILED, now, f"no result of step {spec.step} in {waited:.0f} s (stepTimeout)"
            )
        return run
    if run.state is State.REBOOTING:
        if s.boot and s.boot != run.boot:
            return run.to(State.VALIDATING, now, "back with a new boot", request=new_id(),
                          level=spec.validation_level)  # fmt: skip
        if waited > spec.reboot_timeout_s:
            return run.to(
                State.FAILED, now, f"not back {waited:.0f} s after the reboot ask (rebootTimeout)"
            )
        return run
    # validating
    if s.verdict is not None and s.verdict[0] == run.request:
        _, verdict, detail = s.verdict
        if verdict == "pass" and not s.faults and spec.driver_version and not _at(spec, s):
            found = ", ".join(sorted(set(s.drivers))) or "none"
            return run.to(
                State.FAILED,
                now,
                f"validation passed but the GPUs report driver {found}, not {spec.driver_version}",
            )
        if verdict == "pass" and not s.faults:
            return run.to(State.DONE, now, "validation passed", marked=False)
        why = (
            f"validation failed: {detail}".strip()
            if verdict != "pass"
            else f"validation passed but the agent reports faults: {', '.join(s.faults)}"
        )
        return run.to(State.FAILED, now, why[:1024])
    if waited > spec.validation_deadline_s(run.level or spec.validation_level):
        return run.to(
            State.FAILED, now, f"no validation verdict in {waited:.0f} s (validationTimeout)"
        )
    return run


def start(spec: MaintenanceSpec, nodes: Mapping[str, Mapping[str, str]], now: float) -> Progress:
    """The first status: every node the spec selects (by name and labels), pending.

    ``nodes``: the GPU nodes' labels by name. A node named in ``spec.nodes`` that is not
    among them is listed too (skipped in the first round: no such node).
    """
    now = _epoch(_stamp(now))
    names = {n for n, labels in nodes.items() if spec.selects(n, labels)}
    names |= set(spec.nodes or ()) - set(nodes)
    runs = {
        n: NodeRun(State.PENDING, now, history=((State.PENDING.value, now, "selected"),))
        for n in sorted(names)
    }
    return Progress(Phase.RUNNING, runs, "started", now)
