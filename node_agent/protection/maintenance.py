"""Maintenance steps: what a GPU maintenance may ask this node to run, from its own allow-list.

The extender asks for a step by name (``{"maintenance": {"id", "step"}}`` in a push answer);
the agent looks the name up in its allow-list file (``--maintenance-steps``, read at every ask,
so an edit needs no restart) and runs that entry's command, never anything the answer says.
Each request id runs once, even across restarts: the state file says which id ran last and how
it ended, and one found still running after a restart is reported failed, not run again (a
half-done driver install is a person's to judge). The result is reported in every push until
the next ask. Imports the standard library, pydantic, PyYAML, the answer model and the
telemetry schema's step names.

The allow-list (YAML or JSON)::

    steps:
      driver-upgrade:
        command: ["/usr/local/sbin/upgrade-gpu-driver", "570.86.15"]
        timeout: 45m
        reboot: true          # ask the extender for a reboot once the step passes
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Annotated, Any

import durationpy
import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

from scheduler_extender.telemetry.answer import StepAsk, StepName

log = logging.getLogger("node_agent")

STATE_FILE = "maintenance-step.json"
OUTPUT_TAIL = 600
"""Characters of a step's output kept in its result (the end: where tools say what failed)."""


def _seconds(value: object) -> object:
    """A Go-style duration (``"45m"``) as seconds; a number is seconds already."""
    if isinstance(value, str):
        try:
            return durationpy.from_str(value).total_seconds()
        except (durationpy.DurationError, ValueError) as exc:
            raise ValueError(f"{value!r} is not a duration (e.g. 90s, 45m, 2h): {exc}") from None
    return value


Seconds = Annotated[float, BeforeValidator(_seconds)]


class Step(BaseModel):
    """One entry of the allow-list."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    command: list[Annotated[str, StringConstraints(min_length=1)]] = Field(min_length=1)
    """The program and its arguments (no shell: a string is one argument)."""
    timeout_s: Seconds = Field(3600.0, alias="timeout", gt=0, le=86400 * 7)
    reboot: bool = False


class AllowList(BaseModel):
    """The allow-list file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: dict[StepName, Step] = Field(default_factory=dict)


def load(path: Path | None) -> AllowList:
    """The allow-list at ``path`` (none, or no file: no step allowed); ``ValueError`` if bad."""
    if path is None:
        return AllowList()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return AllowList()
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read: {exc}") from None
    try:
        doc = yaml.safe_load(text) if text.strip() else {}
        return AllowList.model_validate(doc or {})
    except (yaml.YAMLError, ValidationError) as exc:
        raise ValueError(f"{path}: not a valid allow-list: {exc}") from None


class StepRunner:
    """The maintenance steps asked of this node, each request id once."""

    def __init__(self, allow_list: Path | None, state_dir: Path | None) -> None:
        self.allow_list = allow_list
        self.state = None if state_dir is None else state_dir / STATE_FILE
        self.result: dict[str, Any] | None = None
        """The last step's result as reported: id, step, outcome, reboot, detail."""
        self.running: asyncio.Task[None] | None = None
        self._asked: str | None = None
        self._recover()

    def _recover(self) -> None:
        """The last step's result from the state file; one that was running is a failure."""
        if self.state is None:
            return
        try:
            doc = json.loads(self.state.read_text(encoding="utf-8"))
            ask = StepAsk(id=doc["id"], step=doc["step"])
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
            log.warning(
                "maintenance state %s unreadable (%s): no step result to report", self.state, exc
            )
            return
        self._asked = ask.id
        if doc.get("outcome") in ("pass", "fail"):
            self.result = {
                "id": ask.id,
                "step": ask.step,
                "outcome": doc["outcome"],
                "reboot": doc.get("reboot") is True,
                "detail": str(doc.get("detail") or "")[:1024],
            }
        else:
            self._finish(
                ask,
                "fail",
                False,
                "the agent restarted while the step ran: not run "
                "again (a person should check the node)",
            )

    def follow(self, ask: StepAsk | None) -> None:
        """Start the asked step once per id (none while one runs)."""
        if ask is None or ask.id == self._asked or self.running is not None:
            return
        self._asked = ask.id
        self.running = asyncio.create_task(self._run(ask))

    def _save(self, doc: dict[str, Any]) -> None:
        if self.state is None:
            return
        tmp = self.state.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(doc), encoding="utf-8")
            os.replace(tmp, self.state)
        except OSError as exc:
            log.warning("maintenance state %s not written: %s", self.state, exc)

    def _finish(self, ask: StepAsk, outcome: str, reboot: bool, detail: str) -> None:
        self.result = {
            "id": ask.id,
            "step": ask.step,
            "outcome": outcome,
            "reboot": reboot and outcome == "pass",
            "detail": detail[:1024],
        }
        self._save(self.result)
        log.warning("maintenance step %s (%s): %s %s", ask.step, ask.id, outcome, detail)

    async def _run(self, ask: StepAsk) -> None:
        try:
            try:
                steps = load(self.allow_list).steps
            except ValueError as exc:
                self._finish(ask, "fail", False, str(exc))
                return
            step = steps.get(ask.step)
            if step is None:
                allowed = ", ".join(sorted(steps)) or "none"
                self._finish(
                    ask,
                    "fail",
                    False,
                    f"step {ask.step!r} is not in this agent's "
                    f"allow-list ({self.allow_list}; allowed: {allowed})",
                )
                return
            self._save({"id": ask.id, "step": ask.step, "running": True})
            log.warning(
                "a GPU maintenance asked for step %s (%s): running %s",
                ask.step,
                ask.id,
                step.command,
            )
            outcome, detail = await _execute(step)
            self._finish(ask, outcome, step.reboot, detail)
        except Exception as exc:  # the agent loop never dies of a step
            self._finish(ask, "fail", False, f"{type(exc).__name__}: {exc}")
        finally:
            self.running = None


async def _execute(step: Step) -> tuple[str, str]:
    """Run a step's command to its end or its timeout: (outcome, what it said last).

    Only the tail of its output is kept (an installer may print a lot); the whole process
    group is killed at the timeout, or when the agent stops.
    """
    try:
        proc = await asyncio.create_subprocess_exec(
            *step.command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        return "fail", f"could not run {step.command[0]}: {exc}"
    tail = bytearray()

    async def read() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            tail.extend(chunk)
            del tail[: max(0, len(tail) - 4 * OUTPUT_TAIL)]
        await proc.wait()

    try:
        await asyncio.wait_for(read(), step.timeout_s)
    except TimeoutError:
        _kill(proc)
        await proc.wait()
        return "fail", f"timed out after {step.timeout_s:.0f} s: killed"
    except asyncio.CancelledError:
        _kill(proc)
        raise
    text = tail.decode(errors="replace").strip()[-OUTPUT_TAIL:]
    if proc.returncode != 0:
        return "fail", f"exit {proc.returncode}: {text}"
    return "pass", f"exit 0: {text}" if text else "exit 0"


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, 9)
