"""The extender's side of the telemetry relay (``--ingest-port``; see ``scheduler_extender.relay``).

``listen`` opens the relay's port in the extender itself (so a port in use is a start-up error,
and the port stays open while a relay restarts). ``RelaySupervisor`` starts the relay process
on that socket, takes its frames of pushes, answers each one with ``ingest`` (the very code
that answers a push on the scheduler's port), and starts the relay again if it exits.

Without settling, each push is answered at once, taking its turn after the scheduler's verbs.
With settling (``--settle-ms``), decisions do not see a push before the next settle anyway, so
while the scheduler is active relayed pushes are held for ``HOLD_S`` and applied together
(``drain``), in steps of about ``STEP_S`` with the scheduler's requests that came meanwhile let
through between steps. A step admits its pushes one by one (a push whose body the relay found
valid comes with its digest and is not decoded here) and stores them together, their rows
written in one go (``ClusterState.ingest_many``): a push then costs the extender its share of
the step's writes, and no event-loop round trip of its own. A request
waits for one step at most, and the agent gets its answer some milliseconds later. While
pushes wait for their drain, the relay's next frames stay in the socket until it starts
(``PAUSE_WHILE_HELD``): fewer wake-ups of the extender by pushes while the scheduler waits on it.
While the scheduler is quiet they are applied at once, ``DRAIN_TURN`` per step.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any, cast

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
from scheduler_extender.telemetry.store import Received

log = logging.getLogger("scheduler_extender")

RESTART_S = 1.0
"""Wait before starting a relay that exited (so a relay that cannot start does not spin)."""

STOP_S = 5.0
"""How long a relay has to finish its pushes at shutdown before it is killed."""

HOLD_S = 0.01
"""How long relayed pushes are held to be applied together (settling on, scheduler active)."""

DRAIN_TURN = 16
"""Held pushes applied per step of the drain at most (under a millisecond of work)."""

PUSH_COST_S = 50e-6
"""What a held push is taken to cost before the drain has measured it."""

MAX_HELD = 20_000
"""Held pushes past this are applied without waiting out ``HOLD_S``."""

PAUSE_WHILE_HELD = True
"""While held pushes wait for their drain, the relay's next frames are left in the socket and
read once the drain starts (in one go, then as they come while it runs)."""


def listen(host: str, port: int, backlog: int = 4096) -> socket.socket:
    """The relay's listening socket (OSError when the port cannot be had)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


class RelaySupervisor:
    """Runs one relay process on ``listener`` and answers the pushes it passes on."""

    def __init__(
        self, ctx: AppContext, listener: socket.socket, cpus: frozenset[int] | None = None
    ) -> None:
        self.ctx = ctx
        self.listener = listener
        self.cpus = cpus
        """The CPUs the relay runs on (``--split-cpus``); None: wherever the extender may."""
        self.process: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._supervising: asyncio.Task[None] | None = None
        self._held: deque[tuple[Push, Outbox[Answer]]] = deque()
        self._draining = False
        self._push_cost = PUSH_COST_S
        """What applying a held push has cost lately (seconds): sizes the drain's steps."""
        self._paused: asyncio.Transport | None = None
        """The link to the relay while its frames wait for the next drain."""

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
            str(cert) if cert else None, str(key) if key else None, self.cpus,
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
                    if PAUSE_WHILE_HELD and self._held and not self._draining:
                        self._pause(cast(asyncio.Transport, writer.transport))  # uvloop's too
                    continue
                for push in pushes:
                    self._keep(self._answer(push, outbox))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the relay exited; the supervisor starts another
        except (FrameError, msgspec.DecodeError) as exc:
            log.error("telemetry relay sent a bad frame (%s); dropping it", exc)
        finally:
            writer.close()

    async def _answer(self, push: Push, outbox: Outbox[Answer]) -> None:
        start = time.perf_counter()
        try:
            status, out = await ingest.push(
                self.ctx, push.body, push.client, push.token, push.digest
            )
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

    def _pause(self, transport: asyncio.Transport) -> None:
        """Read no more frames until the drain of the pushes held now starts.

        Only while the scheduler is active (otherwise the drain starts at once). At 5,000
        pushes a second the relay's frames woke the extender over a thousand times a second,
        each wake-up one more chance to be busy when a scheduler request comes; frames of the
        hold wait in the socket (and the relay) instead.
        """
        if self.ctx.push_turns.busy:
            transport.pause_reading()
            self._paused = transport

    def _resume(self) -> None:
        paused, self._paused = self._paused, None
        if paused is not None and not paused.is_closing():
            paused.resume_reading()

    @property
    def held(self) -> int:
        """Pushes waiting for the next ``drain``."""
        return len(self._held)

    async def drain(self) -> None:
        """Apply and answer the held pushes in arrival order, up to ``DRAIN_TURN`` a step."""
        if self._draining:
            return
        self._draining = True
        self._resume()  # frames that waited are read between its steps and join it (or the next)
        try:
            while self._held:
                # While the scheduler is active a step takes as many pushes as fit in STEP_S
                # at what a push has cost lately (decoding it, and its share of the step's
                # writes), and the scheduler's requests that came meanwhile go first.
                start = time.perf_counter()
                if self.ctx.push_turns.busy:
                    take = max(1, min(DRAIN_TURN, int(STEP_S / max(self._push_cost, 1e-7))))
                else:
                    take = DRAIN_TURN
                step: list[tuple[Push, Outbox[Answer], Received | tuple[int, bytes]]] = []
                for _ in range(min(take, len(self._held))):
                    push, outbox = self._held.popleft()
                    step.append((push, outbox, await self._admit(push)))
                self._apply(step, start)
                cost = (time.perf_counter() - start) / len(step)
                self._push_cost += (cost - self._push_cost) / 8  # a moving average
                await give_way()
        finally:
            self._draining = False

    async def _admit(self, push: Push) -> Received | tuple[int, bytes]:
        try:
            return await ingest.admit(self.ctx, push.body, push.client, push.token, push.digest)
        except Exception as exc:  # as on the scheduler's port: a 500, never a dropped answer
            log.exception("internal error on a relayed telemetry push")
            return 500, internal_error(exc)

    def _apply(
        self,
        step: list[tuple[Push, Outbox[Answer], Received | tuple[int, bytes]]],
        start: float,
    ) -> None:
        """Store a step's reports together, then answer each of its pushes in order."""
        reports = [checked for _, _, checked in step if isinstance(checked, Received)]
        try:
            results = self.ctx.state.ingest_many(reports)
            answers = iter(
                [
                    ingest.answer(self.ctx, r.digest.node, res)
                    for r, res in zip(reports, results, strict=True)
                ]
            )
        except Exception as exc:
            log.exception("internal error on relayed telemetry pushes")
            failed = (500, internal_error(exc))
            answers = iter([failed] * len(reports))
        elapsed = time.perf_counter() - start  # each push of the step waited for all of it
        for push, outbox, checked in step:
            status, out = next(answers) if isinstance(checked, Received) else checked
            outbox.put(Answer(push.id, status, out), len(out))
            self.ctx.metrics.observe_latency("telemetry", elapsed)
