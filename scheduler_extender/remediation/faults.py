"""The GPU fault loop, pure: one node's remediation record, advanced by what is seen now.

::

    healthy ─fault─▶ suspect ─lasts confirmAfter─▶ draining (cordoned) ─pods gone─▶ self-test
       ▲               │ clears                        │ (evict the pods on the faulty GPUs)
       └───────────────┘                               ▼
    uncordon ◀─pass, fault gone, cool─ self-test ─fail─▶ reboot-requested ─agent back─▶ verifying
       ▲                                   │ no verdict                     │ timeout     │ fail
       └────────────── pass ──────────────────────────────────────────────────────────── ┤
                                           ▼                                ▼             ▼
                                      needs-human ◀───────────────────────────────────────┘

A suspect the cap or the circuit breaker holds back is written down (``waiting`` says which,
with an Event), not kept in memory only. A drain that does not finish in ``drainTimeout`` (a
PodDisruptionBudget that allows nothing) goes to needs-human, which holds no place under the
cap. A manual uncordon during the workflow ends it (``released``): we stand aside until the fault
clears, and act again only on a fault somewhere new (another GPU, or the node). No record means
healthy. A fault on a GPU that was drained ``repeatLimit - 1`` times within ``repeatWindow``
goes straight to needs-human (cordoned, nothing evicted): no drain loop for a GPU that keeps
failing. Our taint without a readable record (a person removed or broke the annotation) is
cleaned up when there is no fault, and adopted as our own cordon when there is one. Times are
the API server's seconds (``Actuator.now``), so that a record read back from the node annotation
by another replica, whatever its own clock says, means the same.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from scheduler_extender.policy.remediation import RemediationArgs

NODE_SILENT = "node:not-ready-silent"
"""The fault of a node NotReady with its agent silent for ``unreachableAfter``."""

_UNREACHABLE = "node unreachable: self-test when it is back"

HISTORY = 10
"""Transitions kept in the record (and the annotation)."""


class Phase(enum.StrEnum):
    """Where a node is in the fault loop."""

    SUSPECT = "suspect"
    DRAINING = "draining"
    SELF_TEST = "self-test"
    REBOOT_REQUESTED = "reboot-requested"
    VERIFYING = "verifying"
    NEEDS_HUMAN = "needs-human"
    RELEASED = "released"


CORDONED: frozenset[Phase] = frozenset(
    {Phase.DRAINING, Phase.SELF_TEST, Phase.REBOOT_REQUESTED, Phase.VERIFYING, Phase.NEEDS_HUMAN}
)
"""Phases in which the node is held cordoned by us."""

WORKING: frozenset[Phase] = CORDONED - {Phase.NEEDS_HUMAN}
"""Phases that hold a place under the cap (a node handed to a human holds none)."""


class Action(enum.StrEnum):
    """What the actuator does for a transition (besides writing the record)."""

    CORDON = "cordon"
    EVICT = "evict"
    SELF_TEST = "self-test"
    REBOOT = "reboot"
    UNCORDON = "uncordon"
    RELEASE = "release"
    """Stand aside after a manual uncordon: remove our taint, keep the record."""
    NEEDS_HUMAN = "needs-human"
    WAIT = "wait"
    """A suspect held back (the cap, the breaker): write it down and say so."""
    CLEAN_UP = "clean-up"
    """Our taint, cordon and condition without a record, and no fault: remove them."""


@dataclass(frozen=True, slots=True)
class Observation:
    """One node now, as the telemetry and the API server show it."""

    faults: tuple[str, ...]
    """Fault codes, e.g. ``gpu0:xid:79``, ``node:not-ready-silent``; empty: none."""
    gpus: tuple[int, ...] | None
    """The GPUs the faults are on; None: the whole node."""
    cordoned: bool
    """``spec.unschedulable``."""
    pods_left: int
    """Pods on the affected GPUs that are not leaving yet."""
    verdict: tuple[str, str] | None = None
    """(request id, ``pass`` | ``fail``) of the last self-test the agent reported."""
    boot: str | None = None
    """The agent's boot id in its last report."""
    cooling: bool = False
    """A GPU of the node is hot or in its thermal cool-down."""
    tainted: bool = False
    """The node carries our taint (we were there, whatever its annotation says now)."""
    ours_cordon: bool = False
    """Our taint says we cordoned the node (not someone before us)."""
    repeats: int = 0
    """Earlier drains, within ``repeatWindow``, of the GPU (or node) the fault is on."""


@dataclass(frozen=True, slots=True)
class Record:
    """A node's place in the loop; written to the node annotation ``edgegpu.io/remediation``."""

    phase: Phase
    reason: str
    since: float
    """When this phase began."""
    started: float
    """When the fault was first seen."""
    owner: str
    gpus: tuple[int, ...] | None = None
    owns_cordon: bool = True
    """False when the node was cordoned already: then we never uncordon it."""
    request: str = ""
    """Id of the self-test or reboot asked of the agent."""
    boot: str = ""
    """The agent's boot id when the reboot was asked for."""
    faults: tuple[str, ...] = ()
    history: tuple[tuple[str, float, str], ...] = field(default_factory=tuple)
    waiting: str = ""
    """A suspect held back: by what (``maxUnavailablePercent``, ``circuit breaker``...)."""

    def to(self, phase: Phase, now: float, why: str, **changes: Any) -> Record:
        """This record in ``phase`` from ``now``, with ``why`` in its history."""
        history = (*self.history, (phase.value, now, why))[-HISTORY:]
        return replace(self, phase=phase, since=now, history=history, **changes)

    def to_json(self) -> dict[str, Any]:
        """The annotation's JSON: state, reason, since, owner, and what a restart needs."""
        return {
            "state": self.phase.value,
            "reason": self.reason,
            "since": stamp(self.since),
            "owner": self.owner,
            "started": stamp(self.started),
            "gpus": None if self.gpus is None else list(self.gpus),
            "ownsCordon": self.owns_cordon,
            "request": self.request,
            "boot": self.boot,
            "faults": list(self.faults),
            "history": [{"state": s, "at": stamp(t), "why": w} for s, t, w in self.history],
            "waiting": self.waiting,
        }

    @classmethod
    def from_json(cls, doc: Any) -> Record:
        """A record read back from the annotation (``ValueError`` when it is not one)."""
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        try:
            gpus = doc.get("gpus")
            return cls(
                phase=Phase(doc["state"]),
                reason=str(doc.get("reason", "")),
                since=epoch(doc["since"]),
                started=epoch(doc.get("started", doc["since"])),
                owner=str(doc.get("owner", "")),
                gpus=None if gpus is None else tuple(int(g) for g in gpus),
                owns_cordon=doc.get("ownsCordon", True) is not False,
                request=str(doc.get("request", "")),
                boot=str(doc.get("boot", "")),
                faults=tuple(str(f) for f in doc.get("faults") or ()),
                history=tuple(
                    (str(h["state"]), epoch(h["at"]), str(h.get("why", "")))
                    for h in doc.get("history") or ()
                ),
                waiting=str(doc.get("waiting") or ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a remediation record: {exc}") from None


def stamp(t: float) -> str:
    """A time as records keep it: RFC 3339 UTC with microseconds."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_LATEST_S = 32503680000.0
"""Year 3000: a later (or a negative) time in a record is not one we wrote."""


def epoch(text: Any) -> float:
    """A time a record holds, in seconds (``ValueError`` outside year 0 of the epoch to 3000)."""
    t = datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    if not 0 <= t < _LATEST_S:
        raise ValueError(f"time out of range: {text}")
    return t


def _reason(faults: tuple[str, ...]) -> str:
    return ", ".join(faults)


def _where(faults: tuple[str, ...]) -> set[str]:
    """What the faults are on: ``gpu0``, ``node``... (a new reason on the same GPU is not new)."""
    return {f.split(":", 1)[0] for f in faults}


History = dict[str, tuple[float, ...]]
"""When each place (``gpu0``, ``node``) was cordoned for a fault: the repeat count's memory."""


def history_from_json(text: str | None) -> History:
    """A history read back from its annotation (an unreadable one counts as empty)."""
    try:
        doc = json.loads(text or "{}")
        return {str(w): tuple(epoch(t) for t in ts) for w, ts in dict(doc).items()}
    except (ValueError, TypeError):
        return {}


def history_to_json(history: History) -> str:
    """A history as its annotation holds it."""
    return json.dumps({w: [stamp(t) for t in ts] for w, ts in sorted(history.items())})


def places(faults: tuple[str, ...]) -> set[str]:
    """What the faults are on: ``gpu0``, ``node``..."""
    return _where(faults)


def repeats(history: History, where: set[str], now: float, window_s: float) -> int:
    """The most cordons of any of ``where`` within the window before ``now``."""
    return max(  # (a time in the future counts: a clock that stepped back hides nothing)
        (sum(1 for t in history.get(w, ()) if now - t < window_s) for w in where), default=0
    )


def remember(history: History, where: set[str], now: float, window_s: float) -> History:
    """``history`` with a cordon at ``now`` for each place of ``where``; older ones dropped."""
    out = {w: tuple(t for t in ts if now - t < window_s) for w, ts in history.items()}
    for w in where:
        out[w] = (*out.get(w, ()), now)
    return {w: ts for w, ts in out.items() if ts}


def step(
    rec: Record | None,
    obs: Observation,
    now: float,
    args: RemediationArgs,
    *,
    owner: str,
    room: bool,
    new_id: Callable[[], str],
    held_by: str = "maxUnavailablePercent",
    acting_since: float = 0.0,
) -> tuple[Record | None, tuple[Action, ...]]:
    """The node's next record and the actions that take it there.

    ``room``: whether a cordon may be made now (the cap, the breaker, the gate); ``held_by``
    what holds it back when not ("": nothing worth writing down, e.g. stale telemetry). Every
    transition looks at the
    fault as it is now: a fault that clears while suspect ends it without a cordon; a self-test
    that passes while the fault is still reported counts as failed. ``acting_since``: when
    this leader began acting (after a leader change, a restart, or remediation off or paused):
    a drain, self-test or reboot is waited for from then at the earliest, never for less than
    its timeout by someone acting.
    """
    # The annotation holds microseconds: decide on the time a new leader would read back, so
    # that a restart never turns a wait that just ended into one that has not.
    now = epoch(stamp(now))
    faults = obs.faults
    if rec is None:
        if not faults:
            return None, (Action.CLEAN_UP,) if obs.tainted else ()
        first = Record(Phase.SUSPECT, _reason(faults), now, now, owner, obs.gpus, faults=faults)
        return first.to(Phase.SUSPECT, now, f"fault reported: {_reason(faults)}"), ()
    if rec.phase is Phase.SUSPECT:
        if not faults:
            return None, ()
        rec = replace(rec, reason=_reason(faults), gpus=obs.gpus, faults=faults, owner=owner)
        if now - rec.started < args.confirm_after_s:
            return rec, ()
        if not room:
            if not held_by or rec.waiting == held_by:
                return rec, ()
            return replace(rec, waiting=held_by), (Action.WAIT,)
        rec = replace(rec, waiting="")
        # Our taint on a cordoned node: a cordon of ours whose record a person removed.
        owns = not obs.cordoned or obs.ours_cordon
        if obs.repeats + 1 >= args.repeat_limit:
            why = (
                f"fault number {obs.repeats + 1} on {', '.join(sorted(_where(faults)))} within "
                f"{args.repeat_window_s:.0f} s: {rec.reason}"
            )
            held = rec.to(Phase.NEEDS_HUMAN, now, why, owns_cordon=owns)
            return held, (Action.CORDON, Action.NEEDS_HUMAN)
        why = f"fault lasted {now - rec.started:.0f} s: {rec.reason}"
        # Nothing is evicted from a node that cannot be seen (its pods go by their tolerations).
        drain = obs.pods_left and NODE_SILENT not in faults
        acts = (Action.CORDON, Action.EVICT) if drain else (Action.CORDON,)
        return rec.to(Phase.DRAINING, now, why, owns_cordon=owns), acts
    if rec.phase is Phase.RELEASED:
        if not faults:
            return None, ()
        if _where(faults) - _where(rec.faults):
            fresh = Record(Phase.SUSPECT, _reason(faults), now, now, owner, obs.gpus, faults=faults)
            return fresh.to(Phase.SUSPECT, now, f"new fault: {_reason(faults)}"), ()
        return rec, ()
    # Cordoned from here on (by us, or by someone before us): an uncordon is an operator's.
    rec = replace(rec, owner=owner)
    if not obs.cordoned:
        return rec.to(Phase.RELEASED, now, "uncordoned by an operator"), (Action.RELEASE,)
    if faults:
        rec = replace(rec, reason=_reason(faults), faults=tuple(sorted({*rec.faults, *faults})))
        if rec.gpus is not None:
            wider = None if obs.gpus is None else tuple(sorted({*rec.gpus, *obs.gpus}))
            rec = replace(rec, gpus=wider)
    waited = now - max(rec.since, acting_since)
    unreachable = NODE_SILENT in faults
    if rec.phase is Phase.DRAINING:
        if unreachable and waited > args.reboot_timeout_s:
            why = f"unreachable for {waited:.0f} s (rebootTimeout)"
            return rec.to(Phase.NEEDS_HUMAN, now, why), (Action.NEEDS_HUMAN,)
        if unreachable:
            return rec, ()  # the drain, self-test and their timeouts once the node is back
        if obs.pods_left and waited > args.drain_timeout_s:
            why = (
                f"drain not finished in {waited:.0f} s (drainTimeout): {obs.pods_left} pod(s) "
                "left, kept by a PodDisruptionBudget, the circuit breaker, the eviction rate or "
                "stale telemetry (edgegpu_extender_remediation_actions_total says which)"
            )
            return rec.to(Phase.NEEDS_HUMAN, now, why), (Action.NEEDS_HUMAN,)
        if obs.pods_left:
            return rec, (Action.EVICT,)
        return rec.to(Phase.SELF_TEST, now, "drained", request=new_id()), (Action.SELF_TEST,)
    if rec.phase is Phase.SELF_TEST and unreachable:
        # An edge link down is no verdict: wait for the node rather than hand it to a human,
        # unless it keeps dropping off during its self-tests.
        if sum(w == _UNREACHABLE for _, _, w in rec.history) >= 2:
            why = "unreachable during its self-test a third time"
            return rec.to(Phase.NEEDS_HUMAN, now, why), (Action.NEEDS_HUMAN,)
        return rec.to(Phase.DRAINING, now, _UNREACHABLE), ()
    if rec.phase in (Phase.SELF_TEST, Phase.VERIFYING):
        if obs.verdict is not None and obs.verdict[0] == rec.request:
            if obs.verdict[1] == "pass" and not faults:
                if obs.cooling and waited <= args.self_test_timeout_s:
                    return rec, ()  # uncordon after the thermal cool-down, if it comes in time
                return None, (Action.UNCORDON,)  # the thermal filter keeps a hot GPU free
            why = "self-test failed" if obs.verdict[1] != "pass" else "fault outlived the self-test"
            if rec.phase is Phase.SELF_TEST:
                if not obs.boot:  # no boot id: a reboot could not be told from no reboot
                    why = f"{why}; the node reports no boot id, so a reboot cannot be verified"
                    return rec.to(Phase.NEEDS_HUMAN, now, why), (Action.NEEDS_HUMAN,)
                return rec.to(Phase.REBOOT_REQUESTED, now, why, request=new_id(), boot=obs.boot), (
                    Action.REBOOT,
                )
            return rec.to(Phase.NEEDS_HUMAN, now, f"{why} after the reboot"), (Action.NEEDS_HUMAN,)
        if waited > args.self_test_timeout_s:
            why = f"no self-test verdict in {waited:.0f} s"
            return rec.to(Phase.NEEDS_HUMAN, now, why), (Action.NEEDS_HUMAN,)
        return rec, ()
    if rec.phase is Phase.REBOOT_REQUESTED:
        if not rec.boot:  # a record decided without a boot id: any boot would look "back"
            why = "reboot asked without a boot id to tell it by"
            return rec.to(Phase.NEEDS_HUMAN, now, why), (Action.NEEDS_HUMAN,)
        if obs.boot is not None and obs.boot != rec.boot:
            why = "agent back with a new boot"
            return rec.to(Phase.VERIFYING, now, why, request=new_id()), (Action.SELF_TEST,)
        if waited > args.reboot_timeout_s:
            why = f"not back {waited:.0f} s after the reboot request"
            return rec.to(Phase.NEEDS_HUMAN, now, why), (Action.NEEDS_HUMAN,)
        return rec, ()
    return rec, ()  # needs-human: until an operator uncordons it
