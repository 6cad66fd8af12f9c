"""How remediation fails safe: fenced leadership, hung calls, lying reports, edge partitions,
repeated faults, records a person touched, dry runs, and the guards of each controller.

Against the fake API server through the real client, with a fake clock where that suffices.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from scheduler_extender.domain import Assignment, QosClass
from scheduler_extender.k8s.leader import LeaseElector
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.names import (
    REMEDIATION_ANNOTATION,
    REMEDIATION_OPT_OUT,
    REMEDIATION_STATE_LABEL,
    UNHEALTHY_TAINT,
)
from scheduler_extender.policy.document import parse_policy
from scheduler_extender.remediation.runner import Remediator
from scheduler_extender.telemetry.decode import report_from
from tests.builders import gpu, report
from tests.fakes.fake_kube import FakeKube
from tests.k8s.conftest import make_api
from tests.k8s.test_fault_loop import EVICT_OVER_BUDGET, Cluster, drain, to_self_test
from tests.k8s.test_lending import LENDING, hold, sample


async def _pass_self_test(c: Cluster, r: Remediator) -> None:
    """n0's agent passes the self-test asked of it (a pass clears its XID)."""
    c.self_test = {"id": r.requests("n0")["self_test"]["id"], "verdict": "pass", "detail": ""}
    c.push("n0")
    await r.step()
    c.self_test = None


# -- fenced leadership ---------------------------------------------------------------------------
async def test_a_leader_whose_renews_hang_stops_leading_before_another_replica_takes_over(
    kube: FakeKube, kubeconfig: Path
) -> None:
    a = LeaseElector(make_api(kubeconfig), namespace="edgegpu-system",
                     name="lease", identity="a", lease_duration_s=3.0, retry_s=0.2)  # fmt: skip
    b = LeaseElector(make_api(kubeconfig), namespace="edgegpu-system", name="lease",
                     identity="b", lease_duration_s=3.0, retry_s=0.2)  # fmt: skip
    a.start()
    try:
        deadline = time.monotonic() + 10
        while not a.is_leader and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert a.is_leader
        b.start()
        # Every renew of a's from now on gets no answer: a half-open connection.
        kube.hang[("PUT", r'leases/lease .*"holderIdentity": "a"')] = threading.Event()
        both = False
        deadline = time.monotonic() + 20
        while not b.is_leader and time.monotonic() < deadline:
            both = both or (a.is_leader and b.is_leader)
            await asyncio.sleep(0.02)
        assert b.is_leader and not a.is_leader
        assert not both  # never two leaders at once
    finally:
        for released in kube.hang.values():
            released.set()
        a.stop()
        b.stop()


async def test_a_hung_eviction_is_abandoned_counted_and_the_round_goes_on(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.pod("train", "n0", 0, QosClass.TRAINING)
    registry = CollectorRegistry()
    r = Remediator(
        c.state, make_api(kubeconfig), ExtenderMetrics(registry, c.state), lambda _s: True,
        nodes=lambda: {k[2]: v for k, v in kube.objects.items() if k[0] == "nodes"},
        timeout_s=0.5,
    )  # fmt: skip
    kube.hang[("POST", r"/pods/train/eviction")] = threading.Event()
    started = time.monotonic()
    await drain(c, r)
    assert time.monotonic() - started < 10  # no round waits on a call for good
    assert c.record("n0")["state"] == "draining"
    assert (
        registry.get_sample_value(
            "edgegpu_extender_remediation_call_timeouts_total", {"call": "evict"}
        )
        == 1.0
    )
    kube.hang[("POST", r"/pods/train/eviction")].set()


async def test_leadership_lost_mid_drain_stops_the_round_before_the_next_write(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.pod("train", "n0", 0, QosClass.TRAINING)
    c.pod("infer", "n0", 0, QosClass.INFERENCE)

    def leading(_for_s: float) -> bool:  # until the cordon is written
        return not any(
            m == "PATCH" and p.split("?")[0] == "/api/v1/nodes/n0" for m, p in kube.requests
        )

    r = Remediator(
        c.state, make_api(kubeconfig), ExtenderMetrics(CollectorRegistry(), c.state), leading,
        nodes=lambda: {k[2]: v for k, v in kube.objects.items() if k[0] == "nodes"},
    )  # fmt: skip
    await drain(c, r)
    assert c.node("n0")["spec"]["unschedulable"] is True
    assert c.pods() == {"train", "infer"}  # nothing evicted once leadership was gone
    assert not kube.requests_to("/eviction")
    assert r.records == {}  # read back from the annotations when leading again


async def test_a_stale_leader_never_rolls_back_a_newer_record(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    stale: dict[str, Any] = {}
    a = Remediator(
        c.state, make_api(kubeconfig), ExtenderMetrics(CollectorRegistry(), c.state),
        lambda _s: True, nodes=lambda: stale, identity="replica-a",
    )  # fmt: skip

    def snapshot() -> None:
        stale.clear()
        stale.update({k[2]: json.loads(json.dumps(v)) for k, v in kube.objects.items()
                      if k[0] == "nodes"})  # fmt: skip

    snapshot()
    c.push("n0", 0)
    await a.step()
    c.clock.advance(6.0)
    c.push("n0", 0)
    await a.step()
    snapshot()
    assert c.record("n0")["state"] == "self-test" or c.record("n0")["state"] == "draining"
    # Another leader moved the record on; a's watch has not seen it.
    newer = dict(c.record("n0") or {}, state="needs-human", owner="replica-b")
    c.live("n0")["metadata"]["annotations"][REMEDIATION_ANNOTATION] = json.dumps(newer)
    kube.put("nodes", c.live("n0"))
    c.push("n0", 0)
    c.clock.advance(6.0)
    await a.step()
    assert c.record("n0") == newer  # not overwritten
    assert a.records["n0"].phase.value == "needs-human"  # a takes the record it found


# -- reports speak for their own node ------------------------------------------------------------
async def test_a_report_naming_another_nodes_pod_evicts_nothing_and_is_counted(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.state.set_policy(parse_policy(EVICT_OVER_BUDGET))
    c.pod("victim", "n1", 0, QosClass.INFERENCE)
    registry = CollectorRegistry()
    r = Remediator(c.state, make_api(kubeconfig), ExtenderMetrics(registry, c.state),
                   lambda _s: True)  # fmt: skip
    lie = [{"pid": 7, "pod_uid": "uid-victim", "used_mib": 20000.0}]
    for _ in range(3):
        c.seq += 1
        c.state.ingest(report_from(report("n0", [gpu(0, processes=lie), gpu(1)], seq=c.seq)))
        await r.step()
        c.clock.advance(61.0)
    assert "victim" in c.pods()
    assert not [e for k, e in kube.objects.items() if k[0] == "events"]
    assert registry.get_sample_value("edgegpu_extender_foreign_processes_total") == 3.0


async def test_a_report_keeps_only_its_own_nodes_reservations_alive(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.state.assign(Assignment("uid-b", "default", "b", "n1", (0,), ("GPU-0000",), 1, False,
                              QosClass.INFERENCE, None, 0.0))  # fmt: skip
    expires = c.state.allocations.expires_at("uid-b")
    assert expires is not None
    lie = [{"pid": 7, "pod_uid": "uid-b", "used_mib": 100.0}]
    c.clock.advance(10.0)
    c.state.ingest(report_from(report("n0", [gpu(0, processes=lie)], seq=99)))
    assert c.state.allocations.expires_at("uid-b") == expires


# -- lending cannot starve the lender ------------------------------------------------------------
def _lending(kube: FakeKube, kubeconfig: Path) -> Cluster:
    """An owner of 3 blocks of a 16 GiB GPU, using 1 GiB for longer than ``after``."""
    c = Cluster(kube, kubeconfig, count=1)
    c.state.set_policy(parse_policy({"spec": LENDING}))
    hold(c, "owner", 3, QosClass.INFERENCE, 0.0)
    sample(c, {"owner": 1024.0})
    c.clock.advance(301.0)
    sample(c, {"owner": 1024.0})
    return c


def test_a_borrower_that_fills_the_gpu_gives_the_lenders_blocks_back(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = _lending(kube, kubeconfig)
    assert c.state.lent_blocks("n0") == {"GPU-0000": 2}
    hold(c, "borrower", 2, QosClass.BEST_EFFORT, 400.0)
    due: list[Any] = []
    for _ in range(20):  # the owner cannot grow: the borrower uses 12 GiB of the 16
        sample(c, {"owner": 1024.0, "borrower": 12288.0})
        c.clock.advance(5.0)
        due = c.state.borrowers_to_evict()
        if due:
            break
    assert c.state.lent_blocks("n0") == {}
    assert [a.name for a, _ in due] == ["borrower"]


def test_an_owner_growing_towards_what_it_can_have_lends_less(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = _lending(kube, kubeconfig)
    assert c.state.lent_blocks("n0") == {"GPU-0000": 2}  # it can have 4 GiB, uses 1
    hold(c, "other", 1, QosClass.INFERENCE, 350.0)  # the GPU's 4th block
    hold(c, "borrower", 2, QosClass.BEST_EFFORT, 400.0)
    sample(c, {"owner": 3072.0, "borrower": 4096.0})  # 3 GiB: past 70 % of its 4
    assert c.state.lent_blocks("n0") == {"GPU-0000": 1}
    assert [a.name for a, _ in c.state.borrowers_to_evict()] == ["borrower"]


# -- repeated faults -----------------------------------------------------------------------------
async def test_the_third_fault_on_a_gpu_within_a_day_goes_to_needs_human_not_another_drain(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    for hour in range(3):
        c.pod(f"job-{hour}", "n0", 0, QosClass.INFERENCE)
        await drain(c, r)
        c.state.release(f"uid-job-{hour}")
        if hour < 2:
            assert c.record("n0")["state"] == "draining"
            await r.step()
            await _pass_self_test(c, r)
            assert c.record("n0") is None and not c.node("n0")["spec"].get("unschedulable")
            c.clock.advance(3600.0)
    assert c.record("n0")["state"] == "needs-human"
    assert c.node("n0")["spec"]["unschedulable"] is True
    assert c.node("n0")["metadata"]["labels"][REMEDIATION_STATE_LABEL] == "needs-human"
    assert "job-2" in c.pods()  # not drained a third time
    assert len(c.events("EdgeGPUNeedsHuman")) == 1


async def test_a_fault_after_the_repeat_window_is_drained_as_usual(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, repeatLimit=2, repeatWindow="1h")
    r = c.remediator()
    await to_self_test(c, r)
    await _pass_self_test(c, r)
    c.clock.advance(3700.0)
    await drain(c, r)
    assert c.record("n0")["state"] in ("draining", "self-test")


# -- edge partitions -----------------------------------------------------------------------------
async def test_after_a_restart_a_not_ready_silent_node_is_not_a_fault_at_once(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.pod("edge-app", "n1", 0, QosClass.INFERENCE)
    c.live("n1")["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    c.clock.advance(3600.0)  # NotReady and silent for an hour before this replica started
    r = c.remediator()
    for _ in range(10):
        await r.step()
        c.clock.advance(20.0)
    assert not c.node("n1")["spec"].get("unschedulable")
    assert "edge-app" in c.pods()


# -- records a person touched --------------------------------------------------------------------
async def test_a_corrupted_record_is_cleaned_up_with_an_event(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    await drain(c, r)
    assert c.node("n0")["spec"]["unschedulable"] is True
    c.push("n0")  # the fault is gone
    c.live("n0")["metadata"]["annotations"][REMEDIATION_ANNOTATION] = "{not json"
    kube.put("nodes", c.live("n0"))
    await r.step()
    node = c.node("n0")
    assert not node["spec"].get("unschedulable")
    assert not [t for t in node["spec"].get("taints") or [] if t["key"] == UNHEALTHY_TAINT]
    assert REMEDIATION_ANNOTATION not in (node["metadata"].get("annotations") or {})
    assert REMEDIATION_STATE_LABEL not in (node["metadata"].get("labels") or {})
    assert c.condition("n0")["status"] == "True"
    assert len(c.events("EdgeGPURecordCleanedUp")) == 1


async def test_a_removed_record_with_the_fault_still_there_is_adopted_and_uncordoned_later(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    await drain(c, r)
    del c.live("n0")["metadata"]["annotations"][REMEDIATION_ANNOTATION]
    kube.put("nodes", c.live("n0"))
    for _ in range(3):
        c.push("n0", 0)
        await r.step()
        c.clock.advance(6.0)
    assert c.events("EdgeGPUAdopted")
    assert c.record("n0")["ownsCordon"] is True
    await r.step()
    await _pass_self_test(c, r)
    assert not c.node("n0")["spec"].get("unschedulable")  # our cordon, so we lift it


async def test_the_leader_honours_a_hand_edit_of_the_record(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    await to_self_test(c, r)
    edited = dict(c.record("n0") or {}, state="needs-human")
    c.live("n0")["metadata"]["annotations"][REMEDIATION_ANNOTATION] = json.dumps(edited)
    kube.put("nodes", c.live("n0"))
    await r.step()
    assert r.records["n0"].phase.value == "needs-human"
    assert r.requests("n0") == {}  # no self-test asked any more


# -- dry run -------------------------------------------------------------------------------------
async def test_a_dry_run_plan_ends_when_the_fault_does_and_holds_no_place_under_the_cap(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=3, dryRun=True, maxUnavailablePercent=10)
    c.pod("a", "n0", 0, QosClass.INFERENCE)
    r = c.remediator()
    for _ in range(3):
        c.push("n0", 0)
        c.push("n1", 0)
        await r.step()
        c.clock.advance(6.0)
    assert {n: rec.phase.value for n, rec in r.records.items()} == {
        "n0": "draining",
        "n1": "draining",
    }  # the cap of one node does not hold back a plan
    c.push("n0")  # the fault is gone
    await r.step()
    assert "n0" not in r.records
    assert "a" in c.pods() and not c.node("n0")["spec"].get("unschedulable")


# -- each controller's guards --------------------------------------------------------------------
async def test_a_pass_while_a_gpu_stays_hot_uncordons_at_the_self_test_timeout(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    await drain(c, r)
    await r.step()
    request = r.requests("n0")["self_test"]["id"]
    c.self_test = {"id": request, "verdict": "pass", "detail": ""}
    hot = [gpu(0), gpu(1, temperature_c=95.0)]
    for _ in range(3):
        c.seq += 1
        doc = report("n0", hot, seq=c.seq)
        doc["self_test"] = c.self_test
        c.state.ingest(report_from(doc))
        await r.step()
        c.clock.advance(301.0)
    assert not c.node("n0")["spec"].get("unschedulable")  # not held for good
    assert c.record("n0") is None


async def test_thermal_migration_moves_the_next_pod_when_the_first_is_already_leaving(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.pod("leaving", "n0", 0, QosClass.BEST_EFFORT, at=10.0)
    c.pod("next", "n0", 0, QosClass.INFERENCE)
    pod = kube.objects[("pods", "default", "leaving")]
    pod["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    r = c.remediator()
    for _ in range(3):
        c.seq += 1
        c.state.ingest(report_from(report("n0", [gpu(0, temperature_c=96.0)], seq=c.seq)))
        await r.step()
        c.clock.advance(61.0)
    assert "next" not in c.pods()


async def test_nodes_that_opted_out_are_not_migrated_budget_evicted_or_reclaimed(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.state.set_policy(parse_policy(EVICT_OVER_BUDGET))
    c.live("n0")["metadata"]["labels"][REMEDIATION_OPT_OUT] = "disabled"
    c.pod("hot", "n0", 0, QosClass.BEST_EFFORT)
    c.pod("greedy", "n0", 1, QosClass.BEST_EFFORT)
    r = c.remediator()
    greedy = [{"pid": 8, "pod_uid": "uid-greedy", "used_mib": 20000.0}]
    for _ in range(4):
        c.seq += 1
        gpus = [gpu(0, temperature_c=96.0), gpu(1, processes=greedy)]
        c.state.ingest(report_from(report("n0", gpus, seq=c.seq)))
        await r.step()
        c.clock.advance(61.0)
    assert {"hot", "greedy"} <= c.pods()
    assert not c.events("EdgeGPUOverBudget")


async def test_a_paused_remediation_starts_nothing(kube: FakeKube, kubeconfig: Path) -> None:
    c = Cluster(kube, kubeconfig, paused=True)
    c.pod("a", "n0", 0, QosClass.INFERENCE)
    r = c.remediator()
    await drain(c, r)
    c.clock.advance(6.0)
    await r.step()
    assert not c.node("n0")["spec"].get("unschedulable") and "a" in c.pods()


async def test_the_reboot_ask_names_the_boot_it_was_decided_for(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    c.self_test = {"id": await to_self_test(c, r), "verdict": "fail", "detail": ""}
    c.push("n0", 0, host="host-1")
    await r.step()
    ask = r.requests("n0")["reboot"]
    assert ask["boot"] == "host-1" and ask["id"]


# -- records nobody should have written ----------------------------------------------------------
async def test_a_record_with_an_impossible_time_stops_no_other_node(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    odd = {"state": "needs-human", "since": "9999-12-31T23:59:59-12:00", "reason": "x"}
    c.live("n0")["metadata"].setdefault("annotations", {})[REMEDIATION_ANNOTATION] = json.dumps(odd)
    kube.put("nodes", c.live("n0"))
    r = c.remediator()
    await drain(c, r, "n1")
    assert c.node("n1")["spec"]["unschedulable"] is True


async def test_clean_up_leaves_a_cordon_someone_else_made(kube: FakeKube, kubeconfig: Path) -> None:
    c = Cluster(kube, kubeconfig)
    c.live("n0")["spec"]["unschedulable"] = True  # an operator's, before the fault
    kube.put("nodes", c.live("n0"))
    r = c.remediator()
    await drain(c, r)
    assert c.record("n0")["ownsCordon"] is False
    c.push("n0")
    c.live("n0")["metadata"]["annotations"][REMEDIATION_ANNOTATION] = "garbage"
    kube.put("nodes", c.live("n0"))
    await r.step()
    node = c.node("n0")
    assert not [t for t in node["spec"].get("taints") or [] if t["key"] == UNHEALTHY_TAINT]
    assert node["spec"]["unschedulable"] is True  # not ours to lift


async def test_a_dry_run_plans_no_clean_up_of_what_a_real_run_left(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    await drain(c, r)
    c.state.set_policy(parse_policy({"spec": {"remediation": {"enabled": True, "dryRun": True}}}))
    c.push("n0")
    for _ in range(4):
        await r.step()
    assert not c.events("DryRunEdgeGPURecordCleanedUp")


async def test_reasons_that_change_wording_do_not_rewrite_the_node_every_round(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    await to_self_test(c, r)
    before = len([m for m, p in kube.requests_to("/api/v1/nodes/n0$") if m == "PATCH"])
    for _ in range(5):
        c.push("n0", 0)
        await r.step()
    after = len([m for m, p in kube.requests_to("/api/v1/nodes/n0$") if m == "PATCH"])
    assert after == before


# -- the circuit breaker -------------------------------------------------------------------------
async def test_one_cordon_too_many_in_the_window_trips_the_breaker_until_an_operator_resets_it(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=4, breakerPercent=50, maxUnavailablePercent=100)
    r = c.remediator()
    for _ in range(2):
        for n in ("n0", "n1", "n2"):
            c.push(n, 0)
        await r.step()
        c.clock.advance(6.0)
    cordoned = {n for n in ("n0", "n1", "n2") if c.node(n)["spec"].get("unschedulable")}
    assert len(cordoned) == 2  # half of the 4 GPU nodes within the hour: the third waits
    breaker = kube.get("configmaps", "edgegpu-remediation-breaker", "edgegpu-system")
    assert breaker is not None and breaker["data"]["state"] == "tripped"
    assert c.events("EdgeGPURemediationBreakerTripped")
    c.clock.advance(7200.0)  # the window has passed: still tripped until a person says so
    for n in ("n0", "n1", "n2"):
        c.push(n, 0)
    await r.step()
    (waiting,) = {"n0", "n1", "n2"} - cordoned
    assert not c.node(waiting)["spec"].get("unschedulable")
    kube.delete("configmaps", "edgegpu-remediation-breaker", "edgegpu-system")  # the reset
    c.clock.advance(2.5)  # a tripped breaker is read again every round
    c.push(waiting, 0)
    await r.step()
    reset = kube.get("configmaps", "edgegpu-remediation-breaker", "edgegpu-system")
    assert reset is not None and reset["data"]["state"] == "closed"
    # Two of four are still held: the ceiling (breakerPercent as a level) keeps the third back.
    assert not c.node(waiting)["spec"].get("unschedulable")
    assert "ceiling" in c.record(waiting)["waiting"]


async def test_a_cordon_that_races_an_operators_cordon_is_decided_again_not_replayed(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    stale: dict[str, Any] = {}

    def snapshot() -> None:
        stale.clear()
        stale.update({k[2]: json.loads(json.dumps(v)) for k, v in kube.objects.items()
                      if k[0] == "nodes"})  # fmt: skip

    r = Remediator(
        c.state, make_api(kubeconfig), ExtenderMetrics(CollectorRegistry(), c.state),
        lambda _s: True, nodes=lambda: stale,
    )  # fmt: skip
    snapshot()
    c.push("n0", 0)
    await r.step()
    c.clock.advance(6.0)
    c.live("n0")["spec"]["unschedulable"] = True  # an operator, just before our cordon
    kube.put("nodes", c.live("n0"))
    c.push("n0", 0)
    await r.step()  # our write meets a conflict: not sent again on the old decision
    assert c.record("n0") is None
    snapshot()
    await r.step()
    assert c.record("n0")["ownsCordon"] is False  # decided again: the cordon is not ours


async def test_a_write_whose_thread_starts_after_leadership_is_gone_sends_nothing(
    kube: FakeKube, kubeconfig: Path
) -> None:
    from scheduler_extender.remediation.actuator import Actuator, NotLeading

    c = Cluster(kube, kubeconfig, count=1)
    answers = iter([True, False])  # leading when the round asks; gone when the thread runs
    act = Actuator(make_api(kubeconfig), ExtenderMetrics(CollectorRegistry(), c.state),
                   c.clock, lambda _s: next(answers))  # fmt: skip
    before = len(kube.requests)
    with pytest.raises(NotLeading):
        await act.patch_node("n0", c.live("n0"), lambda n: {"metadata": {}})
    assert len(kube.requests) == before


async def test_a_partition_longer_than_the_self_test_timeout_waits_and_is_tested_when_back(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    c.clock.advance(600.0)  # n1's agent silent
    c.live("n1")["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    for _ in range(25):  # 25 minutes unreachable: past unreachableAfter and selfTestTimeout
        c.push("n0")
        await r.step()
        c.clock.advance(60.0)
    assert c.record("n1")["state"] == "draining"  # cordoned, waiting; no human paged
    c.live("n1")["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    c.push("n1")  # the link is back
    await r.step()
    assert c.record("n1")["state"] == "self-test"
    c.self_test = {"id": r.requests("n1")["self_test"]["id"], "verdict": "pass", "detail": ""}
    c.push("n1")
    await r.step()
    assert c.record("n1") is None and not c.node("n1")["spec"].get("unschedulable")


async def test_a_node_unreachable_for_longer_than_the_reboot_timeout_goes_to_a_human(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    c.clock.advance(600.0)
    c.live("n1")["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    for _ in range(45):  # 45 minutes: cordoned after 5, then rebootTimeout (30m) runs out
        c.push("n0")
        await r.step()
        c.clock.advance(60.0)
    assert c.record("n1")["state"] == "needs-human"
    assert len(c.events("EdgeGPUNeedsHuman")) == 1


async def _trip(c: Cluster, r: Remediator, nodes: tuple[str, ...]) -> None:
    for _ in range(2):
        for n in nodes:
            c.push(n, 0)
        await r.step()
        c.clock.advance(6.0)


async def test_a_reset_within_the_window_counts_only_the_cordons_after_it(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=4, breakerPercent=50, maxUnavailablePercent=100)
    r = c.remediator()
    await _trip(c, r, ("n0", "n1", "n2"))
    held = [n for n in ("n0", "n1", "n2") if c.node(n)["spec"].get("unschedulable")]
    waiting = [n for n in ("n0", "n1", "n2") if n not in held]
    await r.step()  # drained (no pods): self-tests asked
    for n in held:  # the two cordoned recover: the breaker stays tripped, no node is held
        c.self_test = {"id": r.requests(n)["self_test"]["id"], "verdict": "pass", "detail": ""}
        c.push(n)
        await r.step()
        assert c.record(n) is None
    c.self_test = None
    c.clock.advance(600.0)
    c.push(waiting[0], 0)
    await r.step()
    assert not c.node(waiting[0])["spec"].get("unschedulable")  # tripped until a reset
    kube.delete("configmaps", "edgegpu-remediation-breaker", "edgegpu-system")
    c.clock.advance(2.5)
    c.push(waiting[0], 0)
    await r.step()
    assert c.node(waiting[0])["spec"].get("unschedulable")
    breaker = kube.get("configmaps", "edgegpu-remediation-breaker", "edgegpu-system")
    assert breaker is not None and breaker["data"]["state"] == "closed"


async def test_a_node_cordoned_and_deleted_since_still_counts_toward_the_breaker(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=4, breakerPercent=50, maxUnavailablePercent=100)
    r = c.remediator()
    await _trip(c, r, ("n0",))
    assert c.node("n0")["spec"]["unschedulable"] is True
    kube.delete("nodes", "n0")  # replaced by an autoscaler: the cordon still happened
    await _trip(c, r, ("n1", "n2"))
    cordoned = [n for n in ("n1", "n2") if c.node(n)["spec"].get("unschedulable")]
    assert len(cordoned) == 1  # n0 and one more: the breaker's two within the hour
    breaker = kube.get("configmaps", "edgegpu-remediation-breaker", "edgegpu-system")
    assert breaker is not None and breaker["data"]["state"] == "tripped"


async def test_a_breaker_configmap_that_cannot_be_trusted_keeps_new_cordons_back(
    kube: FakeKube, kubeconfig: Path
) -> None:
    for data in ({"state": "tripped"}, {"state": "closed", "since": "2999-01-01T00:00:00Z"},
                 {"state": "open?"}):  # fmt: skip
        with FakeKube(bookmark_interval_s=0.2) as fake:
            config = fake.kubeconfig(kubeconfig.parent / f"kc-{len(fake.objects)}-{id(data)}")
            c = Cluster(fake, config, count=4, breakerPercent=50, maxUnavailablePercent=100)
            fake.put("configmaps", {"metadata": {"name": "edgegpu-remediation-breaker",
                                                 "namespace": "edgegpu-system"}, "data": data})  # fmt: skip
            r = c.remediator()
            await _trip(c, r, ("n0", "n1", "n2"))
            cordoned = [n for n in ("n0", "n1", "n2") if c.node(n)["spec"].get("unschedulable")]
            assert len(cordoned) <= 2, data  # never past the breaker's allowance
            if data.get("state") != "closed":
                assert cordoned == [], data  # unreadable: tripped until deleted
