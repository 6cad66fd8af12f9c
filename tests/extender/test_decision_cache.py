"""The request path, from its per-row caches, must give exactly the answers of the pure policy."""

import itertools
import random

import numpy as np
import orjson
import pytest
from hypothesis import given, settings, strategies as st

from scheduler_extender.api import verbs
from scheduler_extender.api.app import create_app
from scheduler_extender.k8s.translate import pod_demand
from scheduler_extender.state.verdicts import distinct
from scheduler_extender.telemetry.clock import FakeClock
from scheduler_extender.telemetry.decode import report_from
from tests.builders import args_names, gpu, pod, report

JSON = {"content-type": "application/json"}


def fleet(clock, nodes=40, seed=0):
    app = create_app(clock=clock)
    state = app.state.ctx.state
    rng = random.Random(seed)
    for i in range(nodes):
        gpus = [
            gpu(g, temperature_c=rng.uniform(30, 95), memory_used_mib=rng.choice([0.0, 3000.0, 9000.0, 16000.0]),
                health=rng.choice(["healthy", "healthy", "degraded", "unhealthy"]), utilization_pct=rng.uniform(0, 100))
            for g in range(rng.randint(1, 4))
        ]  # fmt: skip
        state.ingest(report_from(report(f"n{i}", gpus, labels={"edgegpu.io/rack": f"r{i % 3}"})))
    return app, state, rng


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 10_000),
    st.sampled_from(["inference", "training", "best-effort", "realtime"]),
    st.integers(1, 4),
    st.booleans(),
)
def test_decide_agrees_with_evaluate_through_pushes_time_and_binds(seed, qos, blocks, whole):
    clock = FakeClock()
    app, state, rng = fleet(clock, seed=seed)
    names = [f"n{i}" for i in rng.sample(range(45), 30)]  # some never reported
    spec = pod(
        "p",
        blocks=None if whole else blocks,
        whole=blocks % 3 if whole else None,
        qos=qos,
        group="g" if qos == "training" else None,
    )
    demand = pod_demand(spec, state.policy.spec.qos)
    for step in range(10):
        a = state.decide(names, demand)
        b = state.evaluate(names, demand)
        assert (
            (a.passed == b.passed).all()
            and (a.reason == b.reason).all()
            and (a.points == b.points).all()
            and np.allclose(a.score, b.score)
        )
        width = b.gpus.shape[1]  # the GPUs bind would take, as the pure policy chooses them
        assert (a.gpus[:, :width] == b.gpus).all() and (a.gpus[:, width:] == -1).all()
        # Change the world between requests: a push (or none), time passing (past cool-downs
        # and into staleness), a reservation, a node that leaves, one that joins.
        if rng.random() < 0.7:
            n = rng.randrange(45)
            state.ingest(report_from(report(f"n{n}", [gpu(0, temperature_c=rng.uniform(40, 95))])))
        clock.advance(rng.choice([0.0, 1.0, 20.0, 60.0, 400.0]))
        if step == 5:
            state.forget_node(names[0])
        if step in (3, 7) and b.passed.any():
            i = int(np.flatnonzero(b.passed)[0])
            assignment, _ = verbs.choose_assignment(app.state.ctx, demand, names[i])
            if assignment is not None:
                state.assign(assignment)


def test_only_changed_rows_are_recomputed(clock):
    _, state, _ = fleet(clock, nodes=30)
    names = [f"n{i}" for i in range(30)]
    demand = pod_demand(pod("p"), state.policy.spec.qos)
    state.decide(names, demand)
    before = state.verdicts.recomputed_rows
    state.decide(names, demand)
    assert state.verdicts.recomputed_rows == before
    state.ingest(report_from(report("n3", [gpu(0)])))
    state.decide(names, demand)
    assert state.verdicts.recomputed_rows == before + 1


async def test_the_answer_is_the_same_however_the_request_is_spelled(client):
    for i in range(3):
        await client.post(
            "/v1/telemetry", json=report(f"n{i}", [gpu(0, temperature_c=[40.0, 90.0, 60.0][i])])
        )
    body = args_names(pod(qos="training"), ["n0", "n1", "n2", "zz"])
    compact = orjson.dumps(body)
    spaced = compact.replace(b'"NodeNames":', b'"NodeNames" : ').replace(b",", b", ")
    lowered = compact.replace(b'"NodeNames"', b'"nodenames"').replace(b'"Pod"', b'"pod"')
    answers = []
    for variant in (compact, compact, spaced, lowered):
        f = orjson.loads((await client.post("/filter", content=variant, headers=JSON)).content)
        p = orjson.loads((await client.post("/prioritize", content=variant, headers=JSON)).content)
        answers.append((f, sorted((h["Host"], h["Score"]) for h in p)))
    assert all(a == answers[0] for a in answers)
    assert answers[0][0]["NodeNames"] == ["n0"]  # the coolest: the best for training


def test_fragmentation_scoring_keeps_decide_and_evaluate_in_step_as_the_mix_changes(clock):
    from scheduler_extender.policy.document import parse_policy

    _, state, rng = fleet(clock, nodes=30, seed=3)
    state.set_policy(
        parse_policy({"spec": {"fragmentation": {"enabled": True, "refreshEvery": 2}}})
    )
    names = [f"n{i}" for i in range(30)]
    versions = set()
    for i in range(8):
        spec = pod(
            f"p{i}",
            blocks=rng.choice([1, 2, 3]) if i % 3 else None,
            whole=1 if i % 3 == 0 else None,
        )
        demand = pod_demand(spec, state.policy.spec.qos)
        state.remember_demand(demand)  # as filter and prioritize do
        a = state.decide(names, demand)
        b = state.evaluate(names, demand)
        assert (a.passed == b.passed).all() and (a.points == b.points).all()
        versions.add(state.mix.version)
    assert len(versions) >= 3 and not state.mix.empty


@pytest.mark.parametrize("step", [None, 0.02])
def test_host_room_and_cpu_only_pods_keep_decide_and_evaluate_in_step(clock, step):
    from scheduler_extender.policy.document import parse_policy

    _, state, rng = fleet(clock, nodes=30, seed=5)
    spec = {"fragmentation": {"enabled": True, "refreshEvery": 3, "hostWeight": 1.0}}
    state.set_policy(parse_policy({"spec": {**spec, "prioritize": {"relativeStep": step}}}))
    names = [f"n{i}" for i in range(30)]
    for i in range(0, 30, 2):  # half the nodes have a Node object with allocatable
        state.set_host_allocatable(f"n{i}", 16_000.0, 65_536.0)
    spread = set()
    for i in range(12):
        requests = {"cpu": f"{rng.choice([1, 4, 12])}", "memory": f"{rng.choice([2, 30])}Gi"}
        spec_ = pod(f"p{i}", blocks=None if i % 4 == 0 else rng.choice([1, 2]), requests=requests)
        demand = pod_demand(spec_, state.policy.spec.qos)
        state.remember_demand(demand)
        for _ in range(2):  # the second time from the cached verdicts
            a = state.decide(names, demand)
            b = state.evaluate(names, demand)
            assert (a.passed == b.passed).all() and (a.points == b.points).all()
        if i % 4 == 0:
            assert a.passed.all()  # a CPU-only pod passes everywhere
            spread.add(tuple(a.points))
        # the pod is bound on its best node: the host room there shrinks
        best = int(np.argmax(np.where(a.passed, a.points, -1)))
        state.host_pod(demand.uid, names[best], demand.cpu_milli, demand.host_memory_mib)
    assert any(len(set(p)) > 1 for p in spread)  # host room told the nodes apart


def test_gpu_facts_are_worked_out_once_per_row_write_for_every_shape(clock):
    _, state, _ = fleet(clock, nodes=30)
    names = [f"n{i}" for i in range(30)]
    shapes = [
        pod_demand(pod(f"p{k}", blocks=b, whole=w, qos=q), state.policy.spec.qos)
        for k, (b, w, q) in enumerate([(1, None, "inference"), (None, 1, "training"), (2, None, "best-effort")])
    ]  # fmt: skip
    for demand in shapes:
        state.decide(names, demand)
    facts = state.verdicts.facts
    assert facts.computed_rows == 30  # every row once
    verdicts = state.verdicts.recomputed_rows
    state.ingest(report_from(report("n3", [gpu(0, temperature_c=91.0)])))
    for demand in shapes:
        state.decide(names, demand)
    assert facts.computed_rows == 31  # the written row, once for all three shapes
    assert state.verdicts.recomputed_rows == verdicts + 3  # its verdict, once per shape
    state.set_policy(state.policy)  # a policy in force again: nothing kept is trusted
    state.decide(names, shapes[0])
    assert facts.computed_rows == 31 + 30


def test_the_same_rows_asked_again_get_the_same_facts_until_one_is_written(clock):
    """A warm asks for the settled rows once per shape: the facts are gathered once."""
    _, state, _ = fleet(clock, nodes=10)
    table, cache, now = state.table, state.verdicts.facts, clock.monotonic()
    rows = table.rows([f"n{i}" for i in (1, 4, 7)])
    first = cache.take(table, rows, state.policy, now)
    assert cache.take(table, rows.copy(), state.policy, now) is first
    assert cache.take(table, rows[:2], state.policy, now) is not first
    with pytest.raises(ValueError):
        first.terms[0, 0, 0] = 1.0  # handed out more than once: read-only
    state.ingest(report_from(report("n4", [gpu(0, temperature_c=91.0)])))
    again = cache.take(table, rows, state.policy, now)
    assert again is not first
    assert again.terms[0, 1, 0] < first.terms[0, 1, 0]  # n4 is hotter: less thermal headroom
    assert cache.take(table, rows, state.policy, now) is again


@given(st.lists(st.integers(0, 40), max_size=30))
def test_distinct_gives_each_row_once(rows):
    array = np.array(rows, dtype=np.int64)
    once = distinct(array)
    assert sorted(once.tolist()) == sorted(set(rows))
    if all(a < b for a, b in itertools.pairwise(rows)):
        assert once is array  # already in order: not sorted again


def test_refresh_redoes_only_written_rows_and_hands_nothing_out(clock):
    _, state, _ = fleet(clock, nodes=10)
    table, cache, now = state.table, state.verdicts.facts, clock.monotonic()
    rows = table.rows([f"n{i}" for i in range(10)])
    assert cache.refresh(table, rows, state.policy, now)
    assert cache.computed_rows == 10
    assert not cache.refresh(table, rows, state.policy, now)
    state.ingest(report_from(report("n4", [gpu(0, temperature_c=91.0)])))
    assert cache.refresh(table, rows[::-1], state.policy, now)  # any order
    assert cache.computed_rows == 11
    facts = cache.take(table, rows, state.policy, now)
    assert cache.computed_rows == 11  # refreshed already: nothing redone
    fresh = cache.take(table, rows, state.policy, now)
    assert (facts.terms == fresh.terms).all()


def test_a_candidate_list_naming_a_node_twice_is_decided_as_the_policy_says(clock):
    _, state, _ = fleet(clock, nodes=10)
    names = ["n3", "n1", "n3", "n7", "n1"]
    demand = pod_demand(pod("p", blocks=1), state.policy.spec.qos)
    state.ingest(report_from(report("n3", [gpu(0, temperature_c=50.0)])))
    a, b = state.decide(names, demand), state.evaluate(names, demand)
    assert (a.passed == b.passed).all() and (a.reason == b.reason).all()
    assert (a.points == b.points).all()


def test_decide_agrees_with_evaluate_when_a_node_widens_the_table(clock):
    """A node with more GPU slots than any before widens every per-GPU column."""
    _, state, _ = fleet(clock, nodes=20)
    names = [f"n{i}" for i in range(21)]
    demand = pod_demand(pod("p", blocks=1), state.policy.spec.qos)
    state.decide(names, demand)
    wide = [gpu(g, temperature_c=40.0 + g, memory_used_mib=0.0) for g in range(12)]
    state.ingest(report_from(report("n20", wide)))
    state.ingest(report_from(report("n2", [gpu(0, temperature_c=97.0)])))
    for _ in range(2):
        a, b = state.decide(names, demand), state.evaluate(names, demand)
        assert (a.passed == b.passed).all() and (a.reason == b.reason).all()
        assert (a.points == b.points).all()
        assert a.passed[20]


async def test_answers_follow_changed_verdicts_on_the_same_list(all_client):
    """The same list and pod again after a GPU overheats: the new verdict is answered."""
    client = all_client
    for i in range(3):
        await client.post("/v1/telemetry", json=report(f"n{i}", [gpu(0, temperature_c=50.0)]))
    body = orjson.dumps(args_names(pod(qos="inference", blocks=1), ["n0", "n1", "n2"]))
    first = orjson.loads((await client.post("/filter", content=body, headers=JSON)).content)
    assert first["NodeNames"] == ["n0", "n1", "n2"]
    await client.post("/v1/telemetry", json=report("n1", [gpu(0, temperature_c=95.0)]))
    second = orjson.loads((await client.post("/filter", content=body, headers=JSON)).content)
    assert second["NodeNames"] == ["n0", "n2"]
    assert second["FailedNodes"] == {"n1": "edgegpu: gpu too hot"}
    scores = orjson.loads((await client.post("/prioritize", content=body, headers=JSON)).content)
    assert [h["Host"] for h in scores] == ["n0", "n1", "n2"] and scores[1]["Score"] == 0
