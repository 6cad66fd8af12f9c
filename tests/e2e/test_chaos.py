"""Chaos on the real control plane: what remediation must not do when something goes wrong.

Each case breaks one thing the leader's remediation leans on (an agent's honesty, a record on a
Node, an edge link, the leader itself, a GPU that keeps failing, a human taking a node back) and
checks that it does no harm. Every case starts its own fault on one-GPU nodes of its own
(``extra_node``), waits for what must happen with generous timeouts (nothing depends on a
simulated timer or on the machine being fast), asserts what must not happen only after a fixed
observation window it states, and leaves the policy and the nodes as they were.

One case breaks what admission leans on instead: the agent, and so its device plugin, restarted
between a pod's bind and kubelet's Allocate, on a two-GPU node of its own where a guess would
give the other GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from node_agent.deviceplugin.devices import gpu_of
from tests.e2e.conftest import Cluster, extra_node, reported, until
from tests.e2e.edgegpu import Agent, Extender
from tests.e2e.fake_kubelet import DeviceManager
from tests.e2e.test_policy_and_auth import POLICY, patch_policy
from tests.e2e.test_resilience import lease_holder

POOL = {"edgegpu.io/e2e-pool": "chaos"}
RECORD = "edgegpu.io/remediation"
HISTORY = "edgegpu.io/remediation-history"
TAINT = "edgegpu.io/gpu-unhealthy"
# The cases share nodes and an hour: the breaker would count one case's cordons against the
# next (its own cases are in tests/k8s). 100: only every GPU node cordoned at once trips it.
ON = {"enabled": True, "dryRun": False, "maxUnavailablePercent": 10, "breakerPercent": 100}
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def _norm(value: Any) -> Any:
    """A policy value to compare: a duration ("1h", "1m30s") in seconds, anything else as is."""
    if isinstance(value, str) and re.fullmatch(r"(\d+(?:\.\d+)?[smh])+", value):
        parts = re.findall(r"(\d+(?:\.\d+)?)([smh])", value)
        return sum(float(n) * _UNITS[unit] for n, unit in parts)
    return value


@dataclass
class Chaos:
    """One case's nodes, pods and policy changes, undone afterwards."""

    cluster: Cluster
    ns: str
    nodes: contextlib.ExitStack
    saved: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Policy section → the values of the keys a case changed, as they were (None: absent)."""

    def node(self, name: str, agent_args: list[str] | None = None, gpus: int = 1) -> Agent:
        """A node of the case's pool (one GPU unless told) with its agent (steady), reported
        to every replica; gone after the case."""
        agent = self.nodes.enter_context(
            extra_node(self.cluster, name, gpus, agent_args or [], labels=POOL)
        )
        until(f"{name} reported to every replica", lambda: reported(self.cluster, name), 90.0)
        return agent

    def policy(self, spec: dict[str, dict[str, Any]]) -> None:
        """Patch the policy, and wait until every replica has it in force."""
        held = (self.cluster.cp.get(POLICY) or {}).get("spec") or {}
        for section, values in spec.items():
            saved = self.saved.setdefault(section, {})
            for key in values:
                saved.setdefault(key, (held.get(section) or {}).get(key))
        patch_policy(self.cluster, spec)

        def in_force() -> bool:
            for ext in self.cluster.extenders:
                doc = ext.get("/debug/policy")["policy"]["spec"]
                for section, values in spec.items():
                    for key, value in values.items():
                        if _norm(doc[section][key]) != _norm(value):
                            return False
            return True

        until("the policy in force on every replica", in_force, 60.0)

    def restore(self) -> None:
        """The policy as it was: remediation off, every key a case changed back."""
        spec = {section: dict(values) for section, values in self.saved.items()}
        spec.setdefault("remediation", {}).update({"enabled": False, "dryRun": True})
        patch_policy(self.cluster, spec)
        until("remediation off on every replica", lambda: not any(
            e.get("/debug/policy")["policy"]["spec"]["remediation"]["enabled"]
            for e in self.cluster.extenders), 60.0)  # fmt: skip

    def place(self, name: str, node: str, *, guarded: bool = False,
              tolerate_s: int | None = None, blocks: int = 1) -> dict[str, Any]:  # fmt: skip
        """An inference pod of ``blocks`` memory blocks (one unless told) on ``node``, Running.
        ``guarded``: under a PodDisruptionBudget that allows no disruption (its eviction is
        refused every time). ``tolerate_s``: how long it tolerates its node being not-ready or
        unreachable."""
        pod = self.cluster.pod(name, self.ns, blocks=blocks, qos="inference",
                               node_selector={**POOL, "kubernetes.io/hostname": node})  # fmt: skip
        pod["metadata"]["labels"] = {"app": name}
        if tolerate_s is not None:
            pod["spec"]["tolerations"] = [
                {"key": f"node.kubernetes.io/{key}", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": tolerate_s}
                for key in ("not-ready", "unreachable")
            ]  # fmt: skip
        if guarded:
            pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                   "metadata": {"name": name, "namespace": self.ns},
                   "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}}}}  # fmt: skip
            resp = self.cluster.cp.request(
                "POST", f"/apis/policy/v1/namespaces/{self.ns}/poddisruptionbudgets", json=pdb
            )
            assert resp.status_code == 201, resp.text
        self.cluster.create(pod)
        doc: dict[str, Any] = until(
            f"{name} Running on {node}",
            lambda: (
                (p := self.cluster.get_pod(self.ns, name))
                and p["spec"].get("nodeName") == node
                and (p.get("status") or {}).get("phase") == "Running"
                and p
            ),
            90.0,
        )
        return doc

    def evicted(self) -> dict[str, int]:
        """Pod uid → EdgeGPUEvicted Events for it in the case's namespace."""
        out: dict[str, int] = {}
        for e in events(self.cluster, self.ns):
            if e["reason"] == "EdgeGPUEvicted":
                uid = e["involvedObject"].get("uid", "")
                out[uid] = out.get(uid, 0) + 1
        return out

    def alive(self, name: str) -> bool:
        """Whether the pod is there and not leaving."""
        pod = self.cluster.get_pod(self.ns, name)
        return pod is not None and not pod["metadata"].get("deletionTimestamp")


@pytest.fixture
def chaos(cluster: Cluster, ns: str) -> Iterator[Chaos]:
    with contextlib.ExitStack() as nodes:
        case = Chaos(cluster, ns, nodes)
        try:
            yield case
        finally:
            case.restore()


def restart(agent: Agent, scenario: str) -> None:
    """Restart the node's agent with ``scenario`` from its first round (``xid-79``: GPU 0
    raises XID 79 until a passing self-test; ``ecc``: GPU 0 has uncorrectable ECC errors and
    fails its self-test; ``steady``: no fault)."""
    agent.stop()
    agent.scenario = scenario
    agent.scenario_after_s = 0.0
    agent.start()


def node(cluster: Cluster, name: str) -> dict[str, Any]:
    doc = cluster.cp.get(f"/api/v1/nodes/{name}")
    assert doc is not None, name
    return doc


def annotation(doc: dict[str, Any], key: str = RECORD) -> str | None:
    value = (doc["metadata"].get("annotations") or {}).get(key)
    return None if value is None else str(value)


def state(doc: dict[str, Any]) -> str | None:
    """The fault loop's state in the node's record (None: no record, "?": unreadable)."""
    text = annotation(doc)
    if text is None:
        return None
    try:
        return str(json.loads(text)["state"])
    except (ValueError, KeyError, TypeError):
        return "?"


def cordoned(doc: dict[str, Any]) -> bool:
    return bool(doc["spec"].get("unschedulable"))


def tainted(doc: dict[str, Any]) -> bool:
    """Whether the node carries our taint."""
    return any(t.get("key") == TAINT for t in doc["spec"].get("taints") or [])


def ready(doc: dict[str, Any]) -> bool:
    conditions = (doc.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def cordons(doc: dict[str, Any]) -> int:
    """How many times the loop cordoned the node for its GPU 0 (its repeat history)."""
    return len(json.loads(annotation(doc, HISTORY) or "{}").get("gpu0") or [])


def events(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    doc = cluster.cp.get(f"/api/v1/namespaces/{namespace}/events") or {}
    return list(doc.get("items") or [])


def node_reasons(cluster: Cluster, name: str) -> list[str]:
    """The reasons of edgegpu's Events on a Node, each as often as its Event counts it."""
    return [e["reason"] for e in cluster.events("default", name)
            if e.get("reportingComponent") == "edgegpu-extender"
            for _ in range(int(e.get("count") or 1))]  # fmt: skip


def metric(ext: Extender, name: str) -> float:
    """The sum of one metric's samples on a replica."""
    text = ext.fetch("/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name)] in " {"
    )


def gpu_health(cluster: Cluster, name: str) -> set[str]:
    """GPU 0's health as every replica has it."""
    return {e.get(f"/debug/nodes/{name}")["gpus"][0]["health"] for e in cluster.extenders}


# -- a report speaks only for its own node -------------------------------------------------------
def test_a_report_naming_another_nodes_pod_evicts_nothing_and_is_counted(
    cluster: Cluster, chaos: Chaos, say: Callable[[str], None]
) -> None:
    window_s = 30.0
    lie = cluster.cp.folder / "chaos-liar-processes.json"
    own = cluster.cp.folder / "chaos-victim-processes.json"
    for path in (lie, own):
        path.write_text("{}")
    chaos.node("liar-0", ["--pod-processes", str(lie)])
    chaos.node("victim-0", ["--pod-processes", str(own)])
    uid = chaos.place("victim", "victim-0")["metadata"]["uid"]
    chaos.policy({"remediation": ON, "memory": {"overBudget": "evict", "overBudgetGrace": "5s"}})
    before = [metric(e, "edgegpu_extender_foreign_processes_total") for e in cluster.extenders]
    # liar-0's agent, with its own token, reports a process of victim's using 8000 MiB of its
    # one block, on liar-0's GPU 0.
    process = json.dumps({"0": [{"pod_uid": uid, "used_mib": 8000}]})
    lie.write_text(process)
    until(
        "the foreign process counted on every replica",
        lambda: all(
            metric(e, "edgegpu_extender_foreign_processes_total") > b
            for e, b in zip(cluster.extenders, before, strict=True)
        ),
        60.0,
    )
    time.sleep(window_s)  # six times overBudgetGrace
    reasons = [e["reason"] for e in events(cluster, chaos.ns)]
    counted = [metric(e, "edgegpu_extender_foreign_processes_total") for e in cluster.extenders]
    assert chaos.alive("victim"), "victim evicted on liar-0's word"
    assert "EdgeGPUOverBudget" not in reasons and not chaos.evicted(), reasons
    # The control: the same process in victim-0's own report is acted on.
    lie.write_text("{}")
    own.write_text(process)
    started = time.monotonic()
    until("EdgeGPUOverBudget from victim-0's own report",
          lambda: "EdgeGPUOverBudget" in [e["reason"] for e in events(cluster, chaos.ns)],
          60.0)  # fmt: skip
    until("victim evicted after overBudgetGrace", lambda: not chaos.alive("victim"), 90.0)
    took = time.monotonic() - started
    say(f"\nchaos, a foreign report: liar-0 reported victim-0's pod over its block for "
        f"{window_s:.0f} s: not evicted, no Event; foreign processes counted "
        f"{[round(c - b) for c, b in zip(counted, before, strict=True)]} by the replicas; the "
        f"same process in victim-0's own report: evicted in {took:.1f} s")  # fmt: skip


# -- a record a person broke ---------------------------------------------------------------------
def test_a_corrupted_record_on_a_held_node_is_cleaned_up_with_an_event(
    cluster: Cluster, chaos: Chaos, say: Callable[[str], None]
) -> None:
    agent = chaos.node("scribble-0")
    chaos.place("guarded", "scribble-0", guarded=True)  # its budget keeps the node draining
    chaos.policy({"remediation": ON})
    restart(agent, "xid-79")
    until("scribble-0 cordoned and draining",
          lambda: (n := node(cluster, "scribble-0")) and state(n) == "draining"
          and cordoned(n) and tainted(n), 120.0)  # fmt: skip
    restart(agent, "steady")  # the fault is gone; the budget still keeps the node draining
    until("GPU 0 healthy again on every replica",
          lambda: gpu_health(cluster, "scribble-0") == {"healthy"}, 60.0)  # fmt: skip
    assert state(node(cluster, "scribble-0")) == "draining"
    resp = cluster.cp.request(
        "PATCH", "/api/v1/nodes/scribble-0",
        content=json.dumps({"metadata": {"annotations": {RECORD: "{garbage"}}}),
        headers={"content-type": "application/merge-patch+json"},
    )  # fmt: skip
    assert resp.status_code == 200, resp.text
    started = time.monotonic()
    until("scribble-0 uncordoned, untainted, its record gone",
          lambda: (n := node(cluster, "scribble-0")) and not cordoned(n) and not tainted(n)
          and annotation(n) is None, 60.0)  # fmt: skip
    took = time.monotonic() - started
    until("an EdgeGPURecordCleanedUp Event",
          lambda: "EdgeGPURecordCleanedUp" in node_reasons(cluster, "scribble-0"), 30.0)  # fmt: skip
    doc = node(cluster, "scribble-0")
    condition = next(c for c in doc["status"]["conditions"] if c["type"] == "EdgeGPUHealthy")
    say(f"\nchaos, a corrupted record: scribble-0 (draining, fault gone) cleaned up "
        f"{took:.1f} s after its annotation became garbage; Events on it: "
        f"{sorted(set(node_reasons(cluster, 'scribble-0')))}")  # fmt: skip
    assert condition["status"] == "True", condition
    assert chaos.alive("guarded")


# -- an edge link drops --------------------------------------------------------------------------
def test_an_edge_node_not_ready_and_silent_for_two_minutes_is_not_drained(
    cluster: Cluster, chaos: Chaos, say: Callable[[str], None]
) -> None:
    window_s = 120.0
    agent = chaos.node("edge-0")
    for i in range(2):  # they tolerate the link down for 15 minutes, as edge workloads do
        chaos.place(f"edge-app-{i}", "edge-0", tolerate_s=900)
    chaos.policy({"remediation": ON})  # unreachableAfter left at its default
    unreachable = {
        _norm(e.get("/debug/policy")["policy"]["spec"]["remediation"]["unreachableAfter"])
        for e in cluster.extenders
    }
    assert unreachable == {300.0}, unreachable
    agent.stop()  # the link drops: the agent is silent and kubelet's heartbeats stop
    cluster.kubelet.silence("edge-0")
    started = time.monotonic()
    until("edge-0 NotReady", lambda: not ready(node(cluster, "edge-0")), 180.0)
    not_ready_after = time.monotonic() - started
    seen: list[str] = []
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline:
        doc = node(cluster, "edge-0")
        if cordoned(doc) or tainted(doc) or annotation(doc) is not None:
            seen.append(f"node {doc['spec'].get('unschedulable')} {annotation(doc)}")
        seen += [f"edge-app-{i} leaving" for i in range(2) if not chaos.alive(f"edge-app-{i}")]
        assert ready(doc) is False, "edge-0 came back during the window"
        time.sleep(2.0)
    reasons = node_reasons(cluster, "edge-0")
    say(f"\nchaos, an edge partition: edge-0 NotReady {not_ready_after:.0f} s after its agent "
        f"and heartbeats stopped, then watched {window_s:.0f} s: nothing evicted, not cordoned, "
        f"no Event ({len(seen)} findings)")  # fmt: skip
    assert not seen, seen[:5]
    assert not chaos.evicted() and not reasons, reasons


# -- the leader frozen ---------------------------------------------------------------------------
_ACTED = re.compile(
    r"remediation: (evicted |evicting |node \S+: (cordon|evict|self-test|reboot|uncordon|release|"
    r"needs-human|clean-up)\b)"
)
"""Lines an extender logs when it acts on the cluster, or tries to (a refused eviction too)."""


def _stamp(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_frozen_leader_is_replaced_and_changes_nothing_when_it_wakes(
    cluster: Cluster, chaos: Chaos, say: Callable[[str], None]
) -> None:
    frozen_s, woken_s = 15.0, 30.0
    names = ["freeze-0", "freeze-1"]
    agents = [chaos.node(n) for n in names]
    pods: dict[str, dict[str, str]] = {}
    for n in names:  # one pod that can go, one a budget keeps: the node stays held
        free = chaos.place(f"free-{n[-1]}", n)
        chaos.place(f"held-{n[-1]}", n, guarded=True)
        pods[n] = {"free": f"free-{n[-1]}", "uid": free["metadata"]["uid"]}
    # 7 GPU nodes: 10 % lets one be held at a time, the other waits suspect.
    chaos.policy({"remediation": ON})
    for agent in agents:
        restart(agent, "xid-79")

    def held() -> str | None:
        for n in names:
            doc = node(cluster, n)
            if state(doc) == "draining" and cordoned(doc) and not chaos.alive(pods[n]["free"]):
                return n
        return None

    x = until("one node held, its free pod evicted", held, 120.0)
    y = next(n for n in names if n != x)
    by_name = {e.name: e for e in cluster.extenders}
    leader = until("a leader", lambda: (h := lease_holder(cluster)) in by_name and h)
    other = next(e for e in cluster.extenders if e.name != leader)
    proc = by_name[leader].process
    assert proc is not None

    most: list[int] = [0]
    holders: list[tuple[float, str]] = []
    stop = threading.Event()

    def watch() -> None:  # the cap, and who holds the Lease, all along
        while not stop.wait(0.5):
            with contextlib.suppress(Exception):
                most[0] = max(most[0], sum(tainted(d) and cordoned(d)
                                           for d in (node(cluster, n) for n in names)))  # fmt: skip
                holders.append((time.monotonic(), lease_holder(cluster)))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    os.kill(proc.popen.pid, signal.SIGSTOP)
    stopped = True
    offset = proc.log.stat().st_size  # frozen: what it logs from here on, it logs once woken
    try:
        started = time.monotonic()
        until("the other replica takes the Lease",
              lambda: lease_holder(cluster) == other.name, 60.0)  # fmt: skip
        took = time.monotonic() - started
        until(f"{other.name} holds {x}",
              lambda: x in [r["node"] for r in other.get("/debug/remediation")["nodes"]], 60.0)  # fmt: skip
        time.sleep(frozen_s)
        woke = time.time()
        woke_at = time.monotonic()
        os.kill(proc.popen.pid, signal.SIGCONT)
        stopped = False
        time.sleep(woken_s)
    finally:
        if stopped:
            os.kill(proc.popen.pid, signal.SIGCONT)
        stop.set()
        watcher.join(timeout=10.0)
    logged = proc.log.read_bytes()[offset:].decode(errors="replace")
    acted = [line for line in logged.splitlines() if _ACTED.search(line)]
    since = _stamp(woke)
    late = [
        (e["reason"], e["involvedObject"]["name"])
        for ns in (chaos.ns, "default")
        for e in events(cluster, ns)
        if e.get("reportingInstance") == leader and (e.get("lastTimestamp") or "") >= since
    ]
    evicted = chaos.evicted()
    after = {h for t, h in holders if t >= woke_at}
    say(f"\nchaos, the leader frozen: {leader} stopped with {x} held; {other.name} took the "
        f"Lease in {took:.1f} s; {leader} woke after {frozen_s + took:.0f} s and was watched "
        f"{woken_s:.0f} s: {len(acted)} actions logged, {len(late)} Events; most nodes held at "
        f"once: {most[0]}; evictions by pod: {sorted(evicted.values())}")  # fmt: skip
    assert not acted, acted[:5]
    assert not late, late
    assert after == {other.name}, after
    assert most[0] <= 1  # 10 % of 7 GPU nodes
    assert evicted.get(pods[x]["uid"]) == 1 and all(v == 1 for v in evicted.values()), evicted
    assert chaos.alive(pods[y]["free"]) and not cordoned(node(cluster, y))
    assert metric(by_name[leader], "edgegpu_extender_leader") == 0.0
    cluster.fresh()


# -- a GPU that keeps failing --------------------------------------------------------------------
def back(cluster: Cluster, n: int) -> Callable[[], bool]:
    """Whether repeat-0 was cordoned ``n`` times and is uncordoned, its record gone."""

    def check() -> bool:
        doc = node(cluster, "repeat-0")
        return cordons(doc) == n and not cordoned(doc) and annotation(doc) is None

    return check


def test_the_third_xid_on_a_gpu_within_the_window_goes_to_needs_human(
    cluster: Cluster, chaos: Chaos, say: Callable[[str], None]
) -> None:
    agent = chaos.node("repeat-0")
    chaos.policy({"remediation": {**ON, "repeatLimit": 3, "repeatWindow": "1h"}})
    started = time.monotonic()
    passes: list[float] = []
    for n in (1, 2):
        restart(agent, "xid-79")  # a restarted agent raises the XID again
        until(f"fault {n}: repeat-0 cordoned, tested and uncordoned", back(cluster, n), 180.0)
        passes.append(time.monotonic() - started)
    restart(agent, "xid-79")
    until("fault 3: repeat-0 needs a human",
          lambda: (d := node(cluster, "repeat-0")) and state(d) == "needs-human"
          and cordoned(d), 180.0)  # fmt: skip
    took = time.monotonic() - started
    # The Events follow the node's write.
    until("an EdgeGPUNeedsHuman Event",
          lambda: "EdgeGPUNeedsHuman" in node_reasons(cluster, "repeat-0"), 30.0)  # fmt: skip
    reasons = node_reasons(cluster, "repeat-0")
    say(f"\nchaos, a repeated XID: repeat-0 uncordoned after passing self-tests at "
        f"{passes[0]:.0f} s and {passes[1]:.0f} s, needs-human on the third fault at "
        f"{took:.0f} s; Events: {sorted(reasons)}")  # fmt: skip
    assert reasons.count("EdgeGPUNeedsHuman") == 1, reasons
    assert reasons.count("EdgeGPUSelfTestRequested") == 2, reasons
    assert reasons.count("EdgeGPUUncordoned") == 2, reasons


# -- a human takes the node back -----------------------------------------------------------------
def test_a_manual_uncordon_during_reboot_requested_withdraws_the_agents_sentinel(
    cluster: Cluster, chaos: Chaos, say: Callable[[str], None]
) -> None:
    agent = chaos.node("reboot-0")
    chaos.policy({"remediation": ON})
    restart(agent, "ecc")  # the self-test fails: a reboot is asked
    until("reboot-0 in reboot-requested, the sentinel written",
          lambda: state(node(cluster, "reboot-0")) == "reboot-requested"
          and agent.sentinel.exists(), 180.0)  # fmt: skip
    text = agent.sentinel.read_text()
    assert text.startswith("edgegpu remediation "), text
    resp = cluster.cp.request(
        "PATCH", "/api/v1/nodes/reboot-0", content=json.dumps({"spec": {"unschedulable": False}}),
        headers={"content-type": "application/merge-patch+json"},
    )  # fmt: skip
    assert resp.status_code == 200, resp.text
    started = time.monotonic()
    until("reboot-0 released, our taint removed",
          lambda: (d := node(cluster, "reboot-0")) and state(d) == "released"
          and not tainted(d), 60.0)  # fmt: skip
    until("the sentinel withdrawn", lambda: not agent.sentinel.exists(), 120.0)
    took = time.monotonic() - started
    say(f"\nchaos, a manual uncordon in reboot-requested: reboot-0 released and its agent's "
        f"sentinel withdrawn {took:.1f} s after the uncordon")  # fmt: skip
    assert not cordoned(node(cluster, "reboot-0"))
    until("an EdgeGPUReleased Event",
          lambda: "EdgeGPUReleased" in node_reasons(cluster, "reboot-0"), 30.0)  # fmt: skip


# -- an agent restarted between bind and Allocate ------------------------------------------------
def plugged(manager: DeviceManager, since: int, blocks: int) -> Callable[[], set[str] | None]:
    """The node's GPUs, once a plugin registered from the ``since``-th device manager event on
    has streamed all ``blocks`` of them healthy; None until then."""

    def check() -> set[str] | None:
        events = list(manager.events)[since:]
        at = next((i for i, e in enumerate(events) if e["event"] == "registered"), None)
        if at is None:
            return None
        for e in events[at + 1 :]:
            devices = (e.get("devices") or []) if e["event"] == "devices" else []
            if len(devices) == blocks and all(d["health"] == "Healthy" for d in devices):
                return {gpu_of(d["id"]) for d in devices}
        return None

    return check


def test_an_agent_restarted_between_bind_and_allocate_gives_binds_gpu_or_a_reason(
    cluster: Cluster, chaos: Chaos, monkeypatch: pytest.MonkeyPatch, say: Callable[[str], None]
) -> None:
    name, blocks = "replug-0", 6  # two T4s of 3 blocks (15 GiB / 4 GiB)
    agent = chaos.node(name, ["--model", "Tesla T4"], gpus=2)
    manager = cluster.kubelet.device_managers[name]
    gpus = until(f"{name}'s {blocks} blocks healthy at kubelet", plugged(manager, 0, blocks), 60.0)
    # busy takes 2 of one GPU's 3 blocks: a plugin that forgot the bind's choice and offered the
    # tightest fit would give a one-block pod that GPU; the extender spreads a training pod to
    # the other one, which has room.
    busy = chaos.place("busy", name, blocks=2)["metadata"]["annotations"]["edgegpu.io/gpu-uuid"]
    # kubelet's admission of held waits here (in the fake kubelet's pod watch) until released.
    target = f"{chaos.ns}/held"
    allocate = manager.allocate
    reached, release = threading.Event(), threading.Event()

    def admission(resource: str, size: int, pod: str, container: str) -> dict[str, Any]:
        if pod == target:
            reached.set()
            release.wait(300.0)  # never for ever: every node's pods wait on this thread
        return allocate(resource, size, pod, container)

    monkeypatch.setattr(manager, "allocate", admission)
    try:
        pod = cluster.pod("held", chaos.ns, blocks=1, qos="training",
                          node_selector={**POOL, "kubernetes.io/hostname": name})  # fmt: skip
        cluster.create(pod)
        until("kubelet admitting held", reached.is_set, 90.0)
        doc = until("held bound with its GPU", lambda: (p := cluster.get_pod(chaos.ns, "held"))
                    and (p["metadata"].get("annotations") or {}).get("edgegpu.io/gpu-uuid")
                    and p, 30.0)  # fmt: skip
        bound = doc["metadata"]["annotations"]["edgegpu.io/gpu-uuid"]
        assert doc["spec"].get("nodeName") == name, doc["spec"]
        assert (doc.get("status") or {}).get("phase") in (None, "Pending"), doc.get("status")
        assert bound in gpus and bound != busy, (
            f"held bound to {bound}, busy holds blocks of {busy}: a guess would give the same "
            f"GPU, and this case would prove nothing"
        )
        since = len(manager.events)
        started = time.monotonic()
        restart(agent, "steady")
        until(f"{name}'s plugin registered again, its blocks healthy",
              plugged(manager, since, blocks), 120.0)  # fmt: skip
        held_s = time.monotonic() - started
    finally:
        release.set()
    doc = until("held Running, or failed at admission",
                lambda: (p := cluster.get_pod(chaos.ns, "held"))
                and (p.get("status") or {}).get("phase") in ("Running", "Failed") and p, 90.0)  # fmt: skip
    status = doc["status"]
    given = [e for e in list(manager.events)
             if e.get("pod") == target and e["event"] == "allocated"]  # fmt: skip
    if status["phase"] == "Running":
        assert len(given) == 1, given
        devices = given[0]["devices"]
        envs = cluster.kubelet.envs[(chaos.ns, "held")]
        assert {gpu_of(d) for d in devices} == {bound}, f"bound to {bound}, given {devices}"
        assert envs.get("NVIDIA_VISIBLE_DEVICES") == bound, envs
        assert envs.get("EDGEGPU_GPU_UUID") == bound, envs
        assert envs.get("EDGEGPU_MEM_LIMIT_MIB") == "4096", envs
        outcome = f"given {len(devices)} block of the bind's GPU, nothing else"
    else:
        message = str(status.get("message") or "")
        outcome = f"admission failed: {message}"
        assert status.get("reason") == "UnexpectedAdmissionError", status
        assert not given, given  # nothing allocated to it, of any GPU
        # The reason names the GPU: the bind's, or the one kubelet was refused.
        assert any(g in message for g in gpus), message
    say(f"\nchaos, an agent restarted between bind and Allocate: held bound to {name}'s "
        f"{bound[:12]}… (a guess would give {busy[:12]}…); its admission waited {held_s:.1f} s "
        f"while the agent restarted and its plugin registered again; then {outcome}")  # fmt: skip
