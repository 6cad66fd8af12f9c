"""What the fault loop writes on a Node and reads back from it, pure.

The record and repeat-history annotations, our taint (which says whether we cordoned), the
state label and the ``EdgeGPUHealthy`` condition: Node objects (plain dicts) in, merge patches
out.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from scheduler_extender.k8s.client import JsonDict
from scheduler_extender.names import (
    HEALTH_CONDITION,
    MAINTENANCE_TAINT,
    MANAGED_RESOURCES,
    REMEDIATION_ANNOTATION,
    REMEDIATION_HISTORY_ANNOTATION,
    REMEDIATION_OPT_OUT,
    REMEDIATION_STATE_LABEL,
    UNHEALTHY_TAINT,
)
from scheduler_extender.remediation.faults import (
    Action,
    History,
    Phase,
    Record,
    history_from_json,
    history_to_json,
    places,
    remember,
)

OWNS_CORDON = "cordoned"
"""Our taint's value when we set ``spec.unschedulable`` (and may lift it)."""

EVENT_REASON = {
    Action.CORDON: "EdgeGPUCordoned",
    Action.SELF_TEST: "EdgeGPUSelfTestRequested",
    Action.REBOOT: "EdgeGPURebootRequested",
    Action.UNCORDON: "EdgeGPUUncordoned",
    Action.RELEASE: "EdgeGPUReleased",
    Action.NEEDS_HUMAN: "EdgeGPUNeedsHuman",
    Action.WAIT: "EdgeGPUWaiting",
    Action.CLEAN_UP: "EdgeGPURecordCleanedUp",
}
"""The reason of the Event each action of the fault loop records on the node."""

_CONDITION_REASON = {
    Phase.DRAINING: "Draining",
    Phase.SELF_TEST: "SelfTest",
    Phase.REBOOT_REQUESTED: "RebootRequested",
    Phase.VERIFYING: "Verifying",
    Phase.NEEDS_HUMAN: "NeedsHuman",
    Phase.RELEASED: "ReleasedByOperator",
}


def stamp(wall: float) -> str:
    """RFC 3339 seconds, as Events, taints and conditions carry them."""
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stamp_precise(wall: float) -> str:
    """RFC 3339 with microseconds, as the records and the breaker's ledger keep times."""
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def annotation(node: JsonDict, key: str = REMEDIATION_ANNOTATION) -> str | None:
    """One annotation of a Node object (None when absent)."""
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(key)
    return None if value is None else str(value)


def opted_out(node: JsonDict) -> bool:
    """Whether the node carries the opt-out label ``edgegpu.io/remediation=disabled``."""
    return ((node.get("metadata") or {}).get("labels") or {}).get(REMEDIATION_OPT_OUT) == "disabled"


def _taints(node: JsonDict) -> list[JsonDict]:
    return list((node.get("spec") or {}).get("taints") or [])


def our_taint(node: JsonDict) -> JsonDict | None:
    """Our taint on the node, if there."""
    return next((dict(t) for t in _taints(node) if t.get("key") == UNHEALTHY_TAINT), None)


def maintenance_taint(node: JsonDict) -> JsonDict | None:
    """The taint of the GPU maintenance holding the node, if there (its value names it)."""
    return next((dict(t) for t in _taints(node) if t.get("key") == MAINTENANCE_TAINT), None)


def decided_on(node: JsonDict) -> tuple[Any, ...]:
    """What of a node a remediation decision reads.

    Our record, the cordon, our taints, the opt-out label and the repeat history.
    """
    unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
    return (
        annotation(node),
        unschedulable,
        our_taint(node),
        maintenance_taint(node),
        opted_out(node),
        annotation(node, REMEDIATION_HISTORY_ANNOTATION),
    )


def history(node: JsonDict) -> History:
    """The node's repeat history."""
    return history_from_json(annotation(node, REMEDIATION_HISTORY_ANNOTATION))


def record_text(rec: Record | None) -> str | None:
    """The annotation a record is written as (None: no annotation).

    A suspect is written only once something holds it back.
    """
    if rec is None or (rec.phase is Phase.SUSPECT and not rec.waiting):
        return None
    return orjson.dumps(rec.to_json()).decode()


def written_fields(rec: Record | None) -> tuple[Any, ...] | None:
    """What of a record is worth a node write: all but the wording and the owner."""
    if rec is None:
        return None
    return (
        rec.phase, rec.since, rec.gpus, rec.owns_cordon, rec.request, rec.boot, rec.faults,
        rec.waiting,
    )  # fmt: skip


def node_patch(
    rec: Record | None,
    writes: Collection[Action],
    *,
    owns: bool,
    ours_cordon: bool,
    wall: float,
    window_s: float,
) -> Callable[[JsonDict], JsonDict]:
    """The merge patch that takes a node to ``rec`` and the ``writes`` (the record's actions).

    A function of the node as it is, so that it is built again from a fresh copy after a
    conflict. ``owns``: the record's cordon is ours; ``ours_cordon``: our taint says so (what
    a clean-up without a record goes by).
    """
    text = record_text(rec)
    cordon = Action.CORDON in writes
    lift = {Action.UNCORDON, Action.RELEASE, Action.CLEAN_UP} & set(writes)
    uncordon = (Action.CLEAN_UP in writes and ours_cordon) or (Action.UNCORDON in writes and owns)

    def build(node: JsonDict) -> JsonDict:
        annotations: JsonDict = {REMEDIATION_ANNOTATION: text}
        labels = {REMEDIATION_STATE_LABEL: rec.phase.value if text and rec else None}
        if cordon and rec is not None:
            seen = remember(history(node), places(rec.faults), wall, window_s)
            annotations[REMEDIATION_HISTORY_ANNOTATION] = history_to_json(seen)
        patch: JsonDict = {"metadata": {"annotations": annotations, "labels": labels}}
        if cordon or lift:
            taints = [t for t in _taints(node) if t.get("key") != UNHEALTHY_TAINT]
            spec: JsonDict = {"taints": taints}
            if cordon:
                value = OWNS_CORDON if owns else ""
                taints.append({"key": UNHEALTHY_TAINT, "effect": "NoSchedule", "value": value,
                               "timeAdded": stamp(wall)})  # fmt: skip
                if owns:
                    spec["unschedulable"] = True
            elif uncordon:
                spec["unschedulable"] = None
            patch["spec"] = spec
        return patch

    return build


def condition(rec: Record | None, wall: float) -> JsonDict:
    """The node condition ``EdgeGPUHealthy`` that ``kubectl describe node`` shows."""
    at = stamp(wall)
    if rec is not None and rec.phase is Phase.SUSPECT and rec.waiting:
        return {
            "type": HEALTH_CONDITION,
            "status": "False",
            "reason": "WaitingToBeRemediated",
            "message": f"fault confirmed, held back by the {rec.waiting}: {rec.reason}",
            "lastHeartbeatTime": at,
            "lastTransitionTime": at,
        }
    healthy = rec is None or rec.phase is Phase.SUSPECT
    return {
        "type": HEALTH_CONDITION,
        "status": "True" if healthy else "False",
        "reason": "GPUsHealthy" if healthy or rec is None else _CONDITION_REASON[rec.phase],
        "message": "no GPU fault" if healthy or rec is None else f"{rec.phase}: {rec.reason}",
        "lastHeartbeatTime": at,
        "lastTransitionTime": at,
    }


def gpu_nodes(nodes: Mapping[str, JsonDict]) -> set[str]:
    """Nodes that advertise GPUs (a node silent since before our start is still seen)."""
    out = set()
    for name, node in nodes.items():
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        if any(str(allocatable.get(r, "0")) not in ("0", "") for r in MANAGED_RESOURCES):
            out.add(name)
    return out
