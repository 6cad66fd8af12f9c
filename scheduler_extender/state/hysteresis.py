"""The thermal state of a node's GPUs after a report: the policy's hysteresis step per GPU.

Worked out before the report is stored (``TelemetryStore.put`` keeps it with the report), so
the store holds reports and the policy step stays in the state layer. Imports the policy's
thermal rule and the telemetry store's record; no I/O.
"""

from __future__ import annotations

import logging
import math

from scheduler_extender.policy.rules import thermal
from scheduler_extender.telemetry.store import NodeRecord, Received


def advance(
    previous: NodeRecord | None, push: Received, now: float, args: thermal.ThermalArgs
) -> dict[str, thermal.ThermalState]:
    """Each GPU's state after ``push``, from the node's ``previous`` record.

    State advances per GPU uuid, so that a GPU keeps its cool-down across re-indexing; a GPU
    reported under a new uuid at the index of one that was hot or cooling takes that one's
    state, and a GPU a report leaves out keeps its state until its cool-down is over (neither
    a new uuid nor a report without it ends a cool-down). A GPU with no state (after the
    extender's restart, or a report it missed) takes the agent's word for when it was last hot
    (``hot_s_ago``, counted from no higher a temperature than ``maxTemp``). COOL GPUs are left
    out.
    """
    d = push.digest
    states = previous.thermal if previous is not None else {}
    new_states: dict[str, thermal.ThermalState] = {}
    max_c = args.max_temp_c
    temps = d.column("temperature_c")  # NaN: not read
    report = push.report
    threshold = report.hot_threshold_c
    hints = (
        {
            g.uuid: g.hot_s_ago
            for g in report.gpus
            if g.hot_s_ago is not None and g.hot_s_ago < args.cool_down_s
        }
        if threshold is not None and threshold <= max_c
        else {}
    )
    if not (states or hints or any(t >= max_c for t in temps)):
        return new_states
    was_at: dict[float, str] = {}
    if states and previous is not None:
        was_at = dict(zip(previous.digest.column("index"), previous.digest.uuids, strict=True))
    taken: set[str] = set()
    for uuid, index, temp in zip(d.uuids, d.column("index"), temps, strict=True):
        state = states.get(uuid)
        old = was_at.get(index)
        if state is None and old is not None and old not in d.uuids:
            state = states.get(old)  # the same slot under a new uuid
            taken.add(old)
        if state is None and uuid in hints:
            state = thermal.ThermalState(below_since=now - hints[uuid])  # ends, or not
        state = state or thermal.COOL
        if state is thermal.COOL and not temp >= max_c:
            continue  # never hot and not hot now: the step would keep it COOL
        state = thermal.step(state, None if math.isnan(temp) else temp, now, args)
        if state is not thermal.COOL:
            new_states[uuid] = state
    for uuid, state in states.items():
        if uuid in new_states or uuid in taken or uuid in d.uuids:
            continue
        if thermal.hot_or_cooling(state, now, args):
            new_states[uuid] = state  # left out of this report: kept
    return new_states


def _phase(state: thermal.ThermalState | None, at: float, args: thermal.ThermalArgs) -> str:
    if state is None or state is thermal.COOL:
        return "ok"
    if state.hot_since is not None:
        return "hot"
    return "cooling" if thermal.hot_or_cooling(state, at, args) else "ok"


def transitions(
    previous: NodeRecord | None, record: NodeRecord, now: float, args: thermal.ThermalArgs
) -> list[tuple[int, str]]:
    """What changed for the node's GPUs with its new ``record``, as (log level, message).

    Once per transition of a GPU to hot, cooling down, cool again, unhealthy or healthy again.
    The phase before is the one at the previous report's arrival, so that a cool-down that
    ended between two reports is said at the next one. Nothing for a node's first report.
    """
    if previous is None:
        return []
    node = record.report.node
    out: list[tuple[int, str]] = []
    was_health = {g.uuid: g for g in previous.report.gpus}
    for g in record.report.gpus:
        name = f"node {node} gpu {g.index} ({g.uuid})"
        before = _phase(previous.thermal.get(g.uuid), previous.received_at, args)
        after = _phase(record.thermal.get(g.uuid), now, args)
        if before != after:
            if after == "hot":
                temp = f"{g.temperature_c:.0f} °C" if g.temperature_c is not None else "hot"
                limit = f"maxTemp {args.max_temp_c:g} °C"
                # Back from a cool-down: debug (a GPU held at maxTemp crosses it again and again).
                level = logging.WARNING if before == "ok" else logging.DEBUG
                out.append((level, f"{name}: {temp}, at or above {limit}: takes no new pods"))
            elif after == "cooling":
                cooling = f"{name}: below maxTemp, cooling down for {args.cool_down_s:g} s"
                out.append((logging.INFO, cooling))
            else:
                out.append((logging.INFO, f"{name}: cool again: takes pods"))
        old = was_health.get(g.uuid)
        if old is not None and old.health != g.health:
            if g.health == "unhealthy":
                why = ", ".join(g.health_reasons) or "no reason given"
                out.append((logging.WARNING, f"{name}: unhealthy ({why}): takes no new pods"))
            elif old.health == "unhealthy":
                again = (
                    "healthy again" if g.health == "healthy" else f"{g.health}, no longer unhealthy"
                )
                out.append((logging.INFO, f"{name}: {again}"))
    return out
