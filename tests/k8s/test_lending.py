"""Idle memory blocks lent to best-effort pods and taken back (memory.idleRelease).

A 16 GiB GPU has 4 blocks of 4 GiB. An inference pod holds 3 of them and uses 1 GiB: after
``after`` of that it lends 2 blocks, which a best-effort pod may borrow and no other pod may;
when its use grows again, the leader evicts the borrower.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scheduler_extender.domain import Assignment, PodDemand, QosClass
from scheduler_extender.policy.base import Reason
from scheduler_extender.policy.document import parse_policy
from scheduler_extender.telemetry.decode import report_from
from tests.builders import gpu, report
from tests.fakes.fake_kube import FakeKube
from tests.k8s.test_fault_loop import Cluster

LENDING = {"remediation": {"enabled": True, "dryRun": False},
           "memory": {"idleRelease": {"enabled": True, "after": "5m"}}}  # fmt: skip


def hold(c: Cluster, name: str, blocks: int, qos: QosClass, at: float) -> None:
    c.kube.add_pod(name, node="n0", uid=f"uid-{name}", phase="Running")
    c.state.assign(
        Assignment(f"uid-{name}", "default", name, "n0", (0,), ("GPU-0000",), blocks, False,
                   qos, None, at),
        authoritative=True,
    )  # fmt: skip


def sample(c: Cluster, uses: dict[str, float]) -> None:
    """One report of n0: GPU 0 with each pod's process using that many MiB."""
    c.seq += 1
    procs = [
        {"pid": 100 + k, "pod_uid": f"uid-{name}", "used_mib": mib}
        for k, (name, mib) in enumerate(uses.items())
    ]
    used = 300.0 + sum(uses.values())  # the driver's own, and the pods'
    c.state.ingest(
        report_from(report("n0", [gpu(0, memory_used_mib=used, processes=procs), gpu(1)],
                           seq=c.seq))
    )  # fmt: skip


def fits(c: Cluster, blocks: int, qos: QosClass) -> Reason:
    demand = PodDemand("uid-new", "default", "new", qos, mem_blocks=blocks)
    ev = c.state.evaluate(["n0"], demand)
    # GPU 1 is free: only GPU 0 is asked about.
    return Reason.OK if ev.passed[0] and int(ev.gpus[0][0]) == 0 else Reason(int(ev.reason[0]))


@pytest.fixture
def c(kube: FakeKube, kubeconfig: Path) -> Cluster:
    cluster = Cluster(kube, kubeconfig, count=1)
    cluster.state.set_policy(parse_policy({"spec": LENDING}))
    # GPU 1 of n0 is taken whole, so that only GPU 0 can answer a block request.
    cluster.state.assign(
        Assignment("uid-whole", "default", "whole", "n0", (1,), ("GPU-0001",), 0, True,
                   QosClass.TRAINING, None, 0.0),
        authoritative=True,
    )  # fmt: skip
    return cluster


def test_a_pod_idle_long_enough_lends_its_idle_blocks_to_best_effort_pods_only(
    c: Cluster,
) -> None:
    hold(c, "owner", 3, QosClass.INFERENCE, 0.0)
    sample(c, {"owner": 1024.0})
    assert c.state.lent_blocks("n0") == {}
    assert fits(c, 2, QosClass.BEST_EFFORT) == Reason.NO_FREE_BLOCKS  # not idle long enough
    c.clock.advance(301.0)
    sample(c, {"owner": 1024.0})
    # 3 blocks (12 GiB) of which 1 GiB used: 2 whole blocks idle, 1 block free besides.
    assert c.state.lent_blocks("n0") == {"GPU-0000": 2}
    assert fits(c, 3, QosClass.BEST_EFFORT) == Reason.OK
    assert fits(c, 4, QosClass.BEST_EFFORT) == Reason.NO_FREE_BLOCKS
    assert fits(c, 2, QosClass.INFERENCE) == Reason.NO_FREE_BLOCKS  # lent to best-effort only
    assert fits(c, 1, QosClass.INFERENCE) == Reason.OK


async def test_the_borrower_is_evicted_as_soon_as_the_owner_grows(c: Cluster) -> None:
    hold(c, "owner", 3, QosClass.INFERENCE, 0.0)
    sample(c, {"owner": 1024.0})
    c.clock.advance(301.0)
    sample(c, {"owner": 1024.0})
    hold(c, "borrower", 3, QosClass.BEST_EFFORT, 400.0)
    hold(c, "early", 0, QosClass.BEST_EFFORT, 1.0)  # holds no blocks: nothing to give back
    sample(c, {"owner": 1024.0, "borrower": 2000.0})
    assert c.state.borrowers_to_evict() == []
    r = c.remediator()
    await r.step()
    assert "borrower" in c.pods()
    sample(c, {"owner": 9000.0, "borrower": 2000.0})  # over 70 % of its 12 GiB: not idle
    assert c.state.lent_blocks("n0") == {}
    assert [(a.name, short) for a, short in c.state.borrowers_to_evict()] == [("borrower", 2)]
    await r.step()
    assert "borrower" not in c.pods() and "owner" in c.pods()
    (event,) = c.events("EdgeGPUEvicted")
    assert event["involvedObject"]["name"] == "borrower" and "2 block(s) short" in event["message"]
    await r.step()  # still counted until the pod is gone: not evicted twice
    assert len(c.events("EdgeGPUEvicted")) == 1


@pytest.mark.parametrize(
    "spec",
    [
        {"remediation": {"enabled": True, "dryRun": False}},  # idleRelease off (the default)
        {"memory": {"idleRelease": {"enabled": True}}},  # nobody to take the blocks back
    ],
)
def test_nothing_is_lent_unless_idle_release_and_remediation_are_both_on(
    c: Cluster, spec: dict[str, Any]
) -> None:
    c.state.set_policy(parse_policy({"spec": spec}))
    hold(c, "owner", 3, QosClass.INFERENCE, 0.0)
    sample(c, {"owner": 0.0})
    c.clock.advance(3600.0)
    sample(c, {"owner": 0.0})
    assert c.state.lent_blocks("n0") == {}
    assert fits(c, 2, QosClass.BEST_EFFORT) == Reason.NO_FREE_BLOCKS
    assert c.state.borrowers_to_evict() == []


def test_best_effort_pods_never_lend_and_busy_pods_restart_the_wait(c: Cluster) -> None:
    hold(c, "owner", 3, QosClass.INFERENCE, 0.0)
    sample(c, {"owner": 1024.0})
    c.clock.advance(200.0)
    sample(c, {"owner": 10000.0})  # busy: the wait starts again
    c.clock.advance(200.0)
    sample(c, {"owner": 1024.0})
    c.clock.advance(200.0)
    sample(c, {"owner": 1024.0})
    assert c.state.lent_blocks("n0") == {}
    c.clock.advance(101.0)
    sample(c, {"owner": 1024.0})
    assert c.state.lent_blocks("n0") == {"GPU-0000": 2}
    c.state.release("uid-owner")
    hold(c, "be-owner", 3, QosClass.BEST_EFFORT, 900.0)
    sample(c, {"be-owner": 0.0})
    c.clock.advance(400.0)
    sample(c, {"be-owner": 0.0})
    assert c.state.lent_blocks("n0") == {}


def _lend_two(c: Cluster) -> None:
    """The owner holds 3 blocks of GPU 0 and has used 1 GiB for over 5 minutes: it lends 2."""
    hold(c, "owner", 3, QosClass.INFERENCE, 0.0)
    sample(c, {"owner": 1024.0})
    c.clock.advance(301.0)
    sample(c, {"owner": 1024.0})
    assert c.state.lent_blocks("n0") == {"GPU-0000": 2}


def test_borrowers_fill_lent_blocks_before_the_gpus_own_room(c: Cluster) -> None:
    _lend_two(c)
    hold(c, "borrower", 2, QosClass.BEST_EFFORT, 400.0)
    sample(c, {"owner": 1024.0, "borrower": 2000.0})
    # The GPU's fourth block is still free for any pod; the lent ones are taken.
    assert fits(c, 1, QosClass.INFERENCE) == Reason.OK
    assert fits(c, 2, QosClass.BEST_EFFORT) == Reason.NO_FREE_BLOCKS
    assert c.state.borrowers_to_evict() == []


def test_a_best_effort_pod_takes_a_gpus_own_room_before_lent_blocks(c: Cluster) -> None:
    _lend_two(c)
    c.state.release("uid-whole")  # GPU 1 is free now: 4 blocks of its own
    sample(c, {"owner": 1024.0})
    demand = PodDemand("uid-new", "default", "new", QosClass.BEST_EFFORT, mem_blocks=2)
    ev = c.state.evaluate(["n0"], demand)
    assert ev.passed[0] and int(ev.gpus[0][0]) == 1  # not GPU 0, where it would borrow


def test_a_pod_whose_processes_are_not_seen_lends_nothing(c: Cluster) -> None:
    hold(c, "owner", 3, QosClass.INFERENCE, 0.0)
    sample(c, {})  # the backend attributes no process to it: its use is not known
    c.clock.advance(3600.0)
    sample(c, {})
    assert c.state.lent_blocks("n0") == {}


def test_a_dry_run_lends_nothing_since_it_could_not_take_the_blocks_back(c: Cluster) -> None:
    c.state.set_policy(parse_policy({"spec": {**LENDING, "remediation": {"enabled": True}}}))
    hold(c, "owner", 3, QosClass.INFERENCE, 0.0)
    sample(c, {"owner": 0.0})
    c.clock.advance(3600.0)
    sample(c, {"owner": 0.0})
    assert c.state.lent_blocks("n0") == {}


def test_after_a_restart_borrowers_stay_until_the_owners_are_known_again(
    kube: FakeKube, kubeconfig: Path
) -> None:
    # A new extender reads both pods back from their annotations and has lent nothing yet.
    c = Cluster(kube, kubeconfig, count=1)
    c.state.set_policy(parse_policy({"spec": LENDING}))
    hold(c, "owner", 3, QosClass.INFERENCE, 0.0)
    hold(c, "borrower", 2, QosClass.BEST_EFFORT, 400.0)
    both = {"owner": 1024.0, "borrower": 2000.0}
    sample(c, both)
    assert c.state.lent_blocks("n0") == {}
    assert c.state.borrowers_to_evict() == []  # not yet: is the owner idle?
    c.clock.advance(295.0)
    sample(c, both)
    c.clock.advance(6.0)  # 301 s since the first report, but its reports span 295 s only
    assert c.state.borrowers_to_evict() == []
    sample(c, both)
    assert c.state.lent_blocks("n0") == {"GPU-0000": 2}  # it is idle: the borrower stays
    assert c.state.borrowers_to_evict() == []


def test_a_report_that_cannot_read_the_gpus_memory_keeps_what_it_lends(c: Cluster) -> None:
    _lend_two(c)
    hold(c, "borrower", 2, QosClass.BEST_EFFORT, 400.0)
    sample(c, {"owner": 1024.0, "borrower": 2000.0})
    c.seq += 1
    c.state.ingest(report_from(report("n0", [gpu(0, memory_used_mib=None), gpu(1)], seq=c.seq)))
    assert c.state.lent_blocks("n0") == {"GPU-0000": 2}
    assert c.state.borrowers_to_evict() == []
    c.clock.advance(5.0)
    sample(c, {"owner": 1024.0, "borrower": 2000.0})  # read again: still idle since before
    assert c.state.lent_blocks("n0") == {"GPU-0000": 2}


def test_switching_lending_off_and_on_starts_the_wait_over(c: Cluster) -> None:
    hold(c, "owner", 3, QosClass.INFERENCE, 0.0)
    sample(c, {"owner": 1024.0})
    c.state.set_policy(parse_policy({"spec": {"remediation": LENDING["remediation"]}}))
    c.clock.advance(600.0)
    sample(c, {"owner": 10000.0})  # busy while lending was off
    c.clock.advance(10.0)
    sample(c, {"owner": 1024.0})
    c.state.set_policy(parse_policy({"spec": LENDING}))
    assert c.state.lent_blocks("n0") == {}  # idle for 10 s, not 5 minutes
