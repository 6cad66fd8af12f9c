"""The block size kept across agent restarts, and where the starting one comes from."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from node_agent.backends.simulated import SimulatedBackend
from node_agent.deviceplugin.plugin import BlockPlugin
from node_agent.deviceplugin.state import StateFile, starting_block_mib
from node_agent.loop import Agent
from node_agent.model import DEFAULT_BLOCK_MIB
from node_agent.protection.health import HealthArgs
from node_agent.protection.power import PowerArgs
from node_agent.telemetry.exporter import AgentMetrics
from node_agent.uplink.pusher import Pusher
from scheduler_extender.policy.rules.memory import MemoryArgs


async def _nothing() -> None:
    return None


def _agent(
    state: StateFile | None, pusher: Pusher | None = None, block_mib: int | None = None
) -> Agent:
    backend = SimulatedBackend(clock=lambda: 0.0, gpus=2, node="n1", model="Tesla T4")
    backend.open()
    agent = Agent(backend, node="n1", interval_s=1.0, pusher=pusher, dry_run=True, state=state,
                  metrics=AgentMetrics(CollectorRegistry(), "n1"), health_args=HealthArgs(),
                  power_args=PowerArgs(), block_mib=block_mib)  # fmt: skip
    agent.blocks.plugin = BlockPlugin(_nothing, lambda: agent.blocks.block_mib)
    return agent


async def _first_advertised(agent: Agent) -> int:
    await agent.round()
    assert agent.blocks.plugin is not None
    return len(agent.blocks.plugin.devices())


def test_the_agents_default_block_size_is_the_policys() -> None:
    assert MemoryArgs.model_fields["block_mib"].default == DEFAULT_BLOCK_MIB


async def test_a_restarted_agent_advertises_the_block_size_the_extender_last_said_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"accepted": True, "policy": {"memory_block_mib": 8192}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        before = _agent(StateFile(tmp_path, "n1"), Pusher(["http://x"], client, clock=lambda: 0))
        assert await _first_advertised(before) == 2 * 3  # 15360 MiB T4s in 4096 MiB blocks
        assert before.blocks.block_mib == 8192  # from the answer: 1 block each from the next round
    with caplog.at_level(logging.INFO, logger="node_agent"):
        after = _agent(StateFile(tmp_path, "n1"))  # restarted, no extender in reach yet
    assert await _first_advertised(after) == 2 * 1
    assert "memory blocks of 8192 MiB (the extender's policy, as the state file kept it)" in (
        caplog.text
    )
    assert await _first_advertised(_agent(StateFile(tmp_path, "n2"))) == 2 * 3  # not n2's


@pytest.mark.parametrize(
    "text",
    [None, "", "{", '{"block_mib": 0}', '{"block_mib": "8192"}', '{"block_mib": true}', "[8192]",
     '{"block_mib": 2097152}', '{"block_mib": 1}'],
)  # fmt: skip
async def test_a_state_file_that_is_absent_or_cannot_be_trusted_falls_back_to_the_default(
    tmp_path: Path, text: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    state = StateFile(tmp_path, "n1")
    if text is not None:
        state.path.write_text(text)
    with caplog.at_level(logging.INFO, logger="node_agent"):
        agent = _agent(state)
    assert agent.blocks.block_mib == DEFAULT_BLOCK_MIB
    assert f"memory blocks of {DEFAULT_BLOCK_MIB} MiB (the policy's default)" in caplog.text
    assert _agent(state, block_mib=1024).blocks.block_mib == 1024  # --block-mib before the default


def test_the_block_size_comes_from_the_state_then_the_flag_then_the_policys_default() -> None:
    assert starting_block_mib(8192, 1024)[0] == 8192
    assert starting_block_mib(None, 1024) == (1024, "--block-mib")
    assert starting_block_mib(None, None) == (DEFAULT_BLOCK_MIB, "the policy's default")


def test_the_state_is_replaced_whole_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    state = StateFile(tmp_path, "n1")
    assert state.save_block_mib(8192) and state.save_block_mib(2048)
    assert [p.name for p in tmp_path.iterdir()] == ["agent-n1.json"]
    assert state.block_mib() == 2048


def test_a_state_folder_that_cannot_be_written_costs_nothing_but_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = StateFile(tmp_path / "absent", "n1")
    assert not state.save_block_mib(8192)
    assert "cannot be written" in caplog.text
    agent = _agent(state)
    agent.follow_policy({"memory_block_mib": 8192.0})
    agent.follow_policy({"memory_block_mib": 8192.0})  # tried once for a size, not every round
    assert agent.blocks.block_mib == 8192 and caplog.text.count("cannot be written") == 2
