"""Telemetry pushes give way to the scheduler's verbs (api/turns.py)."""

import asyncio
from collections.abc import Awaitable, Callable

from scheduler_extender.api.turns import BACKLOG, PushTurns, give_way


async def _turns_taken(turns: PushTurns, pushes: int, cancel: int | None = None) -> list[list[int]]:
    """Which pushes got through at each turn of the loop."""
    by_turn: list[list[int]] = []
    turn = 0

    async def push(i: int) -> None:
        await turns.take()
        while len(by_turn) <= turn:
            by_turn.append([])
        by_turn[turn].append(i)

    async def clock() -> None:
        nonlocal turn
        while turns.waiting or turn < 2:
            await asyncio.sleep(0)
            turn += 1

    tasks = [asyncio.ensure_future(push(i)) for i in range(pushes)]
    ticking = asyncio.ensure_future(clock())
    if cancel is not None:
        await asyncio.sleep(0)
        tasks[cancel].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await ticking
    return [t for t in by_turn if t]


def test_while_the_scheduler_is_active_pushes_go_one_per_turn_in_order():
    turns = PushTurns()
    turns.verb()
    taken = asyncio.run(_turns_taken(turns, 5))
    assert taken == [[0], [1], [2], [3], [4]]


def test_when_the_scheduler_is_quiet_every_waiting_push_goes_at_once():
    taken = asyncio.run(_turns_taken(PushTurns(), 5))
    assert taken == [[0, 1, 2, 3, 4]]


def test_a_backlog_goes_an_eighth_at_a_time_and_a_cancelled_push_gives_its_turn_away():
    turns = PushTurns()
    turns.verb()
    taken = asyncio.run(_turns_taken(turns, 2 * BACKLOG, cancel=1))
    flat = [i for t in taken for i in t]
    assert flat == [i for i in range(2 * BACKLOG) if i != 1]  # in order, the cancelled one left out
    assert len(taken[0]) == 2  # 16 waiting: two at the first turn
    assert max(len(t) for t in taken[1:]) == 1


def test_a_verb_that_arrives_while_pushes_wait_runs_before_most_of_them():
    async def scenario() -> list[str]:
        turns = PushTurns()
        turns.verb()
        order: list[str] = []

        async def push(i: int) -> None:
            await turns.take()
            order.append(f"push {i}")

        async def verb() -> None:
            turns.verb()
            order.append("verb")

        pushes = [asyncio.ensure_future(push(i)) for i in range(6)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await verb()  # the scheduler's request, arriving two turns later
        await asyncio.gather(*pushes)
        return order

    order = asyncio.run(scenario())
    assert order.index("verb") <= 2
    assert [o for o in order if o != "verb"] == [f"push {i}" for i in range(6)]


def test_background_work_that_gives_way_lets_a_request_that_came_meanwhile_go_first():
    # A request read by the poll after a step of background work is queued behind the step's
    # continuation; give_way puts the next step behind the request (one sleep(0) would not).
    async def scenario(pause: Callable[[], Awaitable[None]]) -> list[str]:
        loop = asyncio.get_running_loop()
        order: list[str] = []

        async def request() -> None:
            order.append("request")

        async def background() -> None:
            for step in range(3):
                order.append(f"step {step}")
                if step == 0:  # as an I/O callback of the next poll would start it
                    loop.call_soon(lambda: loop.create_task(request()))
                await pause()

        await background()
        await asyncio.sleep(0)
        return order

    assert asyncio.run(scenario(give_way)) == ["step 0", "request", "step 1", "step 2"]
    assert asyncio.run(scenario(lambda: asyncio.sleep(0))) == [
        "step 0", "step 1", "request", "step 2",
    ]  # fmt: skip
