"""A rolling GPU maintenance on the real control plane: three simulated nodes, one at a time.

Each node's agent runs a step from its own allow-list file (a small program that records that
it ran), then the validation the extender asks for; the leader cordons, drains, asks and
uncordons through the API server, and writes every move into the GPUMaintenance's status.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Cluster, extra_node, reported, until
from tests.e2e.edgegpu import Agent
from tests.e2e.test_policy_and_auth import patch_policy
from tests.e2e.test_resilience import lease_holder

NODES = ("maint-0", "maint-1", "maint-2")
PATH = "/apis/edgegpu.io/v1alpha1/gpumaintenances"


def _acting(cluster: Cluster) -> bool:
    return all(
        (r := e.get("/debug/policy")["policy"]["spec"]["remediation"])["enabled"] is True
        and r["dryRun"] is False
        for e in cluster.extenders
    )


@pytest.fixture
def fleet(cluster: Cluster, tmp_path: Path) -> Iterator[Callable[..., dict[str, Agent]]]:
    """Three one-GPU nodes whose agents allow the step ``driver-upgrade``, gone afterwards."""
    with contextlib.ExitStack() as stack:

        def make(failing: str = "") -> dict[str, Agent]:
            agents = {}
            for name in NODES:
                ran = tmp_path / f"{name}.ran"
                steps = tmp_path / f"{name}-steps.yaml"
                program = "import sys, time; time.sleep(1); open(sys.argv[1], 'a').write('x')"
                steps.write_text(json.dumps({"steps": {"driver-upgrade": {
                    "command": [sys.executable, "-c", program, str(ran)], "timeout": "2m",
                }}}))  # fmt: skip
                args = ["--maintenance-steps", str(steps)]
                if name == failing:
                    args += ["--scenario", "fails-validation"]
                agents[name] = stack.enter_context(
                    extra_node(cluster, name, 1, args, labels={"edgegpu.io/e2e-pool": "maint"})
                )
            for name in NODES:
                until(f"{name} reported to every replica", lambda n=name: reported(cluster, n),
                      60.0)  # fmt: skip
            patch_policy(cluster, {"remediation": {"enabled": True, "dryRun": False}})
            until("remediation acting on every replica", lambda: _acting(cluster), 30.0)
            return agents

        try:
            yield make
        finally:
            for doc in (cluster.cp.get(PATH) or {}).get("items") or []:
                cluster.cp.request("DELETE", f"{PATH}/{doc['metadata']['name']}")
            until("the maintenances gone", lambda: not (cluster.cp.get(PATH) or {}).get("items"),
                  60.0)  # fmt: skip
            patch_policy(cluster, {"remediation": {"enabled": False, "dryRun": True}})


def _create(cluster: Cluster, name: str) -> None:
    body = {"apiVersion": "edgegpu.io/v1alpha1", "kind": "GPUMaintenance",
            "metadata": {"name": name},
            "spec": {"nodes": list(NODES), "step": "driver-upgrade", "maxUnavailable": 1}}  # fmt: skip
    resp = cluster.cp.request("POST", PATH, json=body)
    assert resp.status_code == 201, resp.text


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict((cluster.cp.get(f"{PATH}/{name}") or {}).get("status") or {})


def _held(cluster: Cluster) -> list[str]:
    out = []
    for name in NODES:
        node = cluster.cp.get(f"/api/v1/nodes/{name}") or {}
        taints = [t["key"] for t in node.get("spec", {}).get("taints") or []]
        if node.get("spec", {}).get("unschedulable") or "edgegpu.io/maintenance" in taints:
            out.append(name)
    return out


def test_a_maintenance_takes_three_nodes_one_at_a_time_through_a_leader_kill(
    cluster: Cluster, fleet: Callable[..., dict[str, Agent]], tmp_path: Path,
    say: Callable[[str], None],
) -> None:  # fmt: skip
    fleet()
    _create(cluster, "upgrade")
    t0 = time.monotonic()
    most = 0
    killed: list[str] = []
    done_at: dict[str, float] = {}

    def progress() -> bool:
        nonlocal most
        most = max(most, len(_held(cluster)))
        status = _status(cluster, "upgrade")
        states = {n: e["state"] for n, e in (status.get("nodes") or {}).items()}
        for n, s in states.items():
            if s == "done":
                done_at.setdefault(n, time.monotonic() - t0)
        if not killed and states.get("maint-1") == "step":
            leader = next(e for e in cluster.extenders if e.name == lease_holder(cluster))
            assert leader.process is not None
            leader.process.popen.kill()  # mid-wave, no chance to hand over
            leader.process.popen.wait()
            killed.append(leader.name)
        assert status.get("phase") not in ("Failed", "Aborted", "Invalid"), status
        return status.get("phase") == "Succeeded"

    try:
        until("the maintenance Succeeded", progress, 240.0)
    finally:
        for e in cluster.extenders:
            if e.name in killed:
                e.stop()
                e.start()
        cluster.fresh()
    ran = {n: (tmp_path / f"{n}.ran").read_text() for n in NODES}
    say(
        "maintenance of 3 nodes, maxUnavailable 1, the leader killed during maint-1's step: "
        + ", ".join(f"{n} done {done_at[n]:.1f} s" for n in NODES)
    )
    assert killed and most == 1, (killed, most)  # never two held at once
    assert ran == {n: "x" for n in NODES}  # each step ran once, the killed leader's too
    assert done_at["maint-0"] < done_at["maint-1"] < done_at["maint-2"]
    assert not _held(cluster)
    labels = {n: ((cluster.cp.get(f"/api/v1/nodes/{n}") or {})["metadata"].get("labels") or {})
              .get("edgegpu.io/maintenance-state") for n in NODES}  # fmt: skip
    assert labels == {n: "done" for n in NODES}
    reasons = {e["reason"] for e in cluster.events("default", "maint-1")}
    assert {"EdgeGPUMaintenanceStarted", "EdgeGPUMaintenanceDone"} <= reasons, reasons


def test_a_failing_validation_on_the_second_node_stops_the_maintenance(
    cluster: Cluster, fleet: Callable[..., dict[str, Agent]], tmp_path: Path,
    say: Callable[[str], None],
) -> None:  # fmt: skip
    fleet(failing="maint-1")
    _create(cluster, "upgrade-fails")
    status = until("the maintenance stopped",
                   lambda: (s := _status(cluster, "upgrade-fails")).get("phase") in
                   ("Failed", "Succeeded") and s, 180.0)  # fmt: skip
    states = {n: e["state"] for n, e in status["nodes"].items()}
    say(f"maintenance with a failing validation on maint-1: {states}; {status['message'][:200]}")
    assert status["phase"] == "Failed", status
    assert states == {"maint-0": "done", "maint-1": "failed", "maint-2": "pending"}
    assert "validation failed" in status["nodes"]["maint-1"]["message"]
    assert _held(cluster) == ["maint-1"]  # kept for a person; maint-2 untouched
    assert not (tmp_path / "maint-2.ran").exists()
    time.sleep(5)  # rounds go on: nothing more starts
    assert _status(cluster, "upgrade-fails")["nodes"]["maint-2"]["state"] == "pending"


def test_the_ansible_playbook_maintains_host_by_host_and_stops_on_the_first_failure(
    cluster: Cluster, fleet: Callable[..., dict[str, Agent]], tmp_path: Path,
    say: Callable[[str], None],
) -> None:  # fmt: skip
    """ansible-core runs ``ansible/maintenance.yml`` over local hosts named as the nodes."""
    fleet(failing="maint-1")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[gpu]\n" + "".join(f"{n} ansible_connection=local\n" for n in NODES))
    plugin = [sys.executable, "-m", "scheduler_extender.cli.kubectl",
              "--kubeconfig", str(cluster.cp.admin_kubeconfig)]  # fmt: skip
    extra = {"edgegpu_step": "driver-upgrade", "edgegpu_kubectl": plugin,
             "edgegpu_wait_timeout_s": 120, "ansible_python_interpreter": sys.executable}  # fmt: skip
    root = Path(__file__).resolve().parents[2]
    started = time.monotonic()
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory),
         str(root / "ansible" / "maintenance.yml"), "-e", json.dumps(extra)],
        capture_output=True, text=True, timeout=400, check=False,
        env={**os.environ, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
             "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
             "ANSIBLE_HOME": str(tmp_path / "ansible-home")},
    )  # fmt: skip
    took = time.monotonic() - started
    states = {n: _status(cluster, f"ansible-{n}").get("phase") for n in NODES}
    say(f"ansible-playbook over 3 hosts, the second failing its validation: exit "
        f"{proc.returncode} in {took:.0f} s; phases {states}")  # fmt: skip
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert states == {"maint-0": None, "maint-1": "Failed", "maint-2": None}, (
        states, proc.stdout[-3000:], proc.stderr[-2000:])  # fmt: skip
    assert (tmp_path / "maint-0.ran").read_text() == "x"  # maint-0 done, then ended
    assert not (tmp_path / "maint-2.ran").exists()
    assert _held(cluster) == ["maint-1"]
