"""The GPU fault loop's state machine, walked with a fake clock."""

from __future__ import annotations

import itertools

from hypothesis import given, settings, strategies as st

from scheduler_extender.policy.remediation import RemediationArgs
from scheduler_extender.remediation.faults import (
    CORDONED,
    Action,
    Observation,
    Phase,
    Record,
    step,
)

ARGS = RemediationArgs(enabled=True, dryRun=False)  # confirmAfter 5s, selfTestTimeout 10m
XID = Observation(faults=("gpu0:xid:79",), gpus=(0,), cordoned=False, pods_left=2, boot="b1")
CLEAR = Observation(faults=(), gpus=(), cordoned=True, pods_left=0, boot="b1")


def ids() -> itertools.count[int]:
    return itertools.count(1)


class Walk:
    """One node through the loop: each ``see`` is one round of the leader."""

    def __init__(self, restart: bool = False) -> None:
        self.rec: Record | None = None
        self.t = 1_000_000.0
        self.actions: list[Action] = []
        self._ids = ids()
        self.restart = restart

    def see(self, obs: Observation, after_s: float = 2.0, room: bool = True) -> tuple[Action, ...]:
        self.t += after_s
        if self.restart and self.rec is not None:
            # A new leader knows only what the annotation says.
            self.rec = Record.from_json(self.rec.to_json())
        self.rec, acts = step(
            self.rec, obs, self.t, ARGS, owner="me", room=room, new_id=lambda: f"t{next(self._ids)}"
        )
        self.actions += acts
        return acts

    @property
    def phase(self) -> Phase | None:
        return None if self.rec is None else self.rec.phase


def _recover(walk: Walk) -> None:
    assert walk.see(XID) == ()
    assert walk.phase is Phase.SUSPECT
    assert walk.see(XID, after_s=5.0) == (Action.CORDON, Action.EVICT)
    assert walk.phase is Phase.DRAINING and walk.rec is not None and walk.rec.owns_cordon
    cordoned = Observation(XID.faults, XID.gpus, cordoned=True, pods_left=2, boot="b1")
    assert walk.see(cordoned) == (Action.EVICT,)
    assert walk.see(Observation(XID.faults, XID.gpus, True, 0, boot="b1")) == (Action.SELF_TEST,)
    assert walk.phase is Phase.SELF_TEST and walk.rec is not None
    request = walk.rec.request
    assert walk.see(Observation(XID.faults, XID.gpus, True, 0, boot="b1")) == ()  # waiting
    passed = Observation((), (), True, 0, verdict=(request, "pass"), boot="b1")
    assert walk.see(passed) == (Action.UNCORDON,)
    assert walk.rec is None


def test_fault_to_uncordon_after_a_passing_self_test() -> None:
    _recover(Walk())


def test_a_restart_at_every_state_resumes_from_the_annotation() -> None:
    walk = Walk(restart=True)
    _recover(walk)
    assert walk.actions == [
        Action.CORDON,
        Action.EVICT,
        Action.EVICT,
        Action.SELF_TEST,
        Action.UNCORDON,
    ]


def test_a_transient_fault_that_clears_before_confirm_after_is_never_cordoned() -> None:
    walk = Walk()
    walk.see(XID)
    assert walk.see(CLEAR, after_s=3.0) == ()
    assert walk.rec is None and walk.actions == []


def test_no_cordon_without_room_under_the_cap_and_the_wait_is_written_down_once() -> None:
    walk = Walk()
    walk.see(XID)
    assert walk.see(XID, after_s=60.0, room=False) == (Action.WAIT,)
    assert walk.phase is Phase.SUSPECT and walk.rec is not None
    assert walk.rec.waiting == "maxUnavailablePercent"
    assert walk.see(XID, room=False) == ()  # said once
    assert walk.see(XID, room=True) == (Action.CORDON, Action.EVICT)
    assert walk.rec is not None and not walk.rec.waiting


def test_a_manual_uncordon_ends_the_workflow_until_a_new_fault() -> None:
    walk = Walk()
    walk.see(XID)
    walk.see(XID, after_s=5.0)
    uncordoned = Observation(XID.faults, XID.gpus, cordoned=False, pods_left=2, boot="b1")
    assert walk.see(uncordoned) == (Action.RELEASE,)
    assert walk.phase is Phase.RELEASED
    for _ in range(5):  # the same fault: never cordoned again
        assert walk.see(uncordoned, after_s=60.0) == ()
    other = Observation(("gpu0:xid:79", "gpu0:ecc:dbe"), (0,), cordoned=False, pods_left=2)
    assert walk.see(other) == ()  # another reason on the same GPU is the same fault
    new = Observation(("gpu1:ecc:dbe",), (1,), cordoned=False, pods_left=1, boot="b1")
    walk.see(new)
    assert walk.phase is Phase.SUSPECT
    assert walk.see(new, after_s=5.0) == (Action.CORDON, Action.EVICT)


def test_the_fault_clearing_after_release_ends_the_record() -> None:
    walk = Walk()
    walk.see(XID)
    walk.see(XID, after_s=5.0)
    walk.see(Observation(XID.faults, XID.gpus, cordoned=False, pods_left=2))
    walk.see(Observation((), (), cordoned=False, pods_left=0))
    assert walk.rec is None


def test_a_node_cordoned_already_is_not_uncordoned_by_us() -> None:
    walk = Walk()
    walk.see(Observation(XID.faults, XID.gpus, cordoned=True, pods_left=0))
    assert walk.see(Observation(XID.faults, XID.gpus, True, 0), after_s=5.0) == (Action.CORDON,)
    assert walk.rec is not None and not walk.rec.owns_cordon
    walk.see(Observation(XID.faults, XID.gpus, True, 0))
    assert walk.phase is Phase.SELF_TEST
    # Its owner uncordons it: the workflow ends there too.
    assert walk.see(Observation(XID.faults, XID.gpus, cordoned=False, pods_left=0)) == (
        Action.RELEASE,
    )


def _to_self_test(walk: Walk) -> str:
    walk.see(XID)
    walk.see(XID, after_s=5.0)
    walk.see(Observation(XID.faults, XID.gpus, True, 0, boot="b1"))
    assert walk.rec is not None and walk.phase is Phase.SELF_TEST
    return walk.rec.request


def test_a_failed_self_test_asks_for_a_reboot_then_verifies() -> None:
    walk = Walk()
    request = _to_self_test(walk)
    failed = Observation(XID.faults, XID.gpus, True, 0, verdict=(request, "fail"), boot="b1")
    assert walk.see(failed) == (Action.REBOOT,)
    assert walk.phase is Phase.REBOOT_REQUESTED
    assert walk.see(failed, after_s=60.0) == ()  # the same agent boot: not back yet
    back = Observation(XID.faults, XID.gpus, True, 0, verdict=(request, "fail"), boot="b2")
    assert walk.see(back) == (Action.SELF_TEST,)
    assert walk.phase is Phase.VERIFYING and walk.rec is not None
    verified = Observation((), (), True, 0, verdict=(walk.rec.request, "pass"), boot="b2")
    assert walk.see(verified) == (Action.UNCORDON,)


def test_a_failed_self_test_with_no_boot_id_goes_to_a_human_not_to_a_reboot() -> None:
    walk = Walk()
    request = _to_self_test(walk)
    failed = Observation(XID.faults, XID.gpus, True, 0, verdict=(request, "fail"), boot=None)
    assert walk.see(failed) == (Action.NEEDS_HUMAN,)  # any boot would have looked "back"
    assert walk.rec is not None and "no boot id" in walk.rec.history[-1][2]


def test_a_drain_past_drain_timeout_goes_to_a_human_and_an_unreachable_one_evicts_nothing() -> None:
    walk = Walk()
    walk.see(XID)
    walk.see(XID, after_s=5.0)
    kept = Observation(XID.faults, XID.gpus, cordoned=True, pods_left=1, boot="b1")
    assert walk.see(kept, after_s=1700.0) == (Action.EVICT,)
    assert walk.see(kept, after_s=200.0) == (Action.NEEDS_HUMAN,)
    silent = Walk()
    silent.see(Observation(("node:not-ready-silent",), None, False, 2))
    assert silent.see(Observation(("node:not-ready-silent",), None, False, 2), after_s=5.0) == (
        Action.CORDON,
    )


def test_a_pass_while_the_fault_is_still_reported_counts_as_a_failure() -> None:
    walk = Walk()
    request = _to_self_test(walk)
    still = Observation(XID.faults, XID.gpus, True, 0, verdict=(request, "pass"), boot="b1")
    assert walk.see(still) == (Action.REBOOT,)


def test_failing_after_the_reboot_needs_a_human_and_stays_cordoned() -> None:
    walk = Walk()
    request = _to_self_test(walk)
    walk.see(Observation(XID.faults, XID.gpus, True, 0, verdict=(request, "fail"), boot="b1"))
    walk.see(Observation(XID.faults, XID.gpus, True, 0, boot="b2"))
    assert walk.rec is not None
    failed = Observation(XID.faults, XID.gpus, True, 0, verdict=(walk.rec.request, "fail"))
    assert walk.see(failed) == (Action.NEEDS_HUMAN,)
    assert walk.phase is Phase.NEEDS_HUMAN
    assert walk.see(Observation((), (), True, 0), after_s=3600.0) == ()
    assert walk.phase is Phase.NEEDS_HUMAN
    assert walk.see(Observation((), (), False, 0)) == (Action.RELEASE,)


def test_no_verdict_in_time_needs_a_human() -> None:
    walk = Walk()
    _to_self_test(walk)
    assert walk.see(CLEAR, after_s=599.0) == ()
    assert walk.see(CLEAR, after_s=2.0) == (Action.NEEDS_HUMAN,)


def test_uncordon_waits_for_the_thermal_cool_down() -> None:
    walk = Walk()
    request = _to_self_test(walk)
    passed = Observation((), (), True, 0, verdict=(request, "pass"), cooling=True)
    assert walk.see(passed) == ()
    assert walk.see(Observation((), (), True, 0, verdict=(request, "pass"))) == (Action.UNCORDON,)


def test_a_node_fault_widens_a_gpu_fault_to_the_whole_node() -> None:
    walk = Walk()
    walk.see(XID)
    walk.see(XID, after_s=5.0)
    walk.see(Observation(("node:not-ready-silent",), None, True, 3))
    assert walk.rec is not None and walk.rec.gpus is None


OBSERVATIONS = st.builds(
    Observation,
    faults=st.sampled_from([(), ("gpu0:xid:79",), ("gpu1:ecc:dbe",), ("node:not-ready-silent",)]),
    gpus=st.sampled_from([(), (0,), (1,), None]),
    cordoned=st.booleans(),
    pods_left=st.integers(0, 2),
    verdict=st.one_of(
        st.none(), st.tuples(st.sampled_from(["t1", "t2", "t3"]), st.sampled_from(["pass", "fail"]))
    ),
    boot=st.sampled_from([None, "b1", "b2"]),
    cooling=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(OBSERVATIONS, st.floats(0.5, 900.0), st.booleans()), max_size=30))
def test_every_walk_keeps_the_safety_rules(rounds: list[tuple[Observation, float, bool]]) -> None:
    """Any sequence of observations: a restart at any point changes nothing; no cordon without
    room; uncordon only after a passing verdict for our own request with the fault gone and the
    GPUs cool (or the self-test timeout passed); no cordon of a node released by an operator unless a new fault appears."""
    plain, restarted = Walk(), Walk(restart=True)
    for obs, after_s, room in rounds:
        before = plain.rec
        acts = plain.see(obs, after_s, room)
        assert restarted.see(obs, after_s, room) == acts
        assert (plain.rec is None) == (restarted.rec is None)
        if plain.rec is not None and restarted.rec is not None:
            assert plain.rec.phase is restarted.rec.phase
        if Action.CORDON in acts:
            assert room and before is not None
            assert before.phase is Phase.SUSPECT
        if Action.UNCORDON in acts:
            assert before is not None and before.phase in (Phase.SELF_TEST, Phase.VERIFYING)
            assert obs.verdict == (before.request, "pass")
            assert not obs.faults
            # Still cooling only once the self-test timeout has passed: the thermal filter keeps
            # a hot GPU free of new pods after the uncordon.
            assert not obs.cooling or plain.t - before.since > ARGS.self_test_timeout_s
        if before is not None and before.phase is Phase.RELEASED:
            assert Action.CORDON not in acts
        if plain.rec is not None and plain.rec.phase in CORDONED:
            assert plain.rec.history[-1][0] in {p.value for p in CORDONED}


def test_a_restart_at_the_very_end_of_the_confirmation_wait_changes_nothing() -> None:
    # Found by the walk above: 5 s after a fault seen at t + 3.2421875 s, the annotation's
    # microseconds read back as 4.9999995 s of waiting, and only the restarted leader held off.
    plain, restarted = Walk(), Walk(restart=True)
    fault = Observation(("gpu0:xid:79",), (), False, 0)
    for obs, after_s, room in [(CLEAR, 1.0, False), (CLEAR, 1.2421875, False), (fault, 1.0, False),
                               (fault, 5.0, True)]:  # fmt: skip
        assert restarted.see(obs, after_s, room) == plain.see(obs, after_s, room)
    assert plain.actions == restarted.actions == [Action.CORDON]
