import numpy as np
import pytest

from scheduler_extender.domain import QosClass
from scheduler_extender.policy.base import format_duration, parse_duration_s
from scheduler_extender.policy.qos import QosArgs, resolve_class
from scheduler_extender.policy.rules import memory, power, topology
from scheduler_extender.policy.rules.memory import MemoryArgs
from scheduler_extender.policy.rules.power import PowerArgs
from scheduler_extender.policy.rules.topology import TopologyArgs

MEM = MemoryArgs()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("5m", 300.0, id="minutes"),
        pytest.param("1h30m", 5400.0, id="hours and minutes"),
        pytest.param("90s", 90.0, id="seconds"),
        pytest.param("1.5s", 1.5, id="fractional seconds"),
        pytest.param("250ms", 0.25, id="milliseconds"),
        pytest.param(42, 42.0, id="a bare number is seconds"),
    ],
)
def test_durations_read_like_go(text, seconds):
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["5 min", "", "m5", "-5m", "5x", True, None])
def test_bad_durations_are_refused_with_an_example(bad):
    with pytest.raises(ValueError, match="duration"):
        parse_duration_s(bad)


def test_durations_are_written_back_in_go_form():
    assert format_duration(300.0) == "5m"
    assert format_duration(5400.0) == "1h30m"
    assert format_duration(0.0) == "0s"


@pytest.mark.parametrize(
    ("draw", "limit", "expected"),
    [
        pytest.param(35.0, 70.0, 0.5, id="half the limit in use leaves half the headroom"),
        pytest.param(70.0, 70.0, 0.0, id="at the limit there is none"),
        pytest.param(80.0, 70.0, 0.0, id="over the limit is clipped"),
        pytest.param(np.nan, 70.0, 0.5, id="unknown draw is neutral"),
        pytest.param(30.0, np.nan, 0.5, id="unknown limit is neutral"),
        pytest.param(30.0, 0.0, 0.5, id="a zero limit is treated as unknown"),
    ],
)
def test_power_headroom_is_the_unused_share_of_the_limit(draw, limit, expected):
    assert power.headroom_score(np.array([draw]), np.array([limit]))[0] == pytest.approx(expected)


def test_a_gpu_is_active_when_loaded_above_threshold_or_holding_work():
    util = np.array([80.0, 10.0, 10.0, np.nan])
    busy = np.array([False, True, False, False])
    active = power.is_active(util, busy, PowerArgs())
    assert active.tolist() == [True, True, False, False]


@pytest.mark.parametrize(
    ("total", "unaccounted", "allocated", "expected"),
    [
        pytest.param(16384.0, 0.0, 0, 4, id="an empty 16 GiB gpu has four 4 GiB blocks"),
        pytest.param(15360.0, 0.0, 0, 3, id="a T4's 15 GiB holds three whole blocks"),
        pytest.param(16384.0, 300.0, 0, 4, id="the driver's own memory takes no block"),
        pytest.param(16384.0, 513.0, 0, 3, id="foreign use past idleUsedMiB takes a whole block"),
        pytest.param(16384.0, 4300.0, 0, 2, id="and as many blocks as it covers, rounded up"),
        pytest.param(
            16384.0, 0.0, 3, 1, id="blocks assigned at bind count before telemetry shows them"
        ),
        pytest.param(16384.0, 8192.0, 3, 0, id="free blocks never go below zero"),
        pytest.param(np.nan, 0.0, 0, 0, id="unknown total memory gives no blocks"),
    ],
)
def test_free_blocks_account_telemetry_and_assignments(total, unaccounted, allocated, expected):
    free = memory.free_blocks(
        np.array([total]), np.array([unaccounted]), np.array([allocated]), MEM
    )
    assert free.tolist() == [expected]


def test_a_gpu_is_idle_only_with_nothing_assigned_and_little_memory_in_use():
    idle = memory.is_idle(
        np.array([0.0, 600.0, 0.0, 0.0]),
        np.array([0, 0, 1, 0]),
        np.array([False, False, False, True]),
        MEM,
    )
    assert idle.tolist() == [True, False, False, False]


def test_best_fit_prefers_the_tightest_gpu_and_spread_the_emptiest():
    free = np.array([1, 4])
    cap = np.array([4, 4])
    pack = memory.fit_score(free, cap, 1, pack=True)
    spread = memory.fit_score(free, cap, 1, pack=False)
    assert pack[0] > pack[1]
    assert spread[1] > spread[0]
    assert memory.fit_score(free, cap, 0, pack=True).tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    ("annotation", "priority", "expected"),
    [
        pytest.param("realtime", None, QosClass.REALTIME, id="the annotation names the class"),
        pytest.param(
            " Training ", None, QosClass.TRAINING, id="the annotation is read case-insensitively"
        ),
        pytest.param(None, 2_000_000, QosClass.REALTIME, id="a very high priority is realtime"),
        pytest.param(
            None, 10_000, QosClass.TRAINING, id="priority at the training threshold is training"
        ),
        pytest.param(None, 0, QosClass.INFERENCE, id="priority zero is inference"),
        pytest.param(None, -1, QosClass.BEST_EFFORT, id="negative priority is best-effort"),
        pytest.param(
            None, None, QosClass.INFERENCE, id="no annotation and no priority is inference"
        ),
        pytest.param(
            "best-effort", 2_000_000, QosClass.BEST_EFFORT, id="the annotation wins over priority"
        ),
    ],
)
def test_qos_class_comes_from_annotation_then_priority(annotation, priority, expected):
    assert resolve_class(annotation, priority, QosArgs()) is expected


def test_an_unknown_qos_annotation_lists_the_classes():
    with pytest.raises(ValueError, match="realtime, training, inference, best-effort"):
        resolve_class("gold", None, QosArgs())


def test_a_group_prefers_the_racks_where_it_already_runs():
    score = topology.score(
        rack=np.array([0, 1, -1]),
        rdma=np.array([False, False, False]),
        group_racks=np.array([1]),
        rack_free=np.array([10.0, 1.0]),
        args=TopologyArgs(),
    )
    assert score[1] > score[0]
    assert score[2] == 0.0


def test_a_new_group_prefers_the_roomiest_rack_and_rdma_nodes():
    args = TopologyArgs()
    score = topology.score(
        rack=np.array([0, 1, 1]),
        rdma=np.array([False, False, True]),
        group_racks=np.zeros(0, dtype=np.int64),
        rack_free=np.array([2.0, 8.0]),
        args=args,
    )
    assert score[1] > score[0]
    assert score[2] > score[1]
    assert score[2] == pytest.approx(1.0)
