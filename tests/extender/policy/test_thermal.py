import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from scheduler_extender.policy.rules import thermal
from scheduler_extender.policy.rules.thermal import COOL, ThermalArgs, ThermalState
from scheduler_extender.state.hysteresis import advance, transitions
from scheduler_extender.telemetry.decode import report_from
from scheduler_extender.telemetry.store import Received, TelemetryStore
from tests.builders import gpu, report

ARGS = ThermalArgs.model_validate({"maxTemp": 85, "coolDownPeriod": "5m"})


@pytest.mark.parametrize(
    ("state", "temperature", "now", "expected"),
    [
        pytest.param(COOL, 60.0, 10.0, COOL, id="a cool gpu stays cool"),
        pytest.param(
            COOL,
            85.0,
            10.0,
            ThermalState(hot_since=10.0),
            id="reaching maxTemp exactly makes it hot",
        ),
        pytest.param(
            ThermalState(hot_since=5.0),
            90.0,
            10.0,
            ThermalState(hot_since=5.0),
            id="a hot gpu keeps its first hot time",
        ),
        pytest.param(
            ThermalState(hot_since=5.0),
            84.9,
            10.0,
            ThermalState(below_since=10.0),
            id="dropping below starts the cool-down",
        ),
        pytest.param(
            ThermalState(below_since=10.0),
            70.0,
            50.0,
            ThermalState(below_since=10.0),
            id="staying below keeps the cool-down start",
        ),
        pytest.param(
            ThermalState(below_since=10.0),
            86.0,
            50.0,
            ThermalState(hot_since=50.0),
            id="heating again during the cool-down restarts it",
        ),
        pytest.param(
            ThermalState(hot_since=5.0),
            None,
            10.0,
            ThermalState(hot_since=5.0),
            id="an unknown temperature changes nothing",
        ),
    ],
)
def test_step_walks_the_hysteresis(state, temperature, now, expected):
    assert thermal.step(state, temperature, now, ARGS) == expected


def test_hot_gpu_is_excluded_until_it_has_been_below_max_for_the_cool_down():
    states = [ThermalState(hot_since=1.0), ThermalState(below_since=100.0), COOL]
    hot = np.array([s.hot_since is not None for s in states])
    below = np.array([np.nan if s.below_since is None else s.below_since for s in states])
    until = thermal.excluded_until(hot, below, ARGS)
    assert until[0] == math.inf
    assert until[1] == 100.0 + 300.0
    assert until[2] == -math.inf


@pytest.mark.parametrize(
    ("temperature", "expected"),
    [
        pytest.param(30.0, 1.0, id="idle temperature scores full headroom"),
        pytest.param(85.0, 0.0, id="max temperature scores no headroom"),
        pytest.param(95.0, 0.0, id="above max is clipped to zero"),
        pytest.param(57.5, 0.5, id="halfway between idle and max scores a half"),
        pytest.param(float("nan"), 0.5, id="an unknown temperature is neutral"),
    ],
)
def test_headroom_score_is_linear_between_idle_and_max(temperature, expected):
    assert thermal.headroom_score(np.array([temperature]), ARGS)[0] == pytest.approx(expected)


def test_migration_is_needed_only_after_being_hot_longer_than_migrate_after():
    hot = ThermalState(hot_since=0.0)
    assert not thermal.needs_migration(hot, 120.0, ARGS)
    assert thermal.needs_migration(hot, 120.1, ARGS)
    assert not thermal.needs_migration(ThermalState(below_since=0.0), 1000.0, ARGS)


@given(
    st.lists(
        st.lists(
            st.one_of(st.none(), st.just(math.nan), st.floats(40.0, 100.0)), min_size=3, max_size=3
        ),
        min_size=1,
        max_size=12,
    )
)
def test_the_store_keeps_the_same_states_as_stepping_every_gpu(readings: list[list[float | None]]):
    # ``advance`` skips the step for a GPU that is COOL and below maxTemp and keeps no state for
    # COOL GPUs; what the store keeps must be what stepping every GPU from COOL would give.
    store = TelemetryStore()
    stepped = {f"GPU-{i}": COOL for i in range(3)}
    for seq, temps in enumerate(readings, start=1):
        gpus = [gpu(i, temperature_c=t, uuid=f"GPU-{i}") for i, t in enumerate(temps)]
        now = float(seq * 10)
        push = Received.of(report_from(report("n", gpus, seq=seq)))
        assert store.put(push, now, now, advance(store.get("n"), push, now, ARGS)).accepted
        for i, t in enumerate(temps):
            stepped[f"GPU-{i}"] = thermal.step(stepped[f"GPU-{i}"], t, now, ARGS)
        record = store.get("n")
        assert record is not None
        assert {u: record.thermal.get(u, COOL) for u in stepped} == stepped


def test_a_gpu_turning_hot_cooling_cool_and_unhealthy_is_said_once_per_transition():
    store = TelemetryStore()
    said: list[str] = []
    # (time, temperature, health): hot, still hot, below, still cooling, cool again (the
    # cool-down ended between two reports), then an XID and back.
    steps = [(10, 70.0, "healthy"), (20, 90.0, "healthy"), (30, 91.0, "healthy"),
             (40, 80.0, "healthy"), (50, 80.0, "healthy"), (400, 80.0, "healthy"),
             (410, 80.0, "unhealthy"), (420, 80.0, "unhealthy"), (430, 80.0, "healthy")]  # fmt: skip
    for seq, (now, temp, health) in enumerate(steps, start=1):
        extra = {"health_reasons": ["xid:79"]} if health == "unhealthy" else {}
        gpus = [gpu(0, temperature_c=temp, health=health, uuid="GPU-0", **extra)]
        push = Received.of(report_from(report("edge-2", gpus, seq=seq)))
        before = store.get("edge-2")
        assert store.put(push, now, now, advance(before, push, now, ARGS)).accepted
        record = store.get("edge-2")
        assert record is not None
        said += [message for _, message in transitions(before, record, now, ARGS)]
    name = "node edge-2 gpu 0 (GPU-0)"
    assert said == [
        f"{name}: 90 °C, at or above maxTemp 85 °C: takes no new pods",
        f"{name}: below maxTemp, cooling down for 300 s",
        f"{name}: cool again: takes pods",
        f"{name}: unhealthy (xid:79): takes no new pods",
        f"{name}: healthy again",
    ]
