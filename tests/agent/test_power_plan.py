import math

import pytest
from hypothesis import given, strategies as st

from node_agent.model import Capabilities, GpuReading, PowerAction, PowerLimits
from node_agent.protection.power import IDLE, GpuPowerState, PowerArgs, plan

LIMITS = PowerLimits(min_w=60.0, max_w=70.0 * 2, default_w=100.0)
ALL = Capabilities(power_limit=True, locked_clocks=True)
ARGS = PowerArgs(max_temp_c=85.0, cool_down_s=300.0, window_s=60.0, threshold_pct=70.0)


def r(temp=50.0, util=80.0, limit=100.0):
    return GpuReading(
        index=0, uuid="g", temperature_c=temp, utilization_pct=util, power_limit_w=limit
    )


def test_a_hot_gpu_is_capped_step_by_step_down_to_the_minimum():
    state, caps = IDLE, []
    for step in range(6):
        state, actions = plan(state, r(temp=90.0), LIMITS, ALL, False, 30.0 * step, ARGS)
        caps += [a.watts for a in actions if a.kind == "set_power_limit"]
    assert caps == [90.0, 80.0, 70.0, 60.0]
    assert state.thermal_cap_w == 60.0


def test_an_idle_gpu_locks_low_clocks_after_the_window_and_restores_on_load():
    state, actions = plan(IDLE, r(util=10.0), LIMITS, ALL, False, 0.0, ARGS)
    assert actions == []
    state, actions = plan(state, r(util=10.0), LIMITS, ALL, False, 60.0, ARGS)
    assert [(a.kind, a.clock_mhz) for a in actions] == [("lock_clocks", 800.0)]
    state, actions = plan(state, r(util=95.0), LIMITS, ALL, False, 65.0, ARGS)
    assert [(a.kind, a.reason) for a in actions] == [("reset_clocks", "load")]


def test_a_high_qos_pod_signalled_by_the_extender_restores_clocks():
    state, _ = plan(IDLE, r(util=5.0), LIMITS, ALL, False, 0.0, ARGS)
    state, _ = plan(state, r(util=5.0), LIMITS, ALL, False, 61.0, ARGS)
    state, actions = plan(state, r(util=5.0), LIMITS, ALL, True, 62.0, ARGS)
    assert [(a.kind, a.reason) for a in actions] == [("reset_clocks", "boost")]


def test_without_clock_control_power_saving_lowers_the_limit_instead():
    caps = Capabilities(power_limit=True)
    state, _ = plan(IDLE, r(util=5.0), LIMITS, caps, False, 0.0, ARGS)
    state, actions = plan(state, r(util=5.0), LIMITS, caps, False, 60.0, ARGS)
    assert [(a.kind, a.watts) for a in actions] == [("set_power_limit", 60.0)]
    assert state.saving == "power"


def test_nothing_is_planned_for_a_gpu_without_controls():
    state, actions = plan(IDLE, r(temp=95.0, util=1.0), None, Capabilities(), False, 0.0, ARGS)
    state, actions2 = plan(state, r(temp=95.0, util=1.0), None, Capabilities(), False, 100.0, ARGS)
    assert actions == [] and actions2 == []


def test_unknown_readings_plan_nothing():
    state, actions = plan(IDLE, GpuReading(index=0, uuid="g"), LIMITS, ALL, False, 0.0, ARGS)
    assert actions == [] and state == IDLE


def test_the_next_step_waits_for_the_last_one_to_settle():
    state, first = plan(IDLE, r(temp=90.0), LIMITS, ALL, False, 0.0, ARGS)
    state, early = plan(state, r(temp=90.0), LIMITS, ALL, False, 10.0, ARGS)
    state, later = plan(state, r(temp=90.0), LIMITS, ALL, False, 30.0, ARGS)
    assert [a.watts for a in first] == [90.0] and early == [] and [a.watts for a in later] == [80.0]


def walk(temps, state=IDLE, start=0.0, caps=ALL, util=80.0, every_s=30.0):
    """Plan one reading per ``every_s`` at each temperature; the state and every action."""
    out: list[PowerAction] = []
    for k, temp in enumerate(temps):
        state, actions = plan(state, r(temp=temp, util=util), LIMITS, caps, False,
                              start + every_s * k, ARGS)  # fmt: skip
        out += actions
    return state, out


def steps(actions):
    return [(a.kind, a.reason, a.watts) for a in actions]


def test_a_gpu_below_max_temp_by_the_margin_gets_its_power_back_one_step_per_settle():
    capped, _ = walk([90.0] * 4)
    assert capped.thermal_cap_w == 60.0
    state, actions = walk([79.0] * 5, capped, start=120.0)
    assert steps(actions) == [
        ("set_power_limit", "thermal-restore", 70.0),
        ("set_power_limit", "thermal-restore", 80.0),
        ("set_power_limit", "thermal-restore", 90.0),
        ("reset_power_limit", "thermal-restore", None),
    ]
    assert state.thermal_cap_w is None


def test_a_gpu_held_just_under_max_temp_by_its_cap_keeps_it_until_the_cool_down_ends():
    capped, _ = walk([90.0, 90.0])
    assert capped.thermal_cap_w == 80.0
    held, actions = walk([82.0] * 10, capped, start=60.0)  # 60 s … 330 s: under 300 s below
    assert actions == [] and held.thermal_cap_w == 80.0
    _, actions = walk([82.0], held, start=360.0)
    assert steps(actions) == [("set_power_limit", "thermal-restore", 90.0)]


def test_a_step_given_back_that_heats_the_gpu_to_max_temp_again_is_taken_back():
    capped, _ = walk([90.0, 90.0])
    state, actions = walk([79.0, 86.0, 83.0, 83.0], capped, start=60.0)
    assert steps(actions) == [
        ("set_power_limit", "thermal-restore", 90.0),
        ("set_power_limit", "thermal", 80.0),
    ]
    assert state.thermal_cap_w == 80.0


def test_the_cap_waits_for_the_last_step_to_settle_before_giving_power_back():
    capped, _ = walk([90.0])
    state, early = plan(capped, r(temp=70.0), LIMITS, ALL, False, 10.0, ARGS)
    state, later = plan(state, r(temp=70.0), LIMITS, ALL, False, 30.0, ARGS)
    assert early == [] and steps(later) == [("reset_power_limit", "thermal-restore", None)]


def test_locked_clocks_are_the_last_step_down_and_the_first_given_back():
    hot, down = walk([95.0] * 6)
    assert [a.kind for a in down][-1] == "lock_clocks" and hot.thermal_clocks
    assert [a.kind for a in down].count("lock_clocks") == 1
    state, up = walk([70.0] * 6, hot, start=180.0)
    assert steps(up) == [
        ("reset_clocks", "thermal-restore", None),
        ("set_power_limit", "thermal-restore", 70.0),
        ("set_power_limit", "thermal-restore", 80.0),
        ("set_power_limit", "thermal-restore", 90.0),
        ("reset_power_limit", "thermal-restore", None),
    ]
    assert state.thermal_cap_w is None and not state.thermal_clocks


def test_a_gpu_without_a_settable_power_limit_goes_straight_to_locked_clocks_and_back():
    clocks_only = Capabilities(locked_clocks=True)
    hot, down = walk([90.0], caps=clocks_only)
    state, up = walk([75.0], hot, start=30.0, caps=clocks_only)
    assert [a.kind for a in down] == ["lock_clocks"] and [a.kind for a in up] == ["reset_clocks"]
    assert state.thermal_cap_w is None and not state.thermal_clocks


def test_clocks_power_saving_locked_stay_locked_when_the_thermal_lock_is_given_back():
    clocks_only = Capabilities(locked_clocks=True)
    saving, _ = walk([60.0, 60.0, 60.0], util=10.0, caps=clocks_only)
    assert saving.saving == "clocks"
    hot, down = walk([90.0], saving, start=90.0, util=10.0, caps=clocks_only)
    state, up = walk([70.0], hot, start=120.0, util=10.0, caps=clocks_only)
    assert down == [] and up == [] and hot.thermal_clocks
    assert state.saving == "clocks" and not state.thermal_clocks


def test_a_gpu_saving_power_by_its_limit_is_given_back_the_saving_limit_not_the_default():
    limit_only = Capabilities(power_limit=True)
    low = PowerLimits(min_w=30.0, max_w=100.0, default_w=100.0)

    def at(state, temp, now):
        reading = r(temp=temp, util=10.0, limit=state.thermal_cap_w or 60.0)
        return plan(state, reading, low, limit_only, False, now, ARGS)

    state, _ = at(IDLE, 60.0, 0.0)
    state, saving = at(state, 60.0, 60.0)
    assert steps(saving) == [("set_power_limit", "power-saving", 60.0)]
    state, down = at(state, 90.0, 90.0)
    state, up = at(state, 70.0, 120.0)
    state, back = at(state, 70.0, 150.0)
    assert steps(down) == [("set_power_limit", "thermal", 50.0)]
    assert steps(up + back) == [("set_power_limit", "power-saving", 60.0)]
    assert state.saving == "power" and state.thermal_cap_w is None and back == []


@given(
    temps=st.lists(st.one_of(st.none(), st.floats(-40.0, 150.0), st.sampled_from([math.nan, math.inf])),
                   max_size=60),
    gaps=st.lists(st.floats(0.0, 400.0), min_size=60, max_size=60),
    utils=st.lists(st.floats(0.0, 100.0), min_size=60, max_size=60),
    caps=st.sampled_from([ALL, Capabilities(power_limit=True), Capabilities(locked_clocks=True),
                          Capabilities()]),
    boost=st.booleans(),
)  # fmt: skip
def test_every_limit_planned_lies_between_the_minimum_and_the_default_whatever_the_readings(
    temps, gaps, utils, caps, boost
):
    state, now = GpuPowerState(), 0.0
    for temp, gap, util in zip(temps, gaps, utils, strict=False):
        now += gap
        reading = GpuReading(index=0, uuid="g", temperature_c=temp, utilization_pct=util,
                             power_limit_w=state.thermal_cap_w or 100.0)  # fmt: skip
        state, actions = plan(state, reading, LIMITS, caps, boost, now, ARGS)
        for a in actions:
            assert a.watts is None or LIMITS.min_w <= a.watts <= LIMITS.default_w
            assert a.kind != "set_power_limit" or caps.power_limit
            assert "clocks" not in a.kind or caps.locked_clocks
        cap = state.thermal_cap_w
        assert cap is None or LIMITS.min_w <= cap <= LIMITS.default_w


def test_a_cool_gpu_gets_every_thermal_step_back_however_deep_it_was_capped():
    hot, _ = walk([99.0] * 10)
    state, _ = walk([50.0] * 10, hot, start=300.0)
    assert state.thermal_cap_w is None and not state.thermal_clocks


@pytest.mark.parametrize("unknown", [math.nan, math.inf, -math.inf, None])
def test_a_nan_or_infinite_temperature_holds_the_cap_like_an_unknown_one(unknown):
    capped, _ = walk([90.0, 90.0])
    held, actions = walk([unknown] * 20, capped, start=60.0)  # ten minutes of unknown
    assert actions == [] and held == capped
    state, actions = walk([unknown] * 3)
    assert actions == [] and state == IDLE


def test_within_the_margin_each_step_given_back_starts_the_hold_again():
    state, _ = walk([90.0] * 3)
    assert state.thermal_cap_w == 70.0
    given = []
    for k in range(30):  # 90 s … 960 s, all within the margin
        now = 90.0 + 30.0 * k
        state, actions = plan(state, r(temp=82.0), LIMITS, ALL, False, now, ARGS)
        given += [(now, a.watts) for a in actions]
    assert given == [(390.0, 80.0), (690.0, 90.0)]  # a whole cool-down apart, not a settle


def test_a_step_given_back_that_heats_the_gpu_to_max_temp_waits_for_a_full_cool_down():
    capped, _ = walk([90.0, 90.0])
    state, actions = walk([79.0, 86.0], capped, start=60.0)
    assert steps(actions) == [
        ("set_power_limit", "thermal-restore", 90.0),
        ("set_power_limit", "thermal", 80.0),
    ]
    held, actions = walk([83.0] * 40, state, start=120.0)  # 20 minutes within the margin
    assert actions == [] and held.thermal_cap_w == 80.0
    cooled, actions = walk([79.0] * 10, held, start=1320.0)  # 1320 s … 1590 s under the margin
    assert actions == [] and cooled.thermal_cap_w == 80.0
    _, actions = walk([79.0], cooled, start=1620.0)  # 300 s under the margin
    assert steps(actions) == [("set_power_limit", "thermal-restore", 90.0)]


def test_a_gpu_that_heats_with_each_step_given_back_reaches_max_temp_again_at_most_once():
    """A GPU that settles at 40 °C + 0.5 °C/W of its limit, a third of the way per 30 s: it
    sits within the margin at 80 W and reaches maxTemp at 90 W."""
    state, temp, cap, again = IDLE, 90.0, 100.0, 0
    for k in range(240):  # two hours
        hot = temp >= ARGS.max_temp_c
        state, actions = plan(state, r(temp=temp, limit=cap), LIMITS, ALL, False, 30.0 * k, ARGS)
        for a in actions:
            cap = a.watts if a.kind == "set_power_limit" and a.watts else cap
            cap = 100.0 if a.kind == "reset_power_limit" else cap
        temp += (40.0 + 0.5 * cap - temp) / 3.0
        again += not hot and temp >= ARGS.max_temp_c
    assert again <= 1 and state.thermal_cap_w == 80.0


def test_limits_unreadable_for_a_round_hold_the_cap_instead_of_resetting_it():
    capped, _ = walk([90.0, 90.0])
    held, actions = plan(capped, r(temp=70.0, limit=80.0), None, ALL, False, 60.0, ARGS)
    assert actions == [] and held.thermal_cap_w == 80.0
    _, actions = plan(held, r(temp=70.0, limit=80.0), LIMITS, ALL, False, 65.0, ARGS)
    assert steps(actions) == [("set_power_limit", "thermal-restore", 90.0)]


def test_locked_clocks_are_given_back_even_when_the_limits_cannot_be_read():
    hot, _ = walk([95.0] * 6)
    assert hot.thermal_clocks
    state, actions = plan(hot, r(temp=70.0, limit=60.0), None, ALL, False, 180.0, ARGS)
    assert steps(actions) == [("reset_clocks", "thermal-restore", None)]
    assert not state.thermal_clocks and state.thermal_cap_w == 60.0


def test_a_limit_found_below_the_default_after_a_restart_is_left_until_the_next_hot_reading():
    state, actions = IDLE, []
    for k in range(20):  # ten minutes cool, at a limit some earlier run (or an operator) set
        state, more = plan(state, r(temp=60.0, limit=70.0), LIMITS, ALL, False, 30.0 * k, ARGS)
        actions += more
    assert actions == [] and state.thermal_cap_w is None
    _, actions = plan(state, r(temp=90.0, limit=70.0), LIMITS, ALL, False, 600.0, ARGS)
    assert steps(actions) == [("set_power_limit", "thermal", 60.0)]
