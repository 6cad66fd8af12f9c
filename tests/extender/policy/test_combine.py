import numpy as np
import pytest

from scheduler_extender.domain import Health, PodDemand, QosClass
from scheduler_extender.policy.base import Reason
from scheduler_extender.policy.combine import Context, evaluate
from scheduler_extender.policy.document import DEFAULT_POLICY, parse_policy
from scheduler_extender.policy.rules import TERMS
from tests.builders import batch

NOW = 1000.0


def demand(qos=QosClass.INFERENCE, blocks=1, whole=0, group=None):
    return PodDemand(
        uid="u", namespace="d", name="p", qos=qos, mem_blocks=blocks, whole_gpus=whole, group=group
    )


def verdict(b, d=None, policy=DEFAULT_POLICY, ctx=None):
    ev = evaluate(b, d or demand(), policy, ctx or Context(now=NOW))
    return bool(ev.passed[0]), Reason(int(ev.reason[0])), ev


@pytest.mark.parametrize(
    ("nodes", "pod", "passed", "reason"),
    [
        pytest.param(
            batch(), demand(), True, Reason.OK, id="a cool free gpu takes a one-block pod"
        ),
        pytest.param(
            batch(known=False),
            demand(QosClass.TRAINING),
            False,
            Reason.TELEMETRY_MISSING,
            id="training fails closed on a node that never reported",
        ),
        pytest.param(
            batch(known=False),
            demand(QosClass.INFERENCE),
            True,
            Reason.TELEMETRY_MISSING,
            id="inference fails open on a node that never reported",
        ),
        pytest.param(
            batch(age_s=16.0),
            demand(QosClass.TRAINING),
            False,
            Reason.TELEMETRY_STALE,
            id="training fails closed on telemetry older than three intervals",
        ),
        pytest.param(
            batch(age_s=16.0),
            demand(QosClass.BEST_EFFORT),
            True,
            Reason.OK,
            id="best-effort uses stale telemetry as it is",
        ),
        pytest.param(
            batch(age_s=14.0),
            demand(QosClass.TRAINING),
            True,
            Reason.OK,
            id="telemetry younger than three intervals is fresh",
        ),
        pytest.param(
            batch(present=False),
            demand(),
            False,
            Reason.NO_GPU,
            id="a node without gpus is unresolvable",
        ),
        pytest.param(
            batch(driver_ok=False),
            demand(),
            False,
            Reason.DRIVER_NOT_OK,
            id="a broken driver fails the node",
        ),
        pytest.param(
            batch(health=Health.UNHEALTHY),
            demand(),
            False,
            Reason.ALL_UNHEALTHY,
            id="an unhealthy gpu never takes pods",
        ),
        pytest.param(
            batch(health=Health.DEGRADED),
            demand(),
            True,
            Reason.OK,
            id="a degraded gpu still takes pods",
        ),
        pytest.param(
            batch(),
            demand(blocks=5),
            False,
            Reason.REQUEST_EXCEEDS_GPU,
            id="more blocks than one gpu has is unresolvable",
        ),
        pytest.param(
            batch(allocated_blocks=4),
            demand(),
            False,
            Reason.NO_FREE_BLOCKS,
            id="a full gpu fails resolvably",
        ),
        pytest.param(
            batch(excluded_until=np.inf),
            demand(),
            False,
            Reason.GPU_HOT,
            id="a hot gpu fails resolvably",
        ),
        pytest.param(
            batch(excluded_until=NOW + 1),
            demand(),
            False,
            Reason.GPU_COOLING_DOWN,
            id="a gpu in its cool-down fails resolvably",
        ),
        pytest.param(
            batch(excluded_until=NOW),
            demand(),
            True,
            Reason.OK,
            id="the cool-down ends exactly at its deadline",
        ),
        pytest.param(
            batch(allocated_blocks=1),
            demand(whole=1, blocks=0),
            False,
            Reason.NO_FREE_GPUS,
            id="a whole-gpu pod needs a gpu nobody uses",
        ),
        pytest.param(
            batch(g=2, present=[True, False]),
            demand(whole=2, blocks=0),
            False,
            Reason.TOO_FEW_GPUS,
            id="asking for more gpus than the node has is unresolvable",
        ),
        pytest.param(
            batch(allocated_blocks=1),
            demand(QosClass.REALTIME),
            False,
            Reason.NO_FREE_GPUS,
            id="realtime needs a whole free gpu even for blocks",
        ),
        pytest.param(
            batch(whole_taken=True),
            demand(),
            False,
            Reason.NO_FREE_BLOCKS,
            id="a gpu held whole takes no shared pods",
        ),
        pytest.param(
            batch(unaccounted_used_mib=600.0),
            demand(whole=1, blocks=0),
            False,
            Reason.NO_FREE_GPUS,
            id="foreign memory use makes a gpu not free",
        ),
    ],
)
def test_filter_verdicts(nodes, pod, passed, reason):
    got_passed, got_reason, _ = verdict(nodes, pod)
    assert (got_passed, got_reason) == (passed, reason)


def test_a_node_whose_only_gpu_with_room_is_unhealthy_says_so_not_that_it_is_full():
    # GPU 0 full, GPU 1 free but unhealthy (an XID): the room there is not room.
    nodes = batch(g=2, allocated_blocks=[[4, 0]], health=[[0, int(Health.UNHEALTHY)]])
    passed, reason, _ = verdict(nodes, demand(blocks=2))
    assert (passed, reason) == (False, Reason.ROOM_ONLY_ON_UNHEALTHY_GPU)
    assert not reason.resolvable
    # A whole GPU: preemption can free the healthy one, so the reason stays resolvable.
    nodes = batch(g=2, whole_taken=[[True, False]], health=[[0, int(Health.UNHEALTHY)]])
    passed, reason, _ = verdict(nodes, demand(whole=1, blocks=0))
    assert (passed, reason, reason.resolvable) == (False, Reason.NO_FREE_GPUS, True)
    # With room on no GPU at all, it is full, whatever the unhealthy one.
    nodes = batch(g=2, allocated_blocks=[[4, 4]], health=[[0, int(Health.UNHEALTHY)]])
    assert verdict(nodes, demand(blocks=2))[1] is Reason.NO_FREE_BLOCKS


def test_a_node_whose_only_gpu_is_hot_and_full_is_hot_not_full():
    _, reason, _ = verdict(batch(excluded_until=np.inf, allocated_blocks=4))
    assert reason is Reason.GPU_HOT


def test_a_busy_cool_gpu_beside_a_free_hot_one_is_reported_as_busy():
    # Preemption can free the cool GPU; the hot one will not help until it cools.
    nodes = batch(g=2, excluded_until=[np.inf, -np.inf], allocated_blocks=[0, 4])
    _, reason, _ = verdict(nodes)
    assert reason is Reason.NO_FREE_BLOCKS


def test_one_usable_gpu_is_enough_for_a_block_pod():
    nodes = batch(
        g=3,
        health=[Health.UNHEALTHY, Health.HEALTHY, Health.HEALTHY],
        excluded_until=[-np.inf, np.inf, -np.inf],
    )
    passed, _, ev = verdict(nodes)
    assert passed
    assert ev.gpus[0].tolist() == [2]


def test_blocks_must_fit_on_one_gpu_not_on_the_node_total():
    nodes = batch(g=2, allocated_blocks=[2, 2])
    passed, reason, _ = verdict(nodes, demand(blocks=3))
    assert not passed and reason is Reason.NO_FREE_BLOCKS


def test_packing_classes_choose_the_tightest_gpu_and_training_the_emptiest():
    nodes = batch(g=2, allocated_blocks=[2, 0])
    _, _, packed = verdict(nodes, demand(QosClass.INFERENCE))
    _, _, spread = verdict(nodes, demand(QosClass.TRAINING))
    assert packed.gpus[0].tolist() == [0]
    assert spread.gpus[0].tolist() == [1]


def test_ties_go_to_the_lowest_gpu_index():
    _, _, ev = verdict(batch(g=4))
    assert ev.gpus[0].tolist() == [0]


def test_whole_gpu_pods_get_the_coolest_free_gpus():
    nodes = batch(g=4, temperature_c=[80.0, 40.0, 60.0, 35.0], allocated_blocks=[0, 0, 0, 1])
    passed, _, ev = verdict(nodes, demand(QosClass.TRAINING, blocks=0, whole=2))
    assert passed
    assert sorted(ev.gpus[0].tolist()) == [1, 2]


def test_cooler_nodes_score_higher_for_training():
    nodes = batch(n=2, temperature_c=[80.0, 40.0])
    ev = evaluate(nodes, demand(QosClass.TRAINING), DEFAULT_POLICY, Context(now=NOW))
    assert ev.points[1] > ev.points[0]


def test_power_saving_packs_inference_onto_active_gpus():
    nodes = batch(n=2, utilization_pct=[90.0, 0.0], temperature_c=55.0)
    ev = evaluate(nodes, demand(QosClass.INFERENCE), DEFAULT_POLICY, Context(now=NOW))
    assert ev.score[0] > ev.score[1]
    off = parse_policy({"spec": {"powerSaving": {"enabled": False}}})
    ev_off = evaluate(nodes, demand(QosClass.INFERENCE), off, Context(now=NOW))
    assert ev_off.weights[TERMS.index("powerSaving")] == 0.0
    assert ev_off.score[0] == pytest.approx(ev_off.score[1], abs=0.05)


def test_fail_open_and_stale_nodes_score_zero():
    nodes = batch(n=2, known=[False, True], age_s=[0.0, 100.0])
    ev = evaluate(nodes, demand(QosClass.BEST_EFFORT), DEFAULT_POLICY, Context(now=NOW))
    assert ev.passed.tolist() == [True, True]
    assert ev.points.tolist() == [0, 0]


def test_a_group_pod_prefers_its_groups_rack():
    nodes = batch(n=2, rack=[0, 1])
    ctx = Context(now=NOW, group_racks=np.array([1]), rack_free=np.array([5.0, 5.0]))
    ev = evaluate(nodes, demand(QosClass.TRAINING, group="job-1"), DEFAULT_POLICY, ctx)
    assert ev.score[1] > ev.score[0]
    assert ev.terms[1, TERMS.index("topology")] > ev.terms[0, TERMS.index("topology")]


def test_the_topology_term_is_off_for_pods_without_a_group():
    ev = evaluate(batch(rack=0), demand(), DEFAULT_POLICY, Context(now=NOW))
    assert ev.weights[TERMS.index("topology")] == 0.0


def test_a_pod_without_gpu_requests_passes_everywhere_unscored():
    ev = evaluate(batch(n=3, known=False), demand(blocks=0), DEFAULT_POLICY, Context(now=NOW))
    assert ev.passed.all() and (ev.points == 0).all()


def test_every_term_is_reported_for_the_chosen_gpu():
    _, _, ev = verdict(batch(temperature_c=57.5, power_w=35.0))
    assert ev.terms.shape == (1, len(TERMS))
    assert ev.terms[0, TERMS.index("thermal")] == pytest.approx(0.5)
    assert ev.terms[0, TERMS.index("power")] == pytest.approx(0.5)


def test_relative_points_spend_the_ten_points_near_the_best_passing_node():
    from scheduler_extender.policy.combine import relative_points

    score = np.array([0.90, 0.895, 0.88, 0.70, 0.99])
    passed = np.array([True, True, True, True, False])
    # best passing is 0.90: 0.005 below is one step of 0.01 (rounded up), 0.02 two, 0.2 is 0.
    assert relative_points(score, passed, 0.01).tolist() == [10, 9, 8, 0, 0]
    assert relative_points(score, np.zeros(5, dtype=bool), 0.01).tolist() == [0] * 5
