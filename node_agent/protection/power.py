"""Power plans, pure: local thermal protection and power saving for one GPU.

Thermal protection: at or above maxTemp the power limit goes down one step per settle; once it
is at the floor (or cannot be set) and the GPU is still hot, the clocks are locked low too.
Below maxTemp by the release margin the same steps are undone one per settle, clocks first; in
between the cap holds for the cool-down, and each step given back starts the hold again. A step
given back that heats the GPU to maxTemp again is taken back, and nothing more is given back
before a whole cool-down under the margin. An unknown temperature (none, NaN, infinite) holds
whatever is in force, and so do limits that cannot be read this round. It needs nothing from the
cloud, so it keeps working with the link down (KubeEdge edge autonomy).
Power saving: a GPU below the utilisation threshold for a whole window gets its clocks locked
low (or, without clock control, a lower power limit); load, or a high-QoS pod signalled by the
extender, restores it. Imports only ``model``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from node_agent.model import Capabilities, GpuReading, PowerAction, PowerLimits


@dataclass(frozen=True, slots=True)
class PowerArgs:
    """Settings of the planner (units in the names)."""

    max_temp_c: float = 85.0
    cool_down_s: float = 300.0
    """How long a cap holds once the GPU is under maxTemp but within the release margin: then
    one step is given back and the hold starts again. After a step given back heated the GPU to
    maxTemp again (it is taken back), the GPU must read under the margin this long before the
    next step."""
    release_margin_c: float = 5.0
    """Hysteresis: power is given back while the GPU reads this far under maxTemp, so a GPU
    held just under it by its cap keeps the cap."""
    thermal_step_fraction: float = 0.1
    """Each step lowers (or gives back) the limit by this share of the default limit."""
    settle_s: float = 30.0
    """Wait this long after a step before the next: a GPU's temperature lags its power."""
    saving_enabled: bool = True
    threshold_pct: float = 70.0
    window_s: float = 60.0
    saving_clock_mhz: float = 800.0
    saving_power_fraction: float = 0.6
    """Power limit while saving, as a share of the default, where clocks cannot be locked."""


@dataclass(frozen=True, slots=True)
class GpuPowerState:
    """What the planner has done to one GPU and since when."""

    thermal_cap_w: float | None = None
    thermal_clocks: bool = False
    """Clocks locked low because the power limit alone could not cool the GPU."""
    last_step_at: float | None = None
    below_since: float | None = None
    """Under maxTemp since, or since the last step given back (the hold restarts with each)."""
    cool_since: float | None = None
    """Under maxTemp by the release margin since (continuously)."""
    gave_back_at: float | None = None
    """When the last step was given back; cleared by the next reading at maxTemp."""
    backoff: bool = False
    """A step given back heated the GPU to maxTemp: nothing more is given back before a whole
    cool-down under the release margin."""
    low_since: float | None = None
    saving: Literal["clocks", "power"] | None = None


IDLE = GpuPowerState()


def _saving_limit(limits: PowerLimits, args: PowerArgs) -> float:
    return max(limits.min_w, round(limits.default_w * args.saving_power_fraction, 1))


def plan_thermal(
    state: GpuPowerState,
    reading: GpuReading,
    limits: PowerLimits | None,
    caps: Capabilities,
    now: float,
    args: PowerArgs,
) -> tuple[GpuPowerState, list[PowerAction]]:
    """The thermal rule's next state and changes for one GPU (``plan``'s first part)."""
    temp = reading.temperature_c
    if reading.lost or temp is None or not math.isfinite(temp):
        return state, []  # unknown (NaN and ±inf too): hold whatever is in force
    if temp >= args.max_temp_c:
        gave_back = state.gave_back_at is not None and now - state.gave_back_at < max(
            args.cool_down_s, args.settle_s
        )
        state = dataclasses.replace(
            state,
            below_since=None,
            cool_since=None,
            gave_back_at=None,
            backoff=state.backoff or gave_back,  # that step heated it: back off
        )
        if state.last_step_at is not None and now - state.last_step_at < args.settle_s:
            return state, []  # let the last step take effect first
        state, actions = _step_down(state, reading, limits, caps, args)
        return dataclasses.replace(
            state, last_step_at=now if actions else state.last_step_at
        ), actions
    cool = temp < args.max_temp_c - args.release_margin_c
    cool_since = (state.cool_since if state.cool_since is not None else now) if cool else None
    if state.thermal_cap_w is None and not state.thermal_clocks:
        return dataclasses.replace(state, below_since=None, cool_since=None, backoff=False), []
    below_since = state.below_since if state.below_since is not None else now
    state = dataclasses.replace(state, below_since=below_since, cool_since=cool_since)
    if state.backoff:
        if cool_since is None or now - cool_since < args.cool_down_s:
            return state, []  # a step given back heated it to maxTemp: a full cool-down first
    elif not cool and now - below_since < args.cool_down_s:
        return state, []  # within the margin: hold the cap
    if state.last_step_at is not None and now - state.last_step_at < args.settle_s:
        return state, []
    stepped, actions = _step_up(state, reading.index, limits, caps, args)
    if stepped is state:
        return state, []  # nothing could be given back this round: hold
    # the hold starts again: within the margin the next step waits a whole cool-down
    return dataclasses.replace(
        stepped,
        last_step_at=now,
        gave_back_at=now,
        below_since=now if stepped.below_since is not None else None,
        backoff=False,
    ), actions


def _step_down(
    state: GpuPowerState,
    reading: GpuReading,
    limits: PowerLimits | None,
    caps: Capabilities,
    args: PowerArgs,
) -> tuple[GpuPowerState, list[PowerAction]]:
    """One step of protection: the power limit a step lower, or at its floor the clocks locked."""
    i = reading.index
    if caps.power_limit and limits is not None:
        first = state.thermal_cap_w is None
        current = state.thermal_cap_w
        if current is None:
            current = reading.power_limit_w or limits.default_w
        lowered = round(
            min(current, limits.default_w) - limits.default_w * args.thermal_step_fraction, 1
        )
        cap = max(limits.min_w, lowered)
        state = dataclasses.replace(state, thermal_cap_w=cap)
        if first or cap < current:
            return state, [PowerAction(i, "set_power_limit", "thermal", watts=cap)]
    if not caps.locked_clocks or state.thermal_clocks:
        return state, []
    state = dataclasses.replace(state, thermal_clocks=True)
    if state.saving == "clocks":
        return state, []  # already locked as low by power saving
    return state, [PowerAction(i, "lock_clocks", "thermal", clock_mhz=args.saving_clock_mhz)]


def _step_up(
    state: GpuPowerState,
    index: int,
    limits: PowerLimits | None,
    caps: Capabilities,
    args: PowerArgs,
) -> tuple[GpuPowerState, list[PowerAction]]:
    """One step of giving back, the steps down in reverse.

    First the clocks, then the power limit a step higher; the last step ends at the default
    limit (or power saving's).
    """
    if state.thermal_clocks:
        state = dataclasses.replace(state, thermal_clocks=False)
        if state.saving == "clocks":
            return state, []  # power saving keeps them locked
        return state, [PowerAction(index, "reset_clocks", "thermal-restore")]
    cap = state.thermal_cap_w
    if cap is None:
        return state, []
    if limits is None and caps.power_limit:
        return state, []  # the limits could not be read this round: hold, try next round
    if limits is not None:
        target = _saving_limit(limits, args) if state.saving == "power" else limits.default_w
        raised = round(cap + limits.default_w * args.thermal_step_fraction, 1)
        if raised < target:
            action = PowerAction(index, "set_power_limit", "thermal-restore", watts=raised)
            return dataclasses.replace(state, thermal_cap_w=raised), [action]
    done = dataclasses.replace(state, thermal_cap_w=None, below_since=None)
    if limits is not None and state.saving == "power":
        watts = _saving_limit(limits, args)
        return done, [PowerAction(index, "set_power_limit", "power-saving", watts=watts)]
    if limits is None:
        return done, []  # the limit can no longer be set: nothing to give back through
    return done, [PowerAction(index, "reset_power_limit", "thermal-restore")]


def plan(
    state: GpuPowerState,
    reading: GpuReading,
    limits: PowerLimits | None,
    caps: Capabilities,
    boost: bool,
    now: float,
    args: PowerArgs,
) -> tuple[GpuPowerState, list[PowerAction]]:
    """The next state and the changes to make for one GPU. ``boost``: a high-QoS pod is here.

    The thermal rule (``plan_thermal``), then power saving (``plan_saving``) on its state: one
    that applies the changes and keeps each part's state only where its changes took effect
    calls the two in turn.
    """
    state, actions = plan_thermal(state, reading, limits, caps, now, args)
    state, saving = plan_saving(
        state, reading, boost=boost, limits=limits, caps=caps, now=now, args=args
    )
    return state, actions + saving


def plan_saving(
    state: GpuPowerState,
    reading: GpuReading,
    *,
    boost: bool,
    limits: PowerLimits | None,
    caps: Capabilities,
    now: float,
    args: PowerArgs,
) -> tuple[GpuPowerState, list[PowerAction]]:
    """Power saving's next state and changes for one GPU (``plan``'s second part)."""
    if reading.lost:
        return state, []
    i = reading.index
    actions: list[PowerAction] = []
    util = reading.utilization_pct
    if not args.saving_enabled:
        if state.saving is not None:
            state, restore = _restore(state, i, "power-saving-off")
            actions.extend(restore)
        return state, actions
    if util is None:
        return state, actions
    if util >= args.threshold_pct or boost:
        state = dataclasses.replace(state, low_since=None)
        if state.saving is not None:
            state, restore = _restore(state, i, "boost" if boost else "load")
            actions.extend(restore)
        return state, actions
    low_since = state.low_since if state.low_since is not None else now
    state = dataclasses.replace(state, low_since=low_since)
    if state.saving is None and now - low_since >= args.window_s:
        if caps.locked_clocks:
            if not state.thermal_clocks:
                mhz = args.saving_clock_mhz
                actions.append(PowerAction(i, "lock_clocks", "power-saving", clock_mhz=mhz))
            state = dataclasses.replace(state, saving="clocks")
        elif caps.power_limit and limits is not None and state.thermal_cap_w is None:
            watts = _saving_limit(limits, args)
            actions.append(PowerAction(i, "set_power_limit", "power-saving", watts=watts))
            state = dataclasses.replace(state, saving="power")
    return state, actions


def _restore(state: GpuPowerState, index: int, why: str) -> tuple[GpuPowerState, list[PowerAction]]:
    actions: list[PowerAction] = []
    if state.saving == "clocks" and not state.thermal_clocks:
        actions.append(PowerAction(index, "reset_clocks", why))
    elif state.saving == "power" and state.thermal_cap_w is None:
        actions.append(PowerAction(index, "reset_power_limit", why))
    return dataclasses.replace(state, saving=None), actions


def undo_saving(state: GpuPowerState, index: int) -> list[PowerAction]:
    """What to undo at shutdown: power saving only; thermal protection stays (the GPU is hot)."""
    return _restore(state, index, "shutdown")[1]
