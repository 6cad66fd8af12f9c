"""A GPU maintenance's rounds, pure: waves, the first failure, pause, abort, a person's edits."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from pydantic import ValidationError

from scheduler_extender.remediation.maintenance import (
    ACTIVE,
    MaintenanceSpec,
    Phase,
    Progress,
    Seen,
    State,
    advance,
    start,
)

NODES = {"n0": {"pool": "a"}, "n1": {"pool": "a"}, "n2": {"pool": "a"}, "other": {"pool": "b"}}


class Fleet:
    """Three nodes whose agents and API server answer as told, one round per ``round``."""

    def __init__(self, restart: bool = False, **spec: object) -> None:
        self.spec = MaintenanceSpec.model_validate(
            {"nodeSelector": {"pool": "a"}, "step": "driver-upgrade", **spec}
        )
        self.t = 1_000_000.0
        self.progress = start(self.spec, NODES, self.t)
        self.seen = {n: Seen(boot="b1") for n in ("n0", "n1", "n2")}
        self.ids = (f"r{i}" for i in itertools.count(1))
        self.restart = restart
        self.most_cordoned = 0

    def round(self, after_s: float = 2.0) -> Progress:
        self.t += after_s
        if self.restart:  # a new leader knows only what the status says
            read = Progress.from_json(self.progress.to_json())
            assert read is not None
            self.progress = read
        self.progress = advance(self.spec, self.progress, self.seen, self.t, lambda: next(self.ids))
        # The controller and the API server: our cordon where the entry wants it.
        for name, run in self.progress.nodes.items():
            s = self.seen[name]
            if run.wants_marks and not s.ours:
                self.seen[name] = replace(s, ours=True, cordoned=True)
            elif not run.wants_marks and s.ours and run.state is not State.FAILED:
                self.seen[name] = replace(s, ours=False, cordoned=False)
        cordoned = sum(s.cordoned for s in self.seen.values())
        self.most_cordoned = max(self.most_cordoned, cordoned)
        return self.progress

    def state(self, name: str) -> State:
        return self.progress.nodes[name].state

    def agent(
        self,
        name: str,
        step: str = "pass",
        verdict: str = "pass",
        reboot: bool = False,
    ) -> None:
        """The node's agent answers whatever it was asked last."""
        run = self.progress.nodes[name]
        s = self.seen[name]
        if run.state is State.STEP:
            self.seen[name] = replace(s, step=(run.request, step, reboot, "exit 0"))
        elif run.state is State.VALIDATING:
            self.seen[name] = replace(s, verdict=(run.request, verdict, "dcgm-diag-r1: fail"))

    def through(self, name: str) -> None:
        """One node from draining to done."""
        assert self.state(name) is State.DRAINING
        self.round()  # our cordon seen, and no GPU pods: drained
        assert self.state(name) is State.STEP
        self.agent(name)
        self.round()
        assert self.state(name) is State.VALIDATING
        self.agent(name)
        self.round()
        assert self.state(name) is State.DONE


@pytest.mark.parametrize("restart", [False, True], ids=["one leader", "a new leader each round"])
def test_three_nodes_with_max_unavailable_one_are_done_one_at_a_time(restart: bool) -> None:
    f = Fleet(restart=restart)
    assert set(f.progress.nodes) == {"n0", "n1", "n2"}  # the selector's nodes only
    f.round()
    assert [f.state(n) for n in ("n0", "n1", "n2")] == [
        State.DRAINING,
        State.PENDING,
        State.PENDING,
    ]
    f.through("n0")
    assert f.state("n1") is State.PENDING  # not while n0 still carries our cordon
    f.round()
    assert f.state("n1") is State.DRAINING
    f.through("n1")
    f.round()
    f.through("n2")
    assert f.round().phase is Phase.SUCCEEDED
    assert f.most_cordoned == 1
    assert all(not s.cordoned for s in f.seen.values())


def test_a_failing_validation_stops_the_maintenance_and_leaves_the_rest_untouched() -> None:
    f = Fleet()
    f.round()
    f.through("n0")
    f.round()
    f.round()
    f.round()
    f.agent("n1")
    f.round()
    f.agent("n1", verdict="fail")
    p = f.round()
    assert f.state("n1") is State.FAILED and "validation failed" in p.nodes["n1"].message
    assert p.phase is Phase.FAILED
    assert f.seen["n1"].cordoned and p.nodes["n1"].wants_marks  # kept for a person
    for _ in range(3):
        f.round(after_s=600)
    assert f.state("n2") is State.PENDING and not f.seen["n2"].cordoned


def test_a_failed_step_and_a_step_that_never_answers_fail_the_node() -> None:
    f = Fleet()
    f.round()
    f.round()
    f.round()
    f.agent("n0", step="fail")
    assert f.round().nodes["n0"].state is State.FAILED
    g = Fleet(stepTimeout="10m")
    g.round()
    g.round()
    g.round()
    g.round(after_s=597)  # 599 s after the ask
    assert g.state("n0") is State.STEP
    g.round(after_s=2)
    assert g.state("n0") is State.FAILED and "stepTimeout" in g.progress.nodes["n0"].message


def test_a_step_that_asks_for_a_reboot_waits_for_a_new_boot_before_validating() -> None:
    f = Fleet()
    f.round()
    f.round()
    f.round()
    f.agent("n0", reboot=True)
    f.round()
    run = f.progress.nodes["n0"]
    assert run.state is State.REBOOTING and run.boot == "b1"
    f.round(after_s=60)
    assert f.state("n0") is State.REBOOTING  # the same boot: not back yet
    f.seen["n0"] = replace(f.seen["n0"], boot="b2")
    f.round()
    assert f.state("n0") is State.VALIDATING


def test_a_node_not_back_after_its_reboot_fails_at_the_reboot_timeout() -> None:
    f = Fleet(rebootTimeout="5m")
    f.round()
    f.round()
    f.round()
    f.agent("n0", reboot=True)
    f.round()
    f.round(after_s=301)
    assert f.state("n0") is State.FAILED


def test_a_drain_a_budget_keeps_fails_at_the_drain_timeout() -> None:
    f = Fleet(drainTimeout="30m")
    f.seen["n0"] = replace(f.seen["n0"], pods_left=2)
    f.round()
    f.round()
    f.round(after_s=1700)
    assert f.state("n0") is State.DRAINING
    f.round(after_s=200)
    assert f.state("n0") is State.FAILED and "2 GPU pod(s) left" in f.progress.nodes["n0"].message


def test_an_uncordon_by_a_person_during_the_step_fails_the_node_and_hands_it_back() -> None:
    f = Fleet()
    f.round()
    f.round()
    f.round()
    assert f.state("n0") is State.STEP
    f.seen["n0"] = replace(f.seen["n0"], cordoned=False)  # kubectl uncordon
    p = f.round()
    run = p.nodes["n0"]
    assert run.state is State.FAILED and "uncordoned by someone else" in run.message
    assert not run.wants_marks  # left as the person left it
    assert p.phase is Phase.FAILED


def test_paused_freezes_every_deadline_and_resume_starts_them_over() -> None:
    f = Fleet(stepTimeout="10m")
    f.round()
    f.round()
    f.round()
    f.spec = f.spec.model_copy(update={"paused": True})
    assert f.round(after_s=3600).phase is Phase.PAUSED
    assert f.state("n0") is State.STEP
    f.spec = f.spec.model_copy(update={"paused": False})
    f.round()
    f.round(after_s=500)
    assert f.state("n0") is State.STEP  # 10 minutes from the resume, not from the ask


def test_abort_hands_back_a_draining_node_and_lets_a_step_finish() -> None:
    f = Fleet(maxUnavailable=2)
    f.seen["n1"] = replace(f.seen["n1"], pods_left=1)
    f.round()
    f.round()
    f.round()
    assert f.state("n0") is State.STEP and f.state("n1") is State.DRAINING
    f.spec = f.spec.model_copy(update={"abort": True})
    p = f.round()
    assert f.state("n1") is State.PENDING and p.phase is Phase.RUNNING
    f.agent("n0")
    f.round()
    f.agent("n0")
    f.round()
    assert f.state("n0") is State.DONE
    assert f.round().phase is Phase.ABORTED
    assert f.state("n2") is State.PENDING and not f.seen["n1"].cordoned


def test_nodes_already_unavailable_count_against_max_unavailable() -> None:
    f = Fleet()
    f.seen["other"] = Seen()
    f.seen["n2"] = replace(f.seen["n2"], unavailable=True)  # NotReady, say
    f.round()
    assert f.state("n0") is State.PENDING  # n2 takes the one place
    assert "maxUnavailable" in f.progress.message


def test_a_node_held_by_the_fault_loop_or_opted_out_is_not_started() -> None:
    f = Fleet()
    f.seen["n0"] = replace(f.seen["n0"], held_elsewhere="the fault loop holds it (draining)")
    f.seen["n1"] = replace(f.seen["n1"], opted_out=True)
    f.round()
    assert f.state("n0") is State.PENDING
    assert f.state("n1") is State.SKIPPED
    assert f.state("n2") is State.DRAINING


def test_faults_reported_after_a_passing_validation_fail_the_node() -> None:
    f = Fleet()
    f.round()
    f.round()
    f.round()
    f.agent("n0")
    f.round()
    f.agent("n0")
    f.seen["n0"] = replace(f.seen["n0"], faults=("gpu0:xid:79",))
    f.round()
    assert f.state("n0") is State.FAILED and "gpu0:xid:79" in f.progress.nodes["n0"].message


def test_a_verdict_for_another_request_is_not_taken() -> None:
    f = Fleet()
    f.round()
    f.round()
    f.round()
    f.seen["n0"] = replace(f.seen["n0"], step=("an-old-id", "pass", False, ""))
    f.round()
    assert f.state("n0") is State.STEP


def test_a_spec_must_name_its_nodes_and_a_known_step() -> None:
    with pytest.raises(ValidationError, match="name the nodes"):
        MaintenanceSpec.model_validate({"step": "x"})
    with pytest.raises(ValidationError):
        MaintenanceSpec.model_validate({"nodes": ["n0"], "step": "rm -rf /"})
    with pytest.raises(ValidationError, match="label key"):
        MaintenanceSpec.model_validate({"nodeSelector": {"a b": "c"}, "step": "x"})
    spec = MaintenanceSpec.model_validate({"nodes": ["n0", "gone"], "step": "x"})
    p = start(spec, NODES, 0.0)
    assert set(p.nodes) == {"n0", "gone"}
    p = advance(spec, p, {"n0": Seen()}, 10.0, lambda: "r")
    assert p.nodes["gone"].state is State.SKIPPED and p.nodes["n0"].state in ACTIVE


def test_a_status_is_read_back_as_it_was_written() -> None:
    f = Fleet()
    f.round()
    f.round()
    assert Progress.from_json(f.progress.to_json()) == f.progress
    assert Progress.from_json(None) is None
    with pytest.raises(ValueError, match="not a maintenance"):
        Progress.from_json({"phase": "Running", "nodes": {"n0": {"state": "sideways"}}})


def test_a_node_still_carrying_our_taint_holds_its_place_until_the_uncordon_lands() -> None:
    f = Fleet()
    f.round()
    f.through("n0")
    f.seen["n0"] = replace(f.seen["n0"], ours=True, cordoned=True)  # the uncordon failed
    f.progress = advance(f.spec, f.progress, f.seen, f.t + 2, lambda: "r")
    assert f.state("n1") is State.PENDING


def test_a_pending_node_out_of_reach_is_skipped_after_the_drain_timeout() -> None:
    f = Fleet(drainTimeout="10m")
    f.seen["n0"] = replace(f.seen["n0"], unavailable=True, may_act=False, stuck_s=2.0)
    f.round(after_s=3600)  # the maintenance is old; the node has been out of reach 2 s
    assert f.state("n0") is State.PENDING and f.state("n1") is State.PENDING  # n0 holds it
    f.seen["n0"] = replace(f.seen["n0"], stuck_s=601.0)
    f.round()
    assert f.state("n0") is State.SKIPPED and "drainTimeout" in f.progress.nodes["n0"].message
    assert f.state("n1") is State.DRAINING


def test_our_taint_without_our_cordon_is_not_taken_as_marked() -> None:
    f = Fleet()
    f.round()
    f.seen["n0"] = replace(f.seen["n0"], ours=True, cordoned=False)  # a taint put there by hand
    f.progress = advance(f.spec, f.progress, f.seen, f.t + 2, lambda: "r")
    run = f.progress.nodes["n0"]
    assert run.state is State.DRAINING and not run.marked  # the controller cordons it first


def test_a_status_time_out_of_range_is_not_read() -> None:
    f = Fleet()
    doc = f.progress.to_json()
    doc["nodes"]["n0"]["since"] = "9999-12-31T23:59:59-14:00"
    with pytest.raises(ValueError, match="out of range"):
        Progress.from_json(doc)


def test_a_driver_version_target_skips_nodes_at_it_and_fails_one_that_missed_it() -> None:
    f = Fleet(driverVersion="575.51.03")
    f.seen["n0"] = replace(f.seen["n0"], drivers=("575.51.03", "575.51.03"))
    f.seen["n1"] = replace(f.seen["n1"], drivers=("570.86.15", "570.86.15"))
    f.round()
    assert f.state("n0") is State.SKIPPED and "already at driver" in f.progress.nodes["n0"].message
    assert f.state("n1") is State.DRAINING
    f.round()
    f.agent("n1")
    f.round()
    f.agent("n1")  # the validation passes, but the step did not change the driver
    f.round()
    run = f.progress.nodes["n1"]
    assert run.state is State.FAILED and "570.86.15, not 575.51.03" in run.message
    g = Fleet(driverVersion="575.51.03")
    g.round()
    g.round()
    g.agent("n0")
    g.round()
    g.seen["n0"] = replace(g.seen["n0"], drivers=("575.51.03",))
    g.agent("n0")
    g.round()
    assert g.state("n0") is State.DONE


@pytest.mark.parametrize(
    ("spec", "fails_after_s"),
    [
        ({}, 1800),
        ({"validationLevel": 3}, 7200),
        ({"validationLevel": 3, "validationTimeout": "40m"}, 2400),
    ],
)
def test_a_validation_that_never_answers_fails_later_at_the_long_level(
    spec: dict[str, object], fails_after_s: float
) -> None:
    f = Fleet(**spec)
    f.round()
    f.round()
    f.agent("n0")
    f.round()
    assert f.state("n0") is State.VALIDATING
    f.round(after_s=fails_after_s - 10)
    assert f.state("n0") is State.VALIDATING
    f.round(after_s=20)
    assert f.state("n0") is State.FAILED
    assert "validationTimeout" in f.progress.nodes["n0"].message


def test_a_level_edited_during_a_validation_applies_to_the_next_node_not_the_running_test() -> None:
    f = Fleet(restart=True, validationLevel=3)
    f.round()
    f.round()
    f.agent("n0")
    f.round()
    assert f.state("n0") is State.VALIDATING and f.progress.nodes["n0"].level == 3
    f.spec = f.spec.model_copy(update={"validation_level": 1})  # a person edits the spec
    f.round(after_s=1900)  # past the 30 min of level 1, not the 2 h of the level asked
    assert f.state("n0") is State.VALIDATING
    assert f.progress.nodes["n0"].level == 3  # read back from the status by a new leader
