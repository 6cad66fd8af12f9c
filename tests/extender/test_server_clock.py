"""The API server's clock as remediation keeps it: from ``Date`` headers, run on locally."""

from __future__ import annotations

import email.utils

from scheduler_extender.telemetry.clock import FakeClock, ServerClock


def _date(t: float) -> str:
    return email.utils.formatdate(t, usegmt=True)


def test_before_any_answer_it_is_the_local_wall_clock_and_says_so() -> None:
    local = FakeClock(wall_start=1_790_000_000.0)
    server = ServerClock(local)
    assert not server.known and server.now() == local.wall()
    server.observe("not a date")
    assert not server.known


def test_a_local_clock_hours_off_keeps_the_servers_time() -> None:
    local = FakeClock(wall_start=1_790_000_000.0 - 7200.0)  # two hours behind
    server = ServerClock(local)
    server.observe(_date(1_790_000_000.0))
    assert server.now() == 1_790_000_000.0
    local.advance(90.0)  # no answer since: it runs on by the monotonic clock
    assert server.now() == 1_790_000_090.0


def test_whole_second_dates_converge_on_the_servers_time_and_steps_are_taken() -> None:
    local = FakeClock(wall_start=0.0)
    server = ServerClock(local)
    truth = 1_790_000_000.25  # the server's clock, a quarter second past a whole second
    server.observe(_date(truth))  # says ...000: a lower bound
    assert truth - 1.0 <= server.now() <= truth
    local.advance(0.8)
    server.observe(_date(truth + 0.8))  # says ...001
    assert abs(server.now() - (truth + 0.8)) <= 0.25
    before = server.now()
    server.observe(_date(truth + 0.8 - 3600.0))  # one odd answer (a proxy, a late reply)
    assert server.now() == before
    server.observe(_date(truth + 0.8))  # back to the usual
    for _ in range(3):  # the server's clock stepped back an hour: three answers say so
        server.observe(_date(truth + 0.8 - 3600.0))
    assert abs(server.now() - (before - 3600.0)) <= 1.0


def test_answers_a_little_ahead_each_time_do_not_walk_the_clock_on() -> None:
    local = FakeClock(wall_start=0.0)
    server = ServerClock(local)
    truth = 1_790_000_000.0
    server.observe(_date(truth))
    for i in range(1, 11):  # each 1.9 s further ahead than the last: never three that agree
        server.observe(_date(truth + 1.9 * i))
    assert abs(server.now() - truth) <= 1.0


def test_answers_one_second_further_ahead_each_time_move_the_clock_a_second_at_most() -> None:
    local = FakeClock(wall_start=0.0)
    server = ServerClock(local)
    truth = 1_790_000_000.0
    server.observe(_date(truth))
    for i in range(1, 101):  # each within a second of the last one kept
        server.observe(_date(truth + 1.0 * i))
    assert abs(server.now() - truth) <= 1.0
