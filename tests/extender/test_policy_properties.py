import dataclasses

import numpy as np
from hypothesis import given, settings, strategies as st

from scheduler_extender.policy.base import MAX_SCORE, Reason
from scheduler_extender.policy.combine import Context, evaluate
from scheduler_extender.policy.document import DEFAULT_POLICY
from tests.strategies import demands, node_batches

CTX = Context(now=1000.0, group_racks=np.array([1]), rack_free=np.array([3.0, 5.0, 1.0]))


@given(node_batches(), demands())
def test_scores_lie_in_zero_to_ten_and_failing_nodes_score_zero(batch, demand):
    ev = evaluate(batch, demand, DEFAULT_POLICY, CTX)
    assert ((ev.points >= 0) & (ev.points <= MAX_SCORE)).all()
    assert ((ev.score >= 0) & (ev.score <= 1)).all()
    assert (ev.points[~ev.passed] == 0).all()


@given(node_batches(), demands())
def test_chosen_gpus_are_usable_slots_of_passing_nodes(batch, demand):
    ev = evaluate(batch, demand, DEFAULT_POLICY, CTX)
    for i in range(batch.size):
        chosen = [g for g in ev.gpus[i].tolist() if g >= 0]
        if ev.reason[i] == Reason.OK:
            assert len(chosen) == demand.gpu_count
            assert all(batch.present[i, g] and batch.health[i, g] != 2 for g in chosen)
        else:
            assert chosen == []


@given(node_batches(), demands())
def test_the_same_input_gives_the_same_answer(batch, demand):
    a = evaluate(batch, demand, DEFAULT_POLICY, CTX)
    b = evaluate(batch, demand, DEFAULT_POLICY, CTX)
    assert (a.points == b.points).all() and (a.passed == b.passed).all()
    assert (a.gpus == b.gpus).all()


@given(node_batches(), demands(), st.randoms(use_true_random=False))
def test_each_node_is_judged_on_its_own_whatever_the_order(batch, demand, rnd):
    order = list(range(batch.size))
    rnd.shuffle(order)
    idx = np.array(order)
    shuffled = batch.take(idx)
    a = evaluate(batch, demand, DEFAULT_POLICY, CTX)
    b = evaluate(shuffled, demand, DEFAULT_POLICY, CTX)
    assert (a.points[idx] == b.points).all()
    assert (a.passed[idx] == b.passed).all()


@settings(max_examples=60)
@given(node_batches(max_nodes=1), demands(), st.floats(0, 30))
def test_a_hotter_gpu_never_scores_higher(batch, demand, warmer):
    temps = batch.readings["temperature_c"] + warmer
    hotter = dataclasses.replace(batch, readings={**batch.readings, "temperature_c": temps})
    a = evaluate(batch, demand, DEFAULT_POLICY, CTX)
    b = evaluate(hotter, demand, DEFAULT_POLICY, CTX)
    if a.passed[0] and b.passed[0] and batch.present[0].sum() == 1:
        assert b.score[0] <= a.score[0] + 1e-9


@settings(max_examples=60)
@given(node_batches(max_nodes=1), demands(), st.floats(0, 50))
def test_more_power_headroom_never_scores_lower(batch, demand, extra_w):
    limits = batch.readings["power_limit_w"] + extra_w
    roomier = dataclasses.replace(batch, readings={**batch.readings, "power_limit_w": limits})
    a = evaluate(batch, demand, DEFAULT_POLICY, CTX)
    b = evaluate(roomier, demand, DEFAULT_POLICY, CTX)
    limit = batch.readings["power_limit_w"][0]
    if a.passed[0] and b.passed[0] and batch.present[0].sum() == 1 and (limit > 0).all():
        assert b.score[0] >= a.score[0] - 1e-9
