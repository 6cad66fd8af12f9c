"""The reboot sentinel: asked for one boot, written only as ours, withdrawn when the asks stop."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from node_agent.backends.simulated import SimulatedBackend
from node_agent.config import AgentSettings
from node_agent.loop import Agent
from node_agent.protection.health import HealthArgs
from node_agent.protection.power import PowerArgs
from node_agent.protection.reboot import WITHDRAW_AFTER_ROUNDS, RebootSentinel, content, parse
from node_agent.telemetry.exporter import AgentMetrics
from node_agent.uplink.answer import Ask
from node_agent.uplink.pusher import Pusher

BOOT = "boot-1"


@pytest.fixture
def sentinel(tmp_path: Path) -> Path:
    return tmp_path / "reboot-required"


def test_an_ask_for_this_boot_writes_a_sentinel_that_says_it_is_ours(sentinel: Path) -> None:
    reboot = RebootSentinel(sentinel)
    reboot.follow(Ask("r1", BOOT), BOOT, every_replica_answered=True)
    written = parse(sentinel.read_text())
    assert written is not None and (written.request, written.boot) == ("r1", BOOT)
    reboot.follow(Ask("r1", BOOT), BOOT, every_replica_answered=True)  # the same ask: kept
    assert reboot.held == written


def test_an_ask_that_names_no_boot_is_refused_and_withdraws_ours(sentinel: Path) -> None:
    reboot = RebootSentinel(sentinel)
    assert reboot.follow(Ask("r0", BOOT), BOOT, every_replica_answered=True) is None
    assert reboot.follow(Ask("r1"), BOOT, every_replica_answered=True) == "no-boot"
    assert not sentinel.exists()


def test_an_ask_for_another_boot_is_refused_and_said_once(
    sentinel: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reboot = RebootSentinel(sentinel)
    with caplog.at_level(logging.WARNING, logger="node_agent"):
        for _ in range(5):
            refused = reboot.follow(Ask("r1", "boot-0"), BOOT, every_replica_answered=True)
            assert refused == "other-boot"
    assert not sentinel.exists()
    assert [r.getMessage() for r in caplog.records] == [
        "reboot r1 was decided for boot boot-0, this is boot boot-1: not asked of kured"
    ]


def test_the_sentinel_is_withdrawn_after_rounds_in_which_every_extender_answered_without_it(
    sentinel: Path,
) -> None:
    reboot = RebootSentinel(sentinel)
    reboot.follow(Ask("r1", BOOT), BOOT, every_replica_answered=True)
    for _ in range(WITHDRAW_AFTER_ROUNDS - 1):
        reboot.follow(None, BOOT, every_replica_answered=True)  # a follower's answers only
    reboot.follow(Ask("r1", BOOT), BOOT, every_replica_answered=True)  # the leader asks again
    for _ in range(10):
        reboot.follow(None, BOOT, every_replica_answered=False)  # the leader out of reach
    for _ in range(WITHDRAW_AFTER_ROUNDS - 1):
        reboot.follow(None, BOOT, every_replica_answered=True)
    assert sentinel.exists()
    reboot.follow(None, BOOT, every_replica_answered=True)
    assert not sentinel.exists() and reboot.held is None
    reboot.follow(Ask("r1", BOOT), BOOT, every_replica_answered=True)  # asked again: written
    assert sentinel.exists()


def test_an_ask_naming_another_boot_withdraws_the_sentinel_at_once(sentinel: Path) -> None:
    reboot = RebootSentinel(sentinel)
    reboot.follow(Ask("r1", BOOT), BOOT, every_replica_answered=True)
    reboot.follow(Ask("r1", BOOT), "boot-2", every_replica_answered=False)  # the agent's boot
    assert not sentinel.exists()


def test_a_sentinel_another_tool_wrote_is_never_overwritten_nor_deleted(sentinel: Path) -> None:
    sentinel.write_text("*** System restart required ***\n")  # unattended-upgrades
    reboot = RebootSentinel(sentinel)
    reboot.follow(Ask("r1", BOOT), BOOT, every_replica_answered=True)
    for _ in range(2 * WITHDRAW_AFTER_ROUNDS):
        reboot.follow(None, BOOT, every_replica_answered=True)
    reboot.follow(Ask("r2", "boot-0"), BOOT, every_replica_answered=True)
    assert sentinel.read_text() == "*** System restart required ***\n"


def test_our_sentinel_replaced_by_another_tool_is_left_to_it(sentinel: Path) -> None:
    reboot = RebootSentinel(sentinel)
    reboot.follow(Ask("r1", BOOT), BOOT, every_replica_answered=True)
    sentinel.write_text("*** System restart required ***\n")
    for _ in range(WITHDRAW_AFTER_ROUNDS):
        reboot.follow(None, BOOT, every_replica_answered=True)
    assert sentinel.read_text() == "*** System restart required ***\n"


def test_a_new_request_replaces_our_own_earlier_sentinel(sentinel: Path) -> None:
    reboot = RebootSentinel(sentinel)
    reboot.follow(Ask("r1", BOOT), BOOT, every_replica_answered=True)
    reboot.follow(Ask("r2", BOOT), BOOT, every_replica_answered=True)
    assert sentinel.read_text() == content("r2", BOOT)


def test_after_a_restart_a_sentinel_of_ours_from_another_boot_goes_and_one_of_this_boot_stays(
    sentinel: Path,
) -> None:
    sentinel.write_text(content("r1", "boot-0"))  # written before the reboot it asked for
    RebootSentinel(sentinel).follow(None, BOOT, every_replica_answered=False)
    assert not sentinel.exists()
    sentinel.write_text(content("r1", BOOT))  # written before the agent restarted
    reboot = RebootSentinel(sentinel)
    reboot.follow(None, BOOT, every_replica_answered=False)
    assert sentinel.exists()
    for _ in range(WITHDRAW_AFTER_ROUNDS):
        reboot.follow(None, BOOT, every_replica_answered=True)  # and the asks have stopped
    assert not sentinel.exists()


def test_a_sentinel_that_cannot_be_written_is_tried_again_in_the_next_rounds(
    tmp_path: Path,
) -> None:
    sentinel = tmp_path / "edgegpu" / "reboot-required"  # the folder is not mounted yet
    reboot = RebootSentinel(sentinel)
    reboot.follow(Ask("r1", BOOT), BOOT, every_replica_answered=True)
    assert reboot.held is None
    sentinel.parent.mkdir()
    reboot.follow(Ask("r1", BOOT), BOOT, every_replica_answered=True)
    assert sentinel.read_text() == content("r1", BOOT)


@pytest.mark.parametrize(
    "text",
    ["", "edgegpu remediation \n", "edgegpu remediation r1\nboot\n", "x\nedgegpu remediation r1\n",
     "edgegpu remediation r1\nboot b\nmore\n", "edgegpu remediation r 1\n"],
)  # fmt: skip
def test_only_the_agents_own_text_reads_as_its_sentinel(text: str) -> None:
    assert parse(text) is None


def test_the_agent_has_a_sentinel_of_its_own_by_default() -> None:
    settings = AgentSettings(node_name="n1")
    assert settings.reboot_sentinel is not None
    assert settings.reboot_sentinel.parent.name == "edgegpu"
    assert settings.reboot_sentinel != Path("/var/run/reboot-required")


async def test_a_reboot_ask_is_read_in_its_old_and_new_forms_and_an_invalid_one_is_named() -> None:
    answers: dict[str, object] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"accepted": True, **answers})

    clock = [0.0]
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        pusher = Pusher(["http://x"], client, clock=lambda: clock[0])
        for doc, ask in [
            ("r1", Ask("r1")),
            ({"id": "r2"}, Ask("r2")),
            ({"id": "r3", "boot": "b"}, Ask("r3", "b")),
            ({"id": "r4", "boot": 7}, None),
            ({"boot": "b"}, None),
            ({"id": ""}, None),
            ({"id": "r 6"}, None),
            ({"id": "r7\nboot b"}, None),
            ({"id": "r" * 65}, None),
            ({"id": "r8", "boot": "b" * 129}, None),
            (["r5"], None),
        ]:
            answers["reboot"] = doc
            out = await pusher.push(b"{}")
            assert out.asks.get("reboot") == ask, doc
            assert out.ignored == (() if ask else ("reboot",)), doc


async def test_the_agent_withdraws_its_sentinel_when_the_leader_stops_asking(
    sentinel: Path,
) -> None:
    """Two replicas: the leader asks, the follower never does. The leader out of reach does
    not withdraw the sentinel; the leader answering without the ask does, after a few rounds."""
    clock = [1000.0]
    leader: dict[str, object] = {"accepted": True, "reboot": {"id": "r1", "boot": "host-1"}}
    down: set[str] = set()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host in down:
            raise httpx.ConnectError("no route to host", request=request)
        return httpx.Response(200, json=leader if request.url.host == "a" else {"accepted": True})

    backend = SimulatedBackend(clock=lambda: clock[0], gpus=1, node="n1")
    backend.open()
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        pusher = Pusher(["http://a", "http://b"], client, clock=lambda: clock[0],
                        base_backoff_s=0.5, max_backoff_s=0.5)  # fmt: skip
        agent = Agent(backend, node="n1", interval_s=1.0, pusher=pusher,
                      metrics=AgentMetrics(CollectorRegistry(), "n1"), health_args=HealthArgs(),
                      power_args=PowerArgs(), clock=lambda: clock[0], dry_run=True,
                      reboot_sentinel=sentinel, host_boot_id="host-1")  # fmt: skip

        async def rounds(n: int) -> None:
            for _ in range(n):
                clock[0] += 1.0
                await agent.round()

        await rounds(1)
        assert sentinel.read_text() == content("r1", "host-1")
        down.add("a")
        await rounds(3 * WITHDRAW_AFTER_ROUNDS)
        assert sentinel.exists()
        down.clear()
        leader.pop("reboot")
        await rounds(WITHDRAW_AFTER_ROUNDS - 1)
        assert sentinel.exists()
        await rounds(1)
        assert not sentinel.exists()
