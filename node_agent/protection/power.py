"""Power plans, pure: local thermal protection and power saving for one GPU.

Thermal protection: at or above maxTemp the power limit goes down one step per sample; once it
is at the floor (or cannot be set) and the GPU is still hot, the clocks are locked low too.
After the GPU has stayed under maxTemp for the cool-down, both are restored. It needs nothing
from the cloud, so it keeps working with the link down (KubeEdge edge autonomy).
Power saving: a GPU below the utilisation threshold for a whole window gets its clocks locked
low (or, without clock control, a lower power limit); load, or a high-QoS pod signalled by the
extender, restores it. Imports only ``model``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from node_agent.model import Capabilities, GpuReading, PowerAction, PowerLimits


@dataclass(frozen=True, slots=True)
class PowerArgs:
    """Settings of the planner (units in the names)."""

    max_temp_c: float = 85.0
    cool_down_s: float = 300.0
    thermal_step_fraction: float = 0.1
    """Each step lowers the limit by this share of the default limit."""
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
    low_since: float | None = None
    saving: Literal["clocks", "power"] | None = None


IDLE = GpuPowerState()


def _saving_limit(limits: PowerLimits, args: PowerArgs) -> float:
    return max(limits.min_w, round(limits.default_w * args.saving_power_fraction, 1))


def _thermal(
    state: GpuPowerState,
    reading: GpuReading,
    limits: PowerLimits | None,
    caps: Capabilities,
    now: float,
    args: PowerArgs,
) -> tuple[GpuPowerState, list[PowerAction]]:
    i = reading.index
    temp = reading.temperature_c
    actions: list[PowerAction] = []
    if temp is None:
        return state, actions
    if temp >= args.max_temp_c:
        state = dataclasses.replace(state, below_since=None)
        if state.last_step_at is not None and now - state.last_step_at < args.settle_s:
            return state, actions  # let the last step take effect first
        at_floor = True
        if caps.power_limit and limits is not None:
            current = state.thermal_cap_w
            if current is None:
                current = reading.power_limit_w or limits.default_w
            step = limits.default_w * args.thermal_step_fraction
            cap = max(limits.min_w, round(current - step, 1))
            if state.thermal_cap_w is None or cap < state.thermal_cap_w:
                actions.append(PowerAction(i, "set_power_limit", "thermal", watts=cap))
                at_floor = False
            state = dataclasses.replace(state, thermal_cap_w=cap)
        if at_floor and caps.locked_clocks and not state.thermal_clocks:
            if state.saving != "clocks":
                actions.append(
                    PowerAction(i, "lock_clocks", "thermal", clock_mhz=args.saving_clock_mhz)
                )
            state = dataclasses.replace(state, thermal_clocks=True)
        return dataclasses.replace(
            state, last_step_at=now if actions else state.last_step_at
        ), actions
    if state.thermal_cap_w is None and not state.thermal_clocks:
        return state, actions
    if state.below_since is None:
        return dataclasses.replace(state, below_since=now), actions
    if now - state.below_since < args.cool_down_s:
        return state, actions
    if state.thermal_cap_w is not None and limits is not None:
        if state.saving == "power":
            watts = _saving_limit(limits, args)
            actions.append(PowerAction(i, "set_power_limit", "power-saving", watts=watts))
        else:
            actions.append(PowerAction(i, "reset_power_limit", "thermal-restore"))
    if state.thermal_clocks and state.saving != "clocks":
        actions.append(PowerAction(i, "reset_clocks", "thermal-restore"))
    return dataclasses.replace(
        state, thermal_cap_w=None, thermal_clocks=False, below_since=None, last_step_at=None
    ), actions


def plan(
    state: GpuPowerState,
    reading: GpuReading,
    limits: PowerLimits | None,
    caps: Capabilities,
    boost: bool,
    now: float,
    args: PowerArgs,
) -> tuple[GpuPowerState, list[PowerAction]]:
    """The next state and the changes to make for one GPU. ``boost``: a high-QoS pod is here."""
    if reading.lost:
        return state, []
    i = reading.index
    state, actions = _thermal(state, reading, limits, caps, now, args)

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
