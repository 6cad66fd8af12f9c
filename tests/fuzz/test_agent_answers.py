"""Property-based fuzzing of the node agent's reading of push answers (Hypothesis).

Arbitrary JSON answers, shaped like the real one or not, and arbitrary bytes go through the
agent's parsing and its policy bounds: nothing raises, no value outside its checked range gets
through, and local protection never ends up looser than the agent's flags. A fixed-seed run of
``EDGEGPU_FUZZ_CASES`` cases per test (a few by default, as part of ``make test``; ``make fuzz``
raises it).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re

import httpx
from hypothesis import HealthCheck, example, given, settings, strategies as st
from prometheus_client import CollectorRegistry

from node_agent.backends.simulated import SimulatedBackend
from node_agent.loop import Agent
from node_agent.protection.health import HealthArgs
from node_agent.protection.policy import within_flags
from node_agent.protection.power import PowerArgs
from node_agent.telemetry.exporter import AgentMetrics
from node_agent.uplink.answer import read_answer
from node_agent.uplink.pusher import Pusher
from scheduler_extender.telemetry.answer import (
    MAX_GPU_INDEX,
    MAX_LENT_BLOCKS,
    MAX_TEMP_RANGE_C,
    POLICY_RANGES,
)

CASES = int(os.environ.get("EDGEGPU_FUZZ_CASES", "25"))
FUZZ = settings(
    max_examples=CASES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
KNOWN_FIELDS = {
    "answer", "accepted", "performance_gpus", "max_temp_c", "lend_blocks", "self_test", "reboot",
    "policy", "policy.power_saving", *(f"policy.{key}" for key in POLICY_RANGES),
}  # fmt: skip
ID = re.compile(r"[\x21-\x7e]{1,64}")
BOOT = re.compile(r"[\x21-\x7e]{1,128}")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")

numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(-10, 2_000_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-1_000.0, 100_000.0),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=80))
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=20,
)
texts = st.one_of(st.text(max_size=140), st.from_regex(r"[a-z0-9-]{1,70}", fullmatch=True))
asks = st.one_of(
    json_values,
    texts,
    st.fixed_dictionaries({}, optional={"id": texts | json_values, "boot": texts | json_values}),
)
in_range = {
    **{key: st.floats(*bounds) for key, bounds in POLICY_RANGES.items()},
    "memory_block_mib": st.integers(*map(int, POLICY_RANGES["memory_block_mib"])),
    "power_saving": st.booleans(),
}
"""A valid value for each field of an answer's policy."""
policies = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional=in_range),
    st.fixed_dictionaries(
        {},
        optional={
            **{key: numbers | json_values for key in POLICY_RANGES},
            "power_saving": st.booleans() | json_values,
        },
    ),
)
answers = st.fixed_dictionaries(
    {},
    optional={
        "accepted": st.booleans() | json_values,
        "performance_gpus": st.lists(st.integers(-5, 2_000) | json_values, max_size=8)
        | json_values,
        "max_temp_c": numbers | json_values,
        "policy": policies,
        "lend_blocks": st.dictionaries(texts, st.integers(-5, 2_000) | json_values, max_size=6)
        | json_values,
        "self_test": asks,
        "reboot": asks,
        "reason": json_values,
    },
)
bodies = st.one_of(
    answers.map(lambda doc: json.dumps(doc).encode()),
    json_values.map(lambda doc: json.dumps(doc).encode()),
    st.binary(max_size=512),
    st.text(max_size=200).map(str.encode),
)
flags = st.builds(
    PowerArgs,
    max_temp_c=st.floats(1.0, 150.0),
    cool_down_s=st.floats(0.0, 86_400.0),
    saving_enabled=st.booleans(),
    threshold_pct=st.floats(0.0, 100.0),
)


def _within(value: float, bounds: tuple[float, float]) -> bool:
    return math.isfinite(value) and bounds[0] <= value <= bounds[1]


def _saving_threshold(enabled: bool, threshold_pct: float) -> float:
    """The utilisation under which power saving engages: 0 (never) while it is off."""
    return threshold_pct if enabled else 0.0


SAVING_OFF = json.dumps({"policy": {"power_saving": False}}).encode()
LOWER_THRESHOLD = json.dumps({"policy": {"power_saving_threshold_pct": 0}}).encode()


@FUZZ
@given(body=bodies, flags=flags)
@example(body=SAVING_OFF, flags=PowerArgs(saving_enabled=True, threshold_pct=70.0))
@example(body=LOWER_THRESHOLD, flags=PowerArgs(saving_enabled=True, threshold_pct=70.0))
def test_no_answer_makes_the_agent_raise_take_a_value_out_of_range_or_loosen_its_protection(
    body: bytes, flags: PowerArgs
) -> None:
    answer, ignored = read_answer(body)
    assert set(ignored) <= KNOWN_FIELDS
    assert isinstance(answer.accepted, bool)
    assert answer.max_temp_c is None or _within(answer.max_temp_c, MAX_TEMP_RANGE_C)
    assert all(type(g) is int and 0 <= g <= MAX_GPU_INDEX for g in answer.performance_gpus)
    for uuid, blocks in answer.lend_blocks.items():
        assert 0 < len(uuid) <= 128 and not CONTROL.search(uuid)
        assert type(blocks) is int and 0 < blocks <= MAX_LENT_BLOCKS
    for ask in answer.asks.values():
        assert ID.fullmatch(ask.id) and (ask.boot is None or BOOT.fullmatch(ask.boot))
    policy = answer.policy.said() if answer.policy is not None else {}
    for key, value in policy.items():
        if key == "power_saving":
            assert isinstance(value, bool)
        else:
            assert type(value) is float and _within(value, POLICY_RANGES[key]), (key, value)
    assert float(policy.get("memory_block_mib", 256.0)).is_integer()
    bounded, _ = within_flags(policy, flags)
    assert float(bounded.get("max_temp_c", flags.max_temp_c)) <= flags.max_temp_c
    assert float(bounded.get("cool_down_s", flags.cool_down_s)) >= flags.cool_down_s
    saving = bool(bounded.get("power_saving", flags.saving_enabled))
    assert saving or not flags.saving_enabled
    threshold = float(bounded.get("power_saving_threshold_pct", flags.threshold_pct))
    assert _saving_threshold(saving, threshold) >= _saving_threshold(
        flags.saving_enabled, flags.threshold_pct
    )


async def _two_rounds(body: bytes, flags: PowerArgs) -> Agent:
    clock = [1000.0]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body)

    backend = SimulatedBackend(clock=lambda: clock[0], gpus=2, seed=1, node="n1")
    backend.open()
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        agent = Agent(
            backend, node="n1", interval_s=1.0, metrics=AgentMetrics(CollectorRegistry(), "n1"),
            health_args=HealthArgs(max_temp_c=flags.max_temp_c), power_args=flags,
            pusher=Pusher(["http://x"], client, clock=lambda: clock[0]),
            clock=lambda: clock[0], dry_run=True, reboot_sentinel=None,
        )  # fmt: skip
        for _ in range(2):
            clock[0] += 1.0
            result = await agent.round()
            assert result.push is not None
            assert set(result.push.results.values()) <= {"ok", "ignored"}
    return agent


@FUZZ
@given(body=bodies, flags=flags)
@example(body=LOWER_THRESHOLD, flags=PowerArgs(saving_enabled=True, threshold_pct=70.0))
def test_no_answer_stops_the_agent_pushing_or_loosens_the_protection_it_runs_with(
    body: bytes, flags: PowerArgs
) -> None:
    agent = asyncio.run(_two_rounds(body, flags))
    p = agent.protection.power_args
    assert (
        p.max_temp_c <= flags.max_temp_c
        and agent.protection.health_args.max_temp_c <= flags.max_temp_c
    )
    assert p.cool_down_s >= flags.cool_down_s
    assert p.saving_enabled or not flags.saving_enabled
    assert _saving_threshold(p.saving_enabled, p.threshold_pct) >= _saving_threshold(
        flags.saving_enabled, flags.threshold_pct
    )
    assert agent.blocks.block_mib >= 256
