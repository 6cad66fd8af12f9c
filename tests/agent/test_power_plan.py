from node_agent.model import Capabilities, GpuReading, PowerLimits
from node_agent.protection.power import IDLE, PowerArgs, plan

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


def test_the_cap_is_restored_only_after_the_cool_down():
    state, _ = plan(IDLE, r(temp=90.0), LIMITS, ALL, False, 0.0, ARGS)
    state, actions = plan(state, r(temp=80.0), LIMITS, ALL, False, 10.0, ARGS)
    assert actions == [] and state.below_since == 10.0
    state, actions = plan(state, r(temp=80.0), LIMITS, ALL, False, 309.0, ARGS)
    assert actions == []
    state, actions = plan(state, r(temp=80.0), LIMITS, ALL, False, 310.0, ARGS)
    assert [(a.kind, a.reason) for a in actions] == [("reset_power_limit", "thermal-restore")]
    assert state.thermal_cap_w is None


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


def test_a_gpu_still_hot_at_the_power_floor_gets_its_clocks_locked_and_both_are_restored():
    state, kinds = IDLE, []
    for step in range(6):
        state, actions = plan(state, r(temp=95.0), LIMITS, ALL, False, 30.0 * step, ARGS)
        kinds += [a.kind for a in actions]
    assert kinds.count("lock_clocks") == 1 and state.thermal_clocks
    state, _ = plan(state, r(temp=70.0), LIMITS, ALL, False, 200.0, ARGS)
    state, actions = plan(state, r(temp=70.0), LIMITS, ALL, False, 500.0, ARGS)
    assert sorted(a.kind for a in actions) == ["reset_clocks", "reset_power_limit"]
    assert not state.thermal_clocks and state.thermal_cap_w is None


def test_the_next_step_waits_for_the_last_one_to_settle():
    state, first = plan(IDLE, r(temp=90.0), LIMITS, ALL, False, 0.0, ARGS)
    state, early = plan(state, r(temp=90.0), LIMITS, ALL, False, 10.0, ARGS)
    state, later = plan(state, r(temp=90.0), LIMITS, ALL, False, 30.0, ARGS)
    assert [a.watts for a in first] == [90.0] and early == [] and [a.watts for a in later] == [80.0]
