"""The extender's side of the telemetry relay (``--ingest-port``; see ``scheduler_extender.relay``).

``listen`` opens the relay's port in the extender itself (so a port in use is a start-up error,
and the port stays open while a relay restarts). ``RelaySupervisor`` starts the relay process
on that socket, takes its frames of pushes, answers each one with ``ingest.push`` (the very
code that answers a push on the scheduler's port), and starts the relay again if it exits.

Without settling, each push is answered at once, taking its turn after the scheduler's verbs.
With settling (``--settle-ms``), decisions do not see a push before the next settle anyway, so
while the scheduler is active relayed pushes are held for ``HOLD_S`` and applied together
(``drain``), in steps of about ``STEP_S`` (a few pushes) with the scheduler's requests that
came meanwhile let through between steps: a push then costs the extender its own work and no
event-loop round trip of its own (about a third less), a request waits for one step at most,
and the agent gets its answer some milliseconds later. While the scheduler is quiet they are
applied at once, ``DRAIN_TURN`` per turn.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any

import msgspec

from scheduler_extender.api import ingest
from scheduler_extender.api.context import AppContext
from scheduler_extender.api.turns import STEP_S, give_way
from scheduler_extender.relay import (
    Answer,
    FrameError,
    Outbox,
    Push,
    command,
    decode_pushes,
    read_frame,
)
from scheduler_extender.serving import internal_error

log = logging.getLogger("scheduler_extender")

RESTART_S = 1.0
"""Wait before starting a relay that exited (so a relay that cannot start does not spin)."""

STOP_S = 5.0
"""How long a relay has to finish its pushes at shutdown before it is killed."""

HOLD_S = 0.01
"""How long relayed pushes are held to be applied together (settling on, scheduler active)."""

DRAIN_TURN = 16
"""Held pushes applied per turn of the event loop at most (under a millisecond of work)."""

MAX_HELD = 20_000
"""Held pushes past this are applied without waiting out ``HOLD_S``."""


def listen(host: str, port: int, backlog: int = 4096) -> socket.socket:
    """The relay's listening socket (OSError when the port cannot be had)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


class RelaySupervisor:
    """Runs one relay process on ``listener`` and answers the pushes it passes on."""

    def __init__(self, ctx: AppContext, listener: socket.socket) -> None:
        self.ctx = ctx
        self.listener = listener
        self.process: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._supervising: asyncio.Task[None] | None = None
        self._held: deque[tuple[Push, Outbox[Answer]]] = deque()
        self._draining = False

    async def start(self) -> None:
        """Start the relay, and keep it running until ``stop``."""
        await self._spawn()
        self._supervising = asyncio.create_task(self._supervise())

    async def stop(self) -> None:
        """Stop the relay (pushes in flight are answered first, within ``STOP_S``)."""
        self._stopping = True
        if self._supervising is not None:
            self._supervising.cancel()
        await self.drain()  # answer what is held while the relay can still pass answers on
        proc = self.process
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self.listener.close()

    async def _spawn(self) -> None:
        settings = self.ctx.settings
        ours, theirs = socket.socketpair()
        cert, key = settings.tls_cert_file, settings.tls_key_file
        cmd = command(
            self.listener.fileno(), theirs.fileno(), settings.max_telemetry_bytes,
            settings.log_level, settings.ingest_nice,
            str(cert) if cert else None, str(key) if key else None,
        )  # fmt: skip
        try:
            self.process = await asyncio.create_subprocess_exec(
                *cmd,
                pass_fds=(self.listener.fileno(), theirs.fileno()),
                start_new_session=True,  # a terminal's Ctrl-C stops the extender, which stops us
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        self._keep(self._serve(reader, writer))

    async def _supervise(self) -> None:
        while True:
            assert self.process is not None
            code = await self.process.wait()
            if self._stopping:
                return
            self.ctx.metrics.relay_restarts.inc()
            log.error(
                "telemetry relay exited with status %s; starting it again in %.0f s",
                code,
                RESTART_S,
            )
            await asyncio.sleep(RESTART_S)
            await self._spawn()

    def _keep(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        outbox: Outbox[Answer] = Outbox(writer)
        try:
            while True:
                pushes = decode_pushes(await read_frame(reader))
                if self.ctx.state.settle_s > 0:
                    self._hold(pushes, outbox)
                    continue
                for push in pushes:
                    self._keep(self._answer(push, outbox))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the relay exited; the supervisor starts another
        except (FrameError, msgspec.DecodeError) as exc:
            log.error("telemetry relay sent a bad frame (%s); dropping it", exc)
        finally:
            writer.close()

    async def _answer(self, push: Push, outbox: Outbox[Answer], take_turn: bool = True) -> None:
        start = time.perf_counter()
        try:
            status, out = await ingest.push(self.ctx, push.body, push.client, push.token, take_turn)
        except Exception as exc:  # as on the scheduler's port: a 500, never a dropped answer
            log.exception("internal error on a relayed telemetry push")
            status, out = 500, internal_error(exc)
        outbox.put(Answer(push.id, status, out), len(out))
        self.ctx.metrics.observe_latency("telemetry", time.perf_counter() - start)

    def _hold(self, pushes: list[Push], outbox: Outbox[Answer]) -> None:
        first = not self._held
        self._held.extend((push, outbox) for push in pushes)
        if len(self._held) >= MAX_HELD:
            self._keep(self.drain())
        elif first:
            hold = HOLD_S if self.ctx.push_turns.busy else 0.0
            asyncio.get_running_loop().call_later(hold, lambda: self._keep(self.drain()))

    @property
    def held(self) -> int:
        """Pushes waiting for the next ``drain``."""
        return len(self._held)

    async def drain(self) -> None:
        """Apply and answer the held pushes in arrival order, ``DRAIN_TURN`` per loop turn."""
        if self._draining:
            return
        self._draining = True
        try:
            while self._held:
                # A step ends after DRAIN_TURN pushes, or after STEP_S while the scheduler is
                # active, and the scheduler's requests that came meanwhile go first.
                budget = STEP_S if self.ctx.push_turns.busy else float("inf")
                step_ends = time.perf_counter() + budget
                for _ in range(min(DRAIN_TURN, len(self._held))):
                    push, outbox = self._held.popleft()
                    await self._answer(push, outbox, take_turn=False)
                    if time.perf_counter() >= step_ends:
                        break
                await give_way()
        finally:
            self._draining = False
