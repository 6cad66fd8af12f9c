"""Settled telemetry (``--settle-ms``): pushes are decided on in batches, binds at once."""

from __future__ import annotations

import asyncio
import logging
import random

import numpy as np
import orjson
import pytest
from hypothesis import given, settings, strategies as st

from scheduler_extender.api import turns, verbs
from scheduler_extender.api.app import create_app
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.k8s.translate import pod_demand
from scheduler_extender.policy.base import Reason
from scheduler_extender.policy.document import DEFAULT_POLICY
from scheduler_extender.telemetry.clock import FakeClock
from scheduler_extender.telemetry.decode import report_from
from tests.builders import args_names, gpu, pod, report
from tests.extender.test_decision_cache import fleet

HOT = 99.0


def demand_of(spec):
    return pod_demand(spec, DEFAULT_POLICY.spec.qos)


def agree(state, names, demand, raw):
    a = state.decide(names, demand, raw_names=raw)
    b = state.evaluate(names, demand)
    assert (a.passed == b.passed).all()
    assert (a.reason == b.reason).all()
    assert (a.points == b.points).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["inference", "training"]), st.booleans())
def test_after_each_settle_decisions_are_exactly_the_policys(seed, qos, warm):
    clock = FakeClock()
    app, state, rng = fleet(clock, seed=seed)
    state.settle_s = 5.0
    names = [f"n{i}" for i in range(40)]
    raw = orjson.dumps(names)
    demand = demand_of(pod("p", qos=qos, group="g" if qos == "training" else None))
    for step in range(8):
        for _ in range(rng.randrange(4)):
            n = rng.randrange(40)
            state.ingest(report_from(report(f"n{n}", [gpu(0, temperature_c=rng.uniform(40, 95))])))
        clock.advance(rng.choice([0.0, 1.0, 20.0]))
        if step == 4:
            passed = np.flatnonzero(state.evaluate(names, demand).passed)
            if passed.size:
                assignment, _ = verbs.choose_assignment(app.state.ctx, demand, names[passed[0]])
                if assignment is not None:
                    state.assign(assignment)
        state.settle()
        if warm:
            for _ in state.warm():
                pass
        agree(state, names, demand, raw)


def one_node(clock, settle_s):
    app = create_app(clock=clock)
    state = app.state.ctx.state
    state.settle_s = settle_s
    state.ingest(report_from(report("a", [gpu(0, memory_total_mib=16384.0)], seq=1)))
    state.settle()
    return app, state


def test_pushes_wait_for_the_settle_and_binds_do_not(clock):
    _, state = one_node(clock, settle_s=10.0)
    small = demand_of(pod("p", blocks=1))
    assert state.decide(["a"], small).passed.tolist() == [True]
    state.ingest(report_from(report("a", [gpu(0, temperature_c=HOT)], seq=2)))
    assert state.decide(["a"], small).passed.tolist() == [True]  # not settled yet
    assert state.settle() == 1
    decision = state.decide(["a"], small)
    assert decision.reason.tolist() == [Reason.GPU_HOT]
    assert state.settle() == 0

    # A bind is seen by the very next decision, settle or not.
    app2, state2 = one_node(FakeClock(), settle_s=10.0)
    all_of_it = demand_of(pod("q", blocks=4))
    assert state2.decide(["a"], all_of_it).passed.tolist() == [True]
    assignment, _ = verbs.choose_assignment(app2.state.ctx, all_of_it, "a")
    assert assignment is not None
    state2.assign(assignment)
    assert state2.decide(["a"], demand_of(pod("r", blocks=1))).passed.tolist() == [False]


def test_a_decision_settles_by_itself_when_settling_is_late(clock):
    _, state = one_node(clock, settle_s=0.1)
    small = demand_of(pod("p", blocks=1))
    assert state.decide(["a"], small).passed.tolist() == [True]
    state.ingest(report_from(report("a", [gpu(0, temperature_c=HOT)], seq=2)))
    clock.advance(0.15)
    assert state.decide(["a"], small).passed.tolist() == [True]
    clock.advance(0.1)  # 0.25 s since the last settle: over twice settle_s
    assert state.decide(["a"], small).passed.tolist() == [False]


def test_warm_leaves_nothing_for_the_next_requests(clock):
    _, state, rng = fleet(clock, nodes=30)
    state.settle_s = 1.0
    names = [f"n{i}" for i in range(30)]
    raw = orjson.dumps(names)
    demands = [
        demand_of(pod("a", blocks=1)),
        demand_of(pod("b", blocks=2, qos="training", group="job")),
    ]
    for d in demands:
        state.decide(names, d, raw_names=raw)
    for n in range(10):
        state.ingest(report_from(report(f"n{n}", [gpu(0, temperature_c=rng.uniform(40, 95))])))
    state.settle()
    steps = sum(1 for _ in state.warm())
    assert steps >= 2  # at least one step per kept decision
    before = state._verdicts.recomputed_rows
    for d in demands:
        state.decide(names, d, raw_names=raw)
        agree(state, names, d, raw)
    assert state._verdicts.recomputed_rows == before


def test_while_the_warm_runs_requests_leave_the_settled_rows_to_it(clock):
    _, state, _rng = fleet(clock, nodes=30)
    state.settle_s = 1.0
    names = [f"n{i}" for i in range(30)]
    raw = orjson.dumps(names)
    small, big = demand_of(pod("a", blocks=1)), demand_of(pod("b", blocks=4, qos="training"))
    for d in (small, big):
        state.decide(names, d, raw_names=raw)
    before = {id(d): state.decide(names, d, raw_names=raw).reason.copy() for d in (small, big)}
    for n in range(10):  # every GPU of n0..n9 hot: the settle changes their verdicts
        state.ingest(report_from(report(f"n{n}", [gpu(0, temperature_c=HOT)])))
    assert state.settle() == 10
    warm = state.warm()
    next(warm)  # the facts of the settled rows; no kept decision warmed yet
    recomputed = state._verdicts.recomputed_rows
    for d in (small, big):  # answered as before the settle, nothing decided by the request
        assert (state.decide(names, d, raw_names=raw).reason == before[id(d)]).all()
    assert state._verdicts.recomputed_rows == recomputed
    # A node written again meanwhile (here: its agent's labels) is the request's to decide.
    state.set_node_labels("n3", {"edgegpu.io/rack": "r9"})
    assert state.decide(names, small, raw_names=raw).reason[3] == Reason.GPU_HOT
    for _ in warm:
        pass
    for d in (small, big):
        agree(state, names, d, raw)
        assert (state.decide(names, d, raw_names=raw).reason[:10] == Reason.GPU_HOT).all()


def test_a_settle_during_a_warm_ends_its_deferral(clock):
    _, state, _rng = fleet(clock, nodes=30)
    state.settle_s = 1.0
    names = [f"n{i}" for i in range(30)]
    raw = orjson.dumps(names)
    small = demand_of(pod("a", blocks=1))
    state.decide(names, small, raw_names=raw)
    state.ingest(report_from(report("n1", [gpu(0, temperature_c=HOT)])))
    state.settle()
    warm = state.warm()
    next(warm)
    state.settle()  # e.g. a decision that found the background late
    agree(state, names, small, raw)
    for _ in warm:  # the old warm runs out harmlessly
        pass
    agree(state, names, small, raw)


async def test_the_app_settles_pushes_in_the_background():
    app = create_app(ExtenderSettings(settle_ms=20))
    import httpx

    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    body = orjson.dumps(args_names(pod("p"), ["a"]))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://extender") as c,
    ):
        await c.post("/v1/telemetry", json=report("a", [gpu(0)], seq=1))
        await asyncio.sleep(0.1)
        assert (await c.post("/filter", content=body)).json()["NodeNames"] == ["a"]
        await c.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=HOT)], seq=2))
        await asyncio.sleep(0.1)
        failed = (await c.post("/filter", content=body)).json()["FailedNodes"]
        assert "too hot" in failed["a"]


async def test_the_settle_loop_outlives_a_failure(clock, caplog: pytest.LogCaptureFixture):
    _, state = one_node(clock, settle_s=1.0)
    calls = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return 0

    state.settle = flaky  # type: ignore[method-assign]
    task = asyncio.create_task(turns.settle_loop(state, 0.01))
    with caplog.at_level(logging.ERROR):
        while len(calls) < 3:
            await asyncio.sleep(0.01)
    task.cancel()
    assert "settling telemetry failed" in caplog.text


def test_settling_is_off_by_default(clock):
    app = create_app(clock=clock)
    state = app.state.ctx.state
    assert state.settle_s == 0
    rnd = random.Random(1)
    state.ingest(report_from(report("a", [gpu(0, temperature_c=rnd.uniform(40, 50))], seq=1)))
    state.ingest(report_from(report("a", [gpu(0, temperature_c=HOT)], seq=2)))
    assert state.decide(["a"], demand_of(pod("p"))).passed.tolist() == [False]
    assert state.settle() == 0
