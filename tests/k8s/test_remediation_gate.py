"""One gate for every action: opt-out, staleness, the fleet-wide disruption budget, ways out of
every state, one clock, aggregated Events, and caches that never confuse two pods.

Against the fake API server through the real client, with a fake clock for the replica and, where
a case needs it, another for the API server.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from scheduler_extender.domain import QosClass
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.names import (
    REMEDIATION_ANNOTATION,
    REMEDIATION_HISTORY_ANNOTATION,
    REMEDIATION_OPT_OUT,
)
from scheduler_extender.policy.document import parse_policy
from scheduler_extender.remediation.actuator import backoff_s
from scheduler_extender.remediation.faults import stamp as _stamp
from scheduler_extender.remediation.runner import Remediator
from scheduler_extender.telemetry.decode import report_from
from tests.builders import gpu, report
from tests.fakes.fake_kube import FakeKube
from tests.k8s.conftest import make_api
from tests.k8s.test_fault_loop import EVICT_OVER_BUDGET, Cluster, drain, to_self_test
from tests.k8s.test_lending import LENDING, hold, sample
from tests.k8s.test_remediation_safety import _lending

BREAKER = ("configmaps", "edgegpu-remediation-breaker", "edgegpu-system")


def _breaker(kube: FakeKube) -> dict[str, Any]:
    doc = kube.get(*BREAKER)
    assert doc is not None
    return doc


def _evictions(kube: FakeKube) -> int:
    return len([m for m, _ in kube.requests_to("/eviction$") if m == "POST"])


def _settle(c: Cluster, *names: str) -> None:
    """What the pod watch does for evicted pods: their GPUs are free again."""
    for name in names:
        if name not in c.pods():
            c.state.release(f"uid-{name}")


def _hot(c: Cluster) -> None:
    """A new report of n0 with GPU 0 hot (96 °C)."""
    c.seq += 1
    c.state.ingest(report_from(report("n0", [gpu(0, temperature_c=96.0)], seq=c.seq)))


async def _hot_past_migrate_after(c: Cluster, r: Remediator) -> None:
    """GPU 0 of n0 hot in two reports, 121 s apart: past migrateAfter (2m) in the second."""
    for _ in range(2):
        _hot(c)
        await r.step()
        c.clock.advance(121.0)


def _opt_out(c: Cluster, node: str) -> None:
    c.live(node)["metadata"]["labels"][REMEDIATION_OPT_OUT] = "disabled"
    c.kube.put("nodes", c.live(node))


def _counted(registry: CollectorRegistry, action: str, reason: str, result: str) -> float:
    labels = {"action": action, "reason": reason, "result": result}
    return registry.get_sample_value("edgegpu_extender_remediation_actions_total", labels) or 0.0


def _remediator(c: Cluster, registry: CollectorRegistry, identity: str = "replica-a") -> Remediator:
    kube = c.kube
    return Remediator(
        c.state, make_api(c.kubeconfig), ExtenderMetrics(registry, c.state), lambda _s: True,
        nodes=lambda: {k[2]: v for k, v in kube.objects.items() if k[0] == "nodes"},
        pods=lambda: {v["metadata"]["uid"]: v for k, v in kube.objects.items() if k[0] == "pods"},
        identity=identity,
    )  # fmt: skip


# -- the opt-out label stops every ask -----------------------------------------------------------
async def test_an_opted_out_node_in_reboot_requested_is_asked_nothing_and_holds_no_place(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, breakerPercent=100)  # 2 GPU nodes: the cap is one node
    r = c.remediator()
    c.self_test = {"id": await to_self_test(c, r), "verdict": "fail", "detail": ""}
    c.push("n0", 0, host="host-1")
    await r.step()
    assert c.record("n0")["state"] == "reboot-requested" and r.requests("n0")["reboot"]
    _opt_out(c, "n0")
    c.self_test = None
    c.push("n0", 0, host="host-1")
    await r.step()
    assert r.requests("n0") == {}  # no reboot ask: kured is never told
    await drain(c, r, "n1")  # n0 no longer holds the one place
    assert c.record("n1")["state"] in ("draining", "self-test")


async def test_a_borrower_on_an_opted_out_node_is_not_reclaimed(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = _lending(kube, kubeconfig)
    hold(c, "borrower", 3, QosClass.BEST_EFFORT, 400.0)
    _opt_out(c, "n0")
    r = c.remediator()
    sample(c, {"owner": 9000.0, "borrower": 2000.0})  # the owner needs its blocks back
    assert c.state.borrowers_to_evict()
    await r.step()
    assert "borrower" in c.pods() and _evictions(kube) == 0


# -- no action on stale telemetry ----------------------------------------------------------------
async def test_thermal_migration_evicts_nothing_from_a_node_whose_telemetry_went_stale(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=1)
    c.pod("hot", "n0", 0, QosClass.BEST_EFFORT)
    registry = CollectorRegistry()
    r = _remediator(c, registry)
    _hot(c)
    await r.step()
    c.live("n0")["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    for _ in range(9):  # 180 s silent, NotReady: past migrateAfter on the last (hot) report
        c.clock.advance(20.0)
        await r.step()
    assert "hot" in c.pods() and _evictions(kube) == 0
    assert _counted(registry, "evict", "thermal", "stale") == 0  # filtered before it is due
    c.live("n0")["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    _hot(c)
    await r.step()  # fresh and still hot past migrateAfter: now it goes
    assert "hot" not in c.pods()


async def test_no_drain_eviction_or_agent_ask_rests_on_stale_telemetry(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.pod("a", "n0", 0, QosClass.INFERENCE)
    c.pod("b", "n0", 0, QosClass.INFERENCE)
    registry = CollectorRegistry()
    r = _remediator(c, registry)
    c.state.set_policy(parse_policy({"spec": {"remediation": {
        "enabled": True, "dryRun": False, "evictionsPerMinute": 1}}}))  # fmt: skip
    await drain(c, r)
    assert c.pods() == {"b"}  # one a minute
    c.clock.advance(61.0)  # n0 silent since: its telemetry is stale
    await r.step()
    assert c.pods() == {"b"}
    assert _counted(registry, "evict", "gpu_fault", "stale") >= 1
    c.push("n0", 0)
    await r.step()
    assert c.pods() == set()


# -- every state has a way out -------------------------------------------------------------------
async def test_a_drain_a_budget_blocks_goes_to_a_human_after_drain_timeout_and_frees_its_place(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, drainTimeout="10m", breakerPercent=100)  # the cap: 1 node
    c.pod("kept", "n0", 0, QosClass.INFERENCE)
    kube.objects[("pods", "default", "kept")]["metadata"]["labels"] = {"app": "kept"}
    kube.put("poddisruptionbudgets", {"metadata": {"name": "kept", "namespace": "default"},
                                      "spec": {"selector": {"matchLabels": {"app": "kept"}}},
                                      "status": {"disruptionsAllowed": 0}})  # fmt: skip
    r = c.remediator()
    await drain(c, r)
    assert c.record("n0")["state"] == "draining"
    c.push("n1", 1)  # another node's GPU dies while n0 holds the place
    await r.step()
    c.clock.advance(6.0)
    c.push("n0", 0)
    c.push("n1", 1)
    await r.step()
    held = c.record("n1")  # held back by the cap: written down, not kept in memory
    assert held is not None and held["state"] == "suspect" and "cap" in held["waiting"]
    assert not c.node("n1")["spec"].get("unschedulable")
    (waiting,) = c.events("EdgeGPUWaiting")
    assert waiting["involvedObject"]["name"] == "n1"
    for _ in range(11):
        c.clock.advance(60.0)
        c.push("n0", 0)
        c.push("n1", 1)
        await r.step()
    assert c.record("n0")["state"] == "needs-human"
    assert "drainTimeout" in c.record("n0")["history"][-1]["why"]
    assert [e["involvedObject"]["name"] for e in c.events("EdgeGPUNeedsHuman")] == ["n0"]
    assert c.record("n1")["state"] in ("draining", "self-test")  # the place was released
    assert "kept" in c.pods()  # never forced


# -- one clock -----------------------------------------------------------------------------------
def _seed_history(c: Cluster, node: str, *ago_s: float) -> None:
    """``node`` was cordoned for gpu0 ``ago_s`` ago by the API server's clock."""
    server = c.kube.now()
    history = {"gpu0": [_stamp(server - a) for a in ago_s]}
    c.live(node)["metadata"].setdefault("annotations", {})[REMEDIATION_HISTORY_ANNOTATION] = (
        json.dumps(history)
    )
    c.kube.put("nodes", c.live(node))


async def test_a_leader_two_hours_behind_still_counts_the_last_leaders_cordons_and_repeats(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=4, breakerPercent=50, maxUnavailablePercent=100)
    kube.now = lambda: c.clock.wall() + 7200.0  # this replica's clock is 2 h behind
    _seed_history(c, "n0", 1200.0, 600.0)  # gpu0 of n0 drained twice within the hour
    _seed_history(c, "n3", 300.0)  # and n3 cordoned 5 minutes ago
    ledger = {"state": "closed", "since": _stamp(kube.now() - 3600.0), "reason": "",
              "cordons": json.dumps({"n0": [_stamp(kube.now() - 600.0)],
                                     "n3": [_stamp(kube.now() - 300.0)]}),
              "evictions": "[]"}  # fmt: skip
    kube.put("configmaps", {"metadata": {"name": BREAKER[1], "namespace": BREAKER[2]},
                            "data": ledger})  # fmt: skip
    r = c.remediator()
    await drain(c, r, "n1")
    assert not c.node("n1")["spec"].get("unschedulable")  # n0 and n3 were the two this hour
    assert _breaker(kube)["data"]["state"] == "tripped"


async def test_a_leader_behind_sees_a_gpus_third_fault_as_one(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    kube.now = lambda: c.clock.wall() + 7200.0  # this replica's clock is 2 h behind
    _seed_history(c, "n0", 1200.0, 600.0)
    r = c.remediator()
    await drain(c, r)
    assert c.record("n0")["state"] == "needs-human"  # the third within repeatWindow


async def test_a_leader_ahead_does_not_cut_a_self_test_short(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    await to_self_test(c, r)  # by the API server's clock, the self-test began just now
    kube.now = lambda: c.clock.wall() - 7200.0  # a new leader whose clock is 2 h ahead
    b = c.remediator("replica-b")
    c.push("n0", 0)
    await b.step()
    assert c.record("n0")["state"] == "self-test"  # not "no verdict in 7200 s"


# -- over-budget grace and Events ----------------------------------------------------------------
async def test_a_pod_dipping_under_its_blocks_for_one_sample_is_still_evicted_after_the_grace(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.state.set_policy(parse_policy(EVICT_OVER_BUDGET))  # overBudgetGrace 1m
    c.pod("big", "n0", 0, QosClass.INFERENCE)
    r = c.remediator()
    for k in range(12):  # over, under, over, under... every 10 s
        used = 6000.0 if k % 2 == 0 else 100.0
        c.seq += 1
        procs = [{"pid": 1, "pod_uid": "uid-big", "used_mib": used}]
        c.state.ingest(report_from(report("n0", [gpu(0, processes=procs), gpu(1)], seq=c.seq)))
        await r.step()
        c.clock.advance(10.0)
    assert "big" not in c.pods()
    (warned,) = c.events("EdgeGPUOverBudget")  # one Event, counted
    assert warned["count"] == 1 and warned["lastTimestamp"]


async def test_a_repeated_warning_raises_the_count_of_one_event(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    c.state.set_policy(parse_policy({"spec": {
        "remediation": {"enabled": True, "dryRun": False},
        "memory": {"overBudget": "warn", "overBudgetGrace": "1m"}}}))  # fmt: skip
    c.pod("big", "n0", 0, QosClass.INFERENCE)
    r = c.remediator()
    # Over, then under for longer than the grace, then over again: four times.
    for used, after_s in [(6000.0, 10.0), (100.0, 70.0), (100.0, 10.0)] * 4:
        c.seq += 1
        procs = [{"pid": 1, "pod_uid": "uid-big", "used_mib": used}]
        c.state.ingest(report_from(report("n0", [gpu(0, processes=procs), gpu(1)], seq=c.seq)))
        await r.step()
        c.clock.advance(after_s)
    (warned,) = c.events("EdgeGPUOverBudget")
    assert warned["count"] == 4
    assert warned["lastTimestamp"] > warned["firstTimestamp"]
    assert "big" in c.pods()  # warn only (the default)


# -- the fleet-wide disruption budget ------------------------------------------------------------
async def test_evictions_past_the_breaker_trip_it_whichever_controller_asks(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=1, breakerEvictions=2)
    registry = CollectorRegistry()
    for name in ("a", "b", "c"):
        c.pod(name, "n0", 0, QosClass.BEST_EFFORT)
    r = _remediator(c, registry)
    for _ in range(6):  # hot GPU 0: one pod per migrateAfter (2m)
        _hot(c)
        await r.step()
        _settle(c, "a", "b", "c")
        c.clock.advance(121.0)
    assert len(c.pods()) == 1 and _evictions(kube) == 2
    breaker = _breaker(kube)
    assert breaker["data"]["state"] == "tripped"
    assert len(json.loads(breaker["data"]["evictions"])) == 2
    assert _counted(registry, "evict", "thermal", "breaker") >= 1
    assert c.events("EdgeGPURemediationBreakerTripped")


async def test_the_eviction_rate_goes_on_counting_across_a_leader_change(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=1, evictionsPerMinute=1)
    c.state.set_policy(parse_policy({"spec": {
        "remediation": {"enabled": True, "dryRun": False, "evictionsPerMinute": 1},
        "memory": {"overBudget": "evict", "overBudgetGrace": "1m"}}}))  # fmt: skip
    c.pod("x", "n0", 0, QosClass.INFERENCE)
    c.pod("y", "n0", 1, QosClass.INFERENCE)
    procs0 = [{"pid": 1, "pod_uid": "uid-x", "used_mib": 6000.0}]
    procs1 = [{"pid": 2, "pod_uid": "uid-y", "used_mib": 6000.0}]

    def over() -> None:
        c.seq += 1
        gpus = [gpu(0, processes=procs0), gpu(1, processes=procs1)]
        c.state.ingest(report_from(report("n0", gpus, seq=c.seq)))

    a, b = c.remediator("replica-a"), c.remediator("replica-b")
    over()
    await a.step()
    await b.step()
    c.clock.advance(61.0)
    over()
    await a.step()
    assert len(c.pods()) == 1  # one a minute
    c.clock.advance(5.0)
    over()
    await b.step()  # a new leader, 5 s later: the minute is not over
    assert len(c.pods()) == 1


async def test_forgetting_a_gpus_repeats_keeps_the_breakers_count(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=4, breakerPercent=25, maxUnavailablePercent=100)
    r = c.remediator()
    await drain(c, r, "n0")
    assert c.node("n0")["spec"]["unschedulable"] is True
    del c.live("n0")["metadata"]["annotations"][REMEDIATION_HISTORY_ANNOTATION]  # the runbook's
    kube.put("nodes", c.live("n0"))
    b = c.remediator("replica-b")  # a new leader reads what is left
    await drain(c, b, "n1")
    assert not c.node("n1")["spec"].get("unschedulable")  # one of four within the hour: n0


# -- smaller items -------------------------------------------------------------------------------
async def test_two_controllers_due_to_evict_one_pod_send_one_eviction(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=1)
    c.state.set_policy(parse_policy({"spec": {
        "remediation": {"enabled": True, "dryRun": False},
        "memory": {"overBudget": "evict", "overBudgetGrace": "1m"}}}))  # fmt: skip
    c.pod("both", "n0", 0, QosClass.INFERENCE)
    r = c.remediator()
    procs = [{"pid": 1, "pod_uid": "uid-both", "used_mib": 6000.0}]
    for _ in range(2):  # hot past migrateAfter and over budget past the grace
        c.seq += 1
        gpus = [gpu(0, temperature_c=96.0, processes=procs), gpu(1)]
        c.state.ingest(report_from(report("n0", gpus, seq=c.seq)))
        await r.step()
        c.clock.advance(121.0)
    assert _evictions(kube) == 1


async def test_a_recreated_pod_is_judged_by_itself_not_by_its_predecessor(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=1)
    c.pod("job", "n0", 0, QosClass.BEST_EFFORT)
    old = json.loads(json.dumps(kube.get("pods", "job")))
    old["metadata"]["uid"] = "uid-old"
    old["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    pods = {"uid-old": old, **{v["metadata"]["uid"]: v for k, v in kube.objects.items()
                               if k[0] == "pods"}}  # fmt: skip
    r = Remediator(
        c.state, make_api(kubeconfig), ExtenderMetrics(CollectorRegistry(), c.state),
        lambda _s: True, pods=lambda: pods,
    )  # fmt: skip
    _hot(c)
    await r.step()
    c.clock.advance(121.0)
    _hot(c)
    await r.step()
    assert "job" not in c.pods()  # its predecessor was leaving; it was not


async def test_a_reboot_record_without_a_boot_id_goes_to_a_human_not_to_verifying(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    r = c.remediator()
    await to_self_test(c, r)
    record: dict[str, Any] = dict(c.record("n0") or {}, state="reboot-requested", boot="")
    c.live("n0")["metadata"]["annotations"][REMEDIATION_ANNOTATION] = json.dumps(record)
    kube.put("nodes", c.live("n0"))
    c.push("n0", 0, host="host-2")
    await r.step()
    assert c.record("n0")["state"] == "needs-human"
    assert "reboot" not in r.requests("n0")


async def test_a_borrower_its_budget_keeps_past_drain_timeout_is_said_in_an_event(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = _lending(kube, kubeconfig)
    spec = {**LENDING, "remediation": {"enabled": True, "dryRun": False, "drainTimeout": "5m"}}
    c.state.set_policy(parse_policy({"spec": spec}))
    hold(c, "borrower", 3, QosClass.BEST_EFFORT, 400.0)
    live = kube.objects[("pods", "default", "borrower")]
    live["metadata"]["labels"] = {"app": "borrower"}
    kube.put("poddisruptionbudgets", {"metadata": {"name": "b", "namespace": "default"},
                                      "spec": {"selector": {"matchLabels": {"app": "borrower"}}},
                                      "status": {"disruptionsAllowed": 0}})  # fmt: skip
    r = c.remediator()
    for _ in range(8):
        sample(c, {"owner": 9000.0, "borrower": 2000.0})
        await r.step()
        c.clock.advance(61.0)
    assert "borrower" in c.pods()  # never forced
    (blocked,) = c.events("EdgeGPUReclaimBlocked")
    assert blocked["involvedObject"]["name"] == "borrower"


def test_a_list_comes_in_pages_and_misses_nothing(kube: FakeKube, kubeconfig: Path) -> None:
    for i in range(5):
        kube.add_node(f"p{i}")
    before = kube.pages
    items, version = make_api(kubeconfig).list("nodes", page=2)
    assert sorted(n["metadata"]["name"] for n in items) == [f"p{i}" for i in range(5)]
    assert kube.pages - before == 3 and version


# -- the ledger itself fails safe ----------------------------------------------------------------
async def test_a_trip_whose_write_failed_still_holds_and_is_written_later(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=4, breakerPercent=25, maxUnavailablePercent=100)
    r = c.remediator()
    await drain(c, r, "n0")
    assert c.node("n0")["spec"]["unschedulable"] is True
    kube.fail_next[("PUT", "configmaps/edgegpu-remediation-breaker")] = 500  # the trip's write
    await drain(c, r, "n1")
    assert not c.node("n1")["spec"].get("unschedulable")
    for _ in range(3):  # read again while it stands: the trip is not lost to the closed copy
        c.clock.advance(10.0)
        await drain(c, r, "n2")
    assert not c.node("n2")["spec"].get("unschedulable")
    assert _breaker(kube)["data"]["state"] == "tripped"


async def test_an_eviction_with_no_answer_still_counts(kube: FakeKube, kubeconfig: Path) -> None:
    c = Cluster(kube, kubeconfig, count=1)
    c.pod("hot", "n0", 0, QosClass.BEST_EFFORT)
    r = Remediator(
        c.state, make_api(kubeconfig), ExtenderMetrics(CollectorRegistry(), c.state),
        lambda _s: True, timeout_s=0.5,
    )  # fmt: skip
    kube.hang[("POST", r"/pods/hot/eviction")] = threading.Event()
    await _hot_past_migrate_after(c, r)
    kube.hang[("POST", r"/pods/hot/eviction")].set()
    assert len(json.loads(_breaker(kube)["data"]["evictions"])) == 1  # it may have been made


async def test_a_ledger_with_times_out_of_range_is_tripped_and_stops_no_round(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=1)
    c.pod("hot", "n0", 0, QosClass.BEST_EFFORT)
    odd = {"state": "closed", "since": "2026-01-01T00:00:00Z",
           "evictions": json.dumps(["9999-12-31T23:59:59-01:00"]), "cordons": "{}"}  # fmt: skip
    kube.put("configmaps", {"metadata": {"name": BREAKER[1], "namespace": BREAKER[2]},
                            "data": odd})  # fmt: skip
    registry = CollectorRegistry()
    r = _remediator(c, registry)
    await _hot_past_migrate_after(c, r)
    assert "hot" in c.pods()
    assert _counted(registry, "evict", "thermal", "breaker") >= 1
    said = c.events("EdgeGPURemediationBreakerTripped")  # said, once for this content
    assert len(said) == 1 and said[0].get("count", 1) == 1 and "unreadable" in said[0]["message"]


async def test_evictions_a_budget_refuses_are_taken_back_from_the_ledger_for_good(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=1, breakerEvictions=2)
    c.pod("hot", "n0", 0, QosClass.BEST_EFFORT)
    registry = CollectorRegistry()
    r = _remediator(c, registry)
    kube.refuse[("POST", r"/pods/hot/eviction$")] = 429  # a PodDisruptionBudget says no
    for _ in range(6):  # past migrateAfter in every round but the first, ledger read again
        _hot(c)
        await r.step()
        c.clock.advance(121.0)
    refused = _evictions(kube)
    assert refused >= 3 and _counted(registry, "evict", "thermal", "blocked") == refused
    data = _breaker(kube)["data"]
    assert data["state"] == "closed" and json.loads(data["evictions"]) == []
    del kube.refuse[("POST", r"/pods/hot/eviction$")]
    _hot(c)
    await r.step()
    assert "hot" not in c.pods()
    assert len(json.loads(_breaker(kube)["data"]["evictions"])) == 1


async def test_an_eviction_whose_reservation_failed_is_never_counted(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=1)
    c.pod("hot", "n0", 0, QosClass.BEST_EFFORT)
    r = _remediator(c, CollectorRegistry())
    _hot(c)
    await r.step()  # the ledger is made (a create)
    c.clock.advance(121.0)
    kube.fail_next[("PUT", "configmaps/edgegpu-remediation-breaker")] = 500  # the reservation
    _hot(c)
    await r.step()
    assert "hot" in c.pods() and _evictions(kube) == 0
    for _ in range(2):
        c.clock.advance(10.0)
        _hot(c)
        await r.step()
    assert "hot" not in c.pods() and _evictions(kube) == 1
    assert len(json.loads(_breaker(kube)["data"]["evictions"])) == 1  # the evicted one alone


async def test_a_cordon_the_api_refuses_is_not_counted_and_is_tried_again_less_often(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=4, breakerPercent=25, maxUnavailablePercent=100)
    r = c.remediator()
    kube.refuse[("PATCH", r"/nodes/n0$")] = 422  # e.g. a webhook that rejects the patch
    await drain(c, r, "n0")
    for _ in range(6):
        c.clock.advance(1.0)
        c.push("n0", 0)
        await r.step()
    patches = [m for m, _ in kube.requests_to(r"/nodes/n0$") if m == "PATCH"]
    assert 1 <= len(patches) <= 3  # backing off: 1 s, 2 s, 4 s...
    c.clock.advance(20.0)
    await r.step()
    assert json.loads(_breaker(kube)["data"]["cordons"]) == {}
    del kube.refuse[("PATCH", r"/nodes/n0$")]
    c.clock.advance(60.0)
    c.push("n0", 0)
    await r.step()
    assert c.node("n0")["spec"]["unschedulable"] is True
    data = _breaker(kube)["data"]
    assert data["state"] == "closed" and len(json.loads(data["cordons"])["n0"]) == 1


async def _until_requested(kube: FakeKube, method: str, pattern: str) -> None:
    for _ in range(400):
        if any(m == method for m, _ in kube.requests_to(pattern)):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {method} {pattern}")


async def test_a_node_opted_out_while_its_cordon_is_on_the_way_is_neither_cordoned_nor_drained(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=4, breakerPercent=25, maxUnavailablePercent=100)
    c.pod("work", "n0", 0, QosClass.BEST_EFFORT)
    r = c.remediator()
    c.push("n0", 0)
    await r.step()
    c.clock.advance(6.0)
    c.push("n0", 0)
    released = threading.Event()
    kube.hang[("PATCH", r"/nodes/n0 ")] = released  # the cordon, held on its way
    round_ = asyncio.create_task(r.step())
    await _until_requested(kube, "PATCH", r"/nodes/n0$")
    _opt_out(c, "n0")  # an operator's label lands first: the cordon's version is stale
    del kube.hang[("PATCH", r"/nodes/n0 ")]
    released.set()
    await round_
    for _ in range(3):
        c.clock.advance(6.0)
        c.push("n0", 0)
        await r.step()
    assert not c.node("n0")["spec"].get("unschedulable")
    assert "work" in c.pods() and _evictions(kube) == 0


async def test_a_ledger_tripped_by_an_operator_while_an_eviction_is_written_down_stops_it(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig, count=1)
    c.pod("hot", "n0", 0, QosClass.BEST_EFFORT)
    r = _remediator(c, CollectorRegistry())
    _hot(c)
    await r.step()  # the ledger is made
    c.clock.advance(121.0)
    released = threading.Event()
    kube.hang[("PUT", r"configmaps/edgegpu-remediation-breaker ")] = released  # the reservation
    _hot(c)
    round_ = asyncio.create_task(r.step())
    await _until_requested(kube, "PUT", r"configmaps/edgegpu-remediation-breaker$")
    held = _breaker(kube)
    held["data"].update(state="tripped", reason="held by an operator")
    kube.put("configmaps", held)
    del kube.hang[("PUT", r"configmaps/edgegpu-remediation-breaker ")]
    released.set()
    await round_
    assert "hot" in c.pods() and _evictions(kube) == 0
    data = _breaker(kube)["data"]
    assert data["state"] == "tripped" and json.loads(data["evictions"]) == []


def test_a_thousand_refusals_in_a_row_still_wait_a_minute() -> None:
    assert [backoff_s(n) for n in (0, 1, 2, 5, 6, 7, 2000)] == [1, 2, 4, 32, 60, 60, 60]


async def test_a_gap_with_no_leader_is_not_counted_against_a_self_test(
    kube: FakeKube, kubeconfig: Path
) -> None:
    c = Cluster(kube, kubeconfig)
    a = c.remediator()
    await to_self_test(c, a)
    c.clock.advance(1200.0)  # 20 minutes with no replica leading (selfTestTimeout is 10)
    b = c.remediator("replica-b")
    c.push("n0", 0)
    await b.step()
    assert c.record("n0")["state"] == "self-test"  # b waits its own 10 minutes
    c.clock.advance(660.0)
    c.push("n0", 0)
    await b.step()
    assert c.record("n0")["state"] == "needs-human"
    assert "no self-test verdict in 660 s" in json.dumps(c.record("n0"))
