"""``make bench-openb-e2e``: a slice of the OpenB trace through the real kube-scheduler.

For each seed, a random subset of the OpenB nodes becomes Node objects on the e2e control plane
(CPU, memory, GPUs and their model as a label), one report per node tells the extender of its
GPUs (1,000 blocks each: one block per milli-GPU, as the replay's policy says), and the seed's
workload (the replay harness's arrival order, 130 % of the GPUs) is created pod by pod: each gets
one scheduling attempt, and a pod that fits nowhere is deleted. The unallocated GPU % at 100 %
arrived is the replay harness's own measure, computed the same way; the harness with edgegpu's
policy (choosing by the full-precision score) runs on the same subset and order beside it. Writes
``benchmarks/results/openb-e2e.json``.

Profiles: ``shipped`` (manifests/scheduler/kube-scheduler-config.yaml as it is: every pod of
the profile reaches the extender with kube-scheduler's default share of feasible nodes, and
filter answers the best one), ``gpupods`` (the same with ``managedResources`` naming the GPU
resources: pods without GPUs never reach the extender and kube-scheduler places them itself)
and ``every-node`` (every feasible node sent: ``percentageOfNodesToScore: 100``). The extender
breaks ties between equally good nodes with the seed's random choices; the harness picks by
the same full-precision score.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from benchmarks.e2e import PinnedExtender, create_nodes, log
from benchmarks.openb import frag, ours, replay, trace
from scheduler_extender.names import MEM_BLOCK_RESOURCE
from tests.e2e.controlplane import ROOT, ControlPlane, wait_until
from tests.e2e.edgegpu import EdgegpuScheduler, install

MODEL_LABEL = "edgegpu.io/gpu-model"
NAMESPACE = "openb"
SCHEDULER = "edgegpu-scheduler"


def subset(nodes: trace.Nodes, count: int, seed: int) -> trace.Nodes:
    """``count`` nodes drawn at random (by seed), kept in name order."""
    rows = np.sort(np.random.default_rng([seed, count]).choice(nodes.size, count, replace=False))
    return trace.Nodes(
        names=tuple(nodes.names[i] for i in rows),
        cpu=nodes.cpu[rows],
        memory=nodes.memory[rows],
        gpus=nodes.gpus[rows],
        model=nodes.model[rows],
        models=nodes.models,
    )


def node_name(nodes: trace.Nodes, i: int) -> str:
    """A Kubernetes name for trace node ``i``."""
    return nodes.names[i].lower().replace("_", "-")


def node_objects(nodes: trace.Nodes, i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Node ``i`` and its status: allocatable CPU, memory, GPUs and memory blocks."""
    name = node_name(nodes, i)
    gpus = int(nodes.gpus[i])
    resources = {"cpu": f"{nodes.cpu[i]}m", "memory": f"{nodes.memory[i]}Mi", "pods": "1000"}
    if gpus:
        resources |= {"nvidia.com/gpu": str(gpus), MEM_BLOCK_RESOURCE: str(gpus * trace.MILLI)}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                MODEL_LABEL: nodes.models[nodes.model[i]] if gpus else "none",
            },
        },
    }
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
    status = {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}}
    return node, status


def report(nodes: trace.Nodes, i: int) -> dict[str, Any]:
    """Node ``i``'s telemetry: idle GPUs of 1,000 MiB, readings as the harness assumes them."""
    name = node_name(nodes, i)
    return {
        "schema": "edgegpu.io/telemetry/v1",
        "node": name,
        "agent": {"version": "bench", "backend": "simulated", "boot_id": f"b-{i}", "seq": 1},
        "sampled_at": "2026-12-05T00:00:00Z",
        "interval_s": 3600,
        "node_health": {"driver_ok": True, "device_nodes_ok": True},
        "gpus": [
            {"index": g, "uuid": f"GPU-{name}-{g}", "model": nodes.models[nodes.model[i]],
             "temperature_c": 50.0, "power_w": 100.0, "power_limit_w": 300.0,
             "utilization_pct": 0.0, "memory_total_mib": float(trace.MILLI * ours.BLOCK_MIB),
             "memory_used_mib": 0.0, "health": "healthy"}
            for g in range(int(nodes.gpus[i]))
        ],
    }  # fmt: skip


def pod_object(pods: trace.Pods, j: int, name: str) -> dict[str, Any]:
    """Trace pod ``j`` as a Pod: its CPU and memory, its GPU share, its accepted models."""
    shape = pods.shape(j)
    requests: dict[str, str] = {}
    if pods.cpu[j]:
        requests["cpu"] = f"{pods.cpu[j]}m"
    if pods.memory[j]:
        requests["memory"] = f"{pods.memory[j]}Mi"
    limits: dict[str, str] = {}
    if shape.sharing:
        limits[MEM_BLOCK_RESOURCE] = str(shape.milli)
    elif shape.wants_gpu:
        limits["nvidia.com/gpu"] = str(shape.num)
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "app", "image": "example/app",
                        "resources": {"requests": requests, "limits": limits}}],
    }  # fmt: skip
    accepted = pods.specs[pods.spec[j]]
    if shape.wants_gpu and accepted:
        term = {"matchExpressions": [{"key": MODEL_LABEL, "operator": "In",
                                      "values": sorted(accepted)}]}  # fmt: skip
        spec["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}  # fmt: skip
    qos = pods.qos[j].wire
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"edgegpu.io/qos": qos}}, "spec": spec}  # fmt: skip


PROFILES = ("shipped", "gpupods", "every-node")


def scheduler_config(doc: dict[str, Any], profile: str) -> dict[str, Any]:
    """The project's configuration, changed as the profile says."""
    doc["clientConnection"].update(qps=1000, burst=2000)
    if profile == "gpupods":
        for ext in doc["extenders"]:
            ext["managedResources"] = [
                {"name": name, "ignoredByScheduler": False}
                for name in (MEM_BLOCK_RESOURCE, "nvidia.com/gpu")
            ]
    elif profile == "every-node":
        doc["percentageOfNodesToScore"] = 100
    elif profile != "shipped":
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, not {profile!r}")
    return doc


def call(api: httpx.Client, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    """One API call; anything but success stops the run."""
    resp = api.request(method, path, **kwargs)
    if resp.status_code >= 300:
        raise RuntimeError(f"{method} {path}: {resp.status_code} {resp.text[:300]}")
    out: dict[str, Any] = resp.json()
    return out


def decided(api: httpx.Client, name: str, timeout_s: float = 30.0) -> str:
    """``bound``, ``unschedulable`` or ``error`` once the scheduler has tried the pod."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pod = call(api, "GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        if pod.get("spec", {}).get("nodeName"):
            return "bound"
        for c in pod.get("status", {}).get("conditions", []):
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                return "unschedulable" if c.get("reason") == "Unschedulable" else "error"
        time.sleep(0.01)
    return "error"


def run_real(
    folder: Path,
    nodes: trace.Nodes,
    pods: trace.Pods,
    order: np.ndarray,
    profile: str,
    seed: int,
) -> dict[str, Any]:
    """The workload through the real scheduler: per-event arrived and used milli-GPU."""
    cp = ControlPlane(folder)
    stack = contextlib.ExitStack()
    try:
        cp.start(controllers=False)
        api = stack.enter_context(cp.client())
        merge = {"content-type": "application/merge-patch+json"}
        asyncio.run(create_nodes(cp, [node_objects(nodes, i) for i in range(nodes.size)]))
        install(cp, rollouts=False)
        policy = yaml.safe_load(ours.POLICY_FILE.read_text())["spec"]
        call(api, "PATCH", "/apis/kepler.io/v1/gpuschedulingpolicies/edge-gpu-policy",
             json={"spec": policy}, headers=merge)  # fmt: skip
        token = secrets.token_hex(16)
        (folder / "agent-tokens").write_text(f"{token} *\n")
        ext = PinnedExtender(cp, "edgegpu-extender-0")
        ext.token_file = folder / "agent-tokens"
        ext.extra_env["EDGEGPU_TIE_SEED"] = str(seed)
        ext.start()
        with httpx.Client(base_url=ext.url, timeout=30, verify=ext.context(),
                          headers={"authorization": f"Bearer {token}"}) as client:  # fmt: skip
            for i in range(nodes.size):
                resp = client.post("/v1/telemetry", json=report(nodes, i))
                if resp.status_code != 200:
                    raise RuntimeError(f"push {i}: {resp.status_code} {resp.text[:200]}")

        def policy_applied() -> bool:
            doc = ext.get("/debug/policy")
            return bool(doc and doc["policy"]["spec"]["fragmentation"]["enabled"])

        wait_until("the replay's policy", policy_applied, 30.0, 0.2)
        sched = EdgegpuScheduler(cp, ext.url)
        original = sched.config
        sched.config = lambda: scheduler_config(original(), profile)  # type: ignore[method-assign]
        sched.start()
        call(api, "POST", "/api/v1/namespaces", json={"metadata": {"name": NAMESPACE}})
        call(api, "POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
             json={"metadata": {"name": "default"}})  # fmt: skip
        request = pods.gpu_request
        arrived = np.zeros(len(order), dtype=np.int64)
        used = np.zeros(len(order), dtype=np.int64)
        counts = {"bound": 0, "unschedulable": 0, "error": 0}
        arrived_sum = used_sum = 0
        started = time.monotonic()
        for e, j in enumerate(order):
            name = f"p-{e:05d}"
            call(api, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods",
                 json=pod_object(pods, int(j), name))  # fmt: skip
            outcome = decided(api, name)
            counts[outcome] += 1
            arrived_sum += int(request[j])
            if outcome == "bound":
                used_sum += int(request[j])
            else:
                call(api, "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}",
                     params={"gracePeriodSeconds": "0"})  # fmt: skip
            arrived[e], used[e] = arrived_sum, used_sum
            if (e + 1) % 250 == 0:
                log(f"  {e + 1} of {len(order)} pods: {counts}")
        seconds = time.monotonic() - started
        sched.stop()
        result = replay.RunResult(
            arrived=arrived, used=used, frag=np.zeros(len(order)), failed=counts["unschedulable"],
            total_gpus=nodes.total_gpus, seconds=seconds, decisions=len(order),
        )  # fmt: skip
        return {"unallocated": round(replay.unallocated_at(result), 2), "pods": counts,
                "seconds": round(seconds, 1), "versions": cp.versions()}  # fmt: skip
    finally:
        stack.close()
        cp.stop()


def main(argv: list[str] | None = None) -> int:
    """Each seed: the harness (best full-precision score) and the real scheduler on one slice."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="default", choices=trace.TRACES)
    p.add_argument("--nodes", type=int, default=300, help="nodes drawn from the trace's cluster")
    p.add_argument("--seeds", default="42,43", help="seeds, comma-separated")
    p.add_argument("--profiles", default="shipped", help="shipped, gpupods and/or every-node")
    p.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "openb-e2e.json")
    args = p.parse_args(argv)
    if len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {0})  # this process and the control plane; the extender: CPU 1
    everything = trace.load_nodes()
    pods = trace.load_pods(trace.trace_path(args.trace))
    policy = ours.load_policy()
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        nodes = subset(everything, args.nodes, seed)
        fm = frag.FragModel.build(trace.typical_pods(pods), pods, nodes)
        harness = replay.Replay(nodes, pods, fm).run(
            seed, chooser=ours.Ours(pods, policy, "ideal").chooser
        )
        order = trace.workload(pods, nodes.total_gpus, np.random.default_rng(seed))
        row: dict[str, Any] = {
            "seed": seed, "gpus": nodes.total_gpus, "pods": len(order),
            "harness_edgegpu": round(replay.unallocated_at(harness), 2),
        }  # fmt: skip
        log(f"seed {seed}: {nodes.size} nodes, {nodes.total_gpus} GPUs, {len(order)} pods; "
            f"harness (edgegpu, best score) {row['harness_edgegpu']} % unallocated")  # fmt: skip
        for profile in args.profiles.split(","):
            with tempfile.TemporaryDirectory(prefix="edgegpu-openb-") as tmp:
                real = run_real(Path(tmp), nodes, pods, order, profile, seed)
            row["versions"] = real.pop("versions")
            row[profile] = real
            log(f"seed {seed}, profile {profile}: {json.dumps(real)}")
        runs.append(row)
        for profile in args.profiles.split(","):
            diff = row[profile]["unallocated"] - row["harness_edgegpu"]
            print(f"seed {seed} ({args.trace}, {args.nodes} nodes, {row['pods']} pods): "
                  f"real kube-scheduler, {profile} profile {row[profile]['unallocated']} % "
                  f"unallocated; harness {row['harness_edgegpu']} % ({diff:+.2f} points)",
                  flush=True)  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"trace": args.trace, "nodes": args.nodes, "runs": runs},
                                    indent=1) + "\n")  # fmt: skip
    print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
