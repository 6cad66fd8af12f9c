"""Maintenance steps on the agent: only its own allow-list, each request id once, restarts."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from node_agent.protection.maintenance import STATE_FILE, StepRunner, load
from node_agent.uplink.answer import read_answer
from scheduler_extender.telemetry.answer import StepAsk


def allow(tmp_path: Path, steps: dict[str, object]) -> Path:
    path = tmp_path / "steps.yaml"
    path.write_text(json.dumps({"steps": steps}))
    return path


async def finish(runner: StepRunner) -> dict[str, object]:
    for _ in range(500):
        if runner.running is None and runner.result is not None:
            return runner.result
        await asyncio.sleep(0.01)
    raise AssertionError("the step did not finish")


async def test_an_allowed_step_runs_its_own_command_and_reports_its_end(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = allow(
        tmp_path,
        {
            "upgrade": {
                "command": [
                    sys.executable,
                    "-c",
                    f"open({str(marker)!r}, 'a').write('x'); print('driver 570')",
                ],
                "reboot": True,
            }
        },
    )
    runner = StepRunner(path, tmp_path)
    runner.follow(StepAsk(id="r1", step="upgrade"))
    result = await finish(runner)
    assert result["outcome"] == "pass" and result["reboot"] is True
    assert "driver 570" in str(result["detail"])
    runner.follow(StepAsk(id="r1", step="upgrade"))  # the same ask, every push
    await asyncio.sleep(0.05)
    assert marker.read_text() == "x"  # once


async def test_a_step_not_in_the_allow_list_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    runner = StepRunner(allow(tmp_path, {"upgrade": {"command": ["true"]}}), tmp_path)
    runner.follow(StepAsk(id="r1", step="wipe-disk"))
    result = await finish(runner)
    assert result["outcome"] == "fail"
    assert "not in this agent's allow-list" in str(result["detail"]) and "upgrade" in str(
        result["detail"]
    )
    none = StepRunner(None, None)
    none.follow(StepAsk(id="r2", step="upgrade"))
    assert (await finish(none))["outcome"] == "fail"


async def test_a_failing_and_a_hanging_step_fail(tmp_path: Path) -> None:
    path = allow(
        tmp_path,
        {
            "bad": {"command": [sys.executable, "-c", "raise SystemExit(3)"]},
            "hang": {
                "command": [sys.executable, "-c", "import time; time.sleep(60)"],
                "timeout": "1s",
            },
            "missing": {"command": [str(tmp_path / "nope")]},
        },
    )
    for step, said in (("bad", "exit 3"), ("hang", "timed out"), ("missing", "could not run")):
        runner = StepRunner(path, None)
        runner.follow(StepAsk(id=f"id-{step}", step=step))
        result = await finish(runner)
        assert result["outcome"] == "fail" and said in str(result["detail"]), result
        assert result["reboot"] is False


async def test_a_restart_reports_the_last_result_and_never_runs_a_step_again(
    tmp_path: Path,
) -> None:
    path = allow(tmp_path, {"upgrade": {"command": ["true"]}})
    runner = StepRunner(path, tmp_path)
    runner.follow(StepAsk(id="r1", step="upgrade"))
    await finish(runner)
    again = StepRunner(path, tmp_path)  # the agent restarted
    assert again.result is not None and again.result["id"] == "r1"
    again.follow(StepAsk(id="r1", step="upgrade"))
    assert again.running is None
    # A restart while a step ran: reported failed, not run a second time.
    (tmp_path / STATE_FILE).write_text(json.dumps({"id": "r2", "step": "upgrade", "running": True}))
    third = StepRunner(path, tmp_path)
    assert third.result is not None and third.result["outcome"] == "fail"
    assert "restarted while the step ran" in str(third.result["detail"])
    third.follow(StepAsk(id="r2", step="upgrade"))
    assert third.running is None


def test_a_bad_allow_list_is_a_clear_error_and_no_file_allows_nothing(tmp_path: Path) -> None:
    assert load(tmp_path / "absent.yaml").steps == {}
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: {Upgrade!: {command: []}}")
    with pytest.raises(ValueError, match="not a valid allow-list"):
        load(bad)
    bad.write_text("steps: {up: {command: [x], timeout: soon}}")
    with pytest.raises(ValueError, match="not a duration"):
        load(bad)


def test_an_answer_asks_for_a_step_by_name_only() -> None:
    answer, ignored = read_answer(b'{"maintenance": {"id": "r1", "step": "driver-upgrade"}}')
    assert answer.maintenance == StepAsk(id="r1", step="driver-upgrade")
    answer, ignored = read_answer(b'{"maintenance": {"id": "r1", "step": "rm -rf /"}}')
    assert answer.maintenance is None and ignored == ("maintenance",)
    answer, ignored = read_answer(b'{"self_test": {"id": "t1", "level": 3}}')
    assert answer.self_test is not None and answer.self_test.level == 3
    answer, ignored = read_answer(b'{"self_test": {"id": "t1", "level": 9}}')
    assert answer.self_test is None and ignored == ("self_test",)
