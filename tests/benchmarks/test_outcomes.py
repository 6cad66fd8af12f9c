"""The outcome benchmark's GPU model, its fault-loop measurement and a tiny run of every arm."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import pytest

from benchmarks.outcomes import physics
from benchmarks.outcomes.arms import ARMS, one_seed
from benchmarks.outcomes.faultloop import eviction_delay_s
from benchmarks.outcomes.workload import load_trace

TDP = np.array([70.0, 250.0])
IDLE = np.array([10.0, 35.0])


def test_a_gpu_at_tdp_with_design_inlet_settles_at_the_design_temperature() -> None:
    steady = physics.DESIGN_INLET_C + physics.thermal_resistance(TDP) * TDP
    assert steady == pytest.approx([physics.DESIGN_TEMP_C] * 2)


def test_temperature_closes_63_percent_of_the_gap_in_one_time_constant() -> None:
    t = physics.temperature_step(np.array([30.0]), np.array([80.0]), physics.TAU_S)
    assert t[0] == pytest.approx(30 + 50 * (1 - np.exp(-1)))


def test_an_idle_gpu_draws_its_idle_power_and_a_full_one_its_tdp() -> None:
    idle = physics.power_w(IDLE, TDP, np.zeros(2), np.ones(2))
    full = physics.power_w(IDLE, TDP, np.ones(2), np.ones(2))
    assert idle == pytest.approx(IDLE)
    assert full == pytest.approx(TDP)


@pytest.mark.parametrize("demand", [0.3, 0.7, 1.0])
def test_the_clock_under_a_power_limit_keeps_the_draw_at_or_under_it(demand: float) -> None:
    limit = np.array([50.0, 150.0])
    d = np.full(2, demand)
    clock = physics.clock_under_limit(IDLE, TDP, d, limit)
    drawn = physics.power_w(IDLE, TDP, d, clock)
    assert np.all(drawn <= limit + 1e-6)
    assert np.all(clock <= 1.0)


def test_a_slowed_gpu_delays_work_only_when_the_work_needs_more_than_the_clock_gives() -> None:
    done = physics.progress(np.array([0.4, 1.0]), np.array([0.5, 0.5]))
    assert done == pytest.approx([1.0, 0.5])


async def test_the_fault_loop_evicts_the_pod_on_an_xid_gpu_within_a_minute() -> None:
    delay = await eviction_delay_s()
    assert 0 < delay < 60


@pytest.fixture
def small_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small cluster and pod list in the OpenB files' format (the real trace is not in the
    repository): T4, V100 and P100 nodes; shared, whole-GPU and CPU-only pods of a few minutes each."""
    rng = random.Random(0)
    nodes = ["sn,cpu_milli,memory_mib,gpu,model"]
    for i, model in enumerate(["T4", "V100M16", "P100"] * 4):
        nodes.append(f"node-{i:02d},64000,262144,{2 if model == 'P100' else 4},{model}")
    pods = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
            "creation_time,deletion_time,scheduled_time"]  # fmt: skip
    for i in range(120):
        num, milli = rng.choice([(1, 250), (1, 500), (1, 1000), (2, 1000), (0, 0)])
        start = rng.randrange(0, 86_400)
        end = start + rng.randrange(60, 900)
        qos = rng.choice(["LS", "BE", "Burstable"])
        pods.append(f"pod-{i:03d},4000,8192,{num},{milli},,{qos},Running,{start},{end},{start}")
    (tmp_path / "openb_node_list_gpu_node.csv").write_text("\n".join(nodes) + "\n")
    (tmp_path / "openb_pod_list_default.csv").write_text("\n".join(pods) + "\n")
    monkeypatch.setenv("OPENB_DATA", str(tmp_path))
    return tmp_path


@pytest.mark.usefixtures("small_trace")
async def test_every_arm_runs_the_same_small_fleet_and_finishes_tasks() -> None:
    # Quiet for this case only: a level left behind would hide later cases' log lines.
    quiet = logging.getLogger("scheduler_extender")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        pods, lifetimes = load_trace()
        tallies = await one_seed(7, pods, lifetimes, 4, 1800.0, 600.0, 9.0)
    finally:
        quiet.setLevel(level)
    assert set(tallies) == set(ARMS)
    for tally in tallies.values():
        assert tally.completed > 0
        assert tally.energy_j > 0
        assert all(0 <= u <= 100 for u in tally.unallocated)
