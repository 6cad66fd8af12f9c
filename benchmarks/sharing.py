"""``make bench-sharing``: GPU sharing by memory blocks against whole GPUs, on one workload.

The claims measured: concurrent tasks per GPU and GPU memory utilisation, with a GPU per task
(a), with memory blocks (b) placed by the extender itself (its filter, prioritize and bind,
through the app), and (c) blocks with idle blocks lent (``memory.idleRelease`` on): the tasks
that found no room wait as best-effort pods; every minute the ones that fit in lent blocks are
placed, and the borrowers the leader would evict when owners grow (``borrowers_to_evict``) go
back to waiting. Memory-budget violations are counted as the leader's watch sees them
(``over_budget``).

Workload (documented assumptions, not a trace of real memory use; nothing here is tuned):

* Tasks: the single-GPU pods (``num_gpu`` 1) of an OpenB trace, in arrival order: by default
  ``gpushare100``, where every GPU pod shares a GPU (in ``default`` 56 % of them take a whole
  GPU, which no sharing can pack). A pod
  asking ``g`` milli-GPU asks for ``g``/1000 of a GPU's memory: that many MiB rounded up to
  whole blocks of ``memory.blockMiB`` (at least one).
* Use over time, per task: its request while active and 20 % of it while idle; active a share
  of the time drawn from U(0.3, 0.9), in 5-minute phases. One task in twenty misbehaves: 1.5×
  its blocks while active.
* Cluster: 16 nodes × 4 NVIDIA L4 (23,034 MiB: 5 blocks of 4 GiB). Tasks arrive (a pod asking
  1000 milli-GPU asks for a whole GPU) until twenty in a row fit nowhere; then an hour is
  sampled every minute. The extender's choice among equally good nodes is seeded with
  ``--seed``, so a run repeats.

Tasks per GPU = tasks running, averaged over the hour, per GPU. Utilisation = memory in use /
memory of every GPU, averaged over the hour. In (c) the leader's reclaim is taken to act within
the minute it is due (it acts within seconds of a report): the minutes a borrower would overlap
an owner that grew are not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.openb.trace import load_pods, trace_path
from scheduler_extender.api.app import create_app
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.domain import Assignment
from scheduler_extender.policy.document import DEFAULT_POLICY, Policy, parse_policy
from scheduler_extender.remediation.memory import over_budget
from scheduler_extender.telemetry.clock import FakeClock

NODES, GPUS_PER_NODE = 16, 4
GPU_MIB = 23034.0
MODEL = "NVIDIA L4"
IDLE_SHARE = 0.2
PHASE_S, HOUR_S, SAMPLE_S = 300.0, 3600.0, 60.0
MISBEHAVE_EVERY = 20
MISSES = 20
"""Arrivals stop after this many tasks in a row fit nowhere (the cluster is full)."""
OUT = Path(__file__).with_name("results") / "sharing.json"


@dataclass
class Task:
    """One pod of the workload."""

    name: str
    request_mib: float
    active_share: float
    misbehaves: bool
    seed: int

    def use_mib(self, t: float, budget_mib: float) -> float:
        """What it uses at time ``t`` (its budget is what it was given)."""
        phase = int(t // PHASE_S)
        active = random.Random(self.seed * 100_003 + phase).random() < self.active_share
        peak = 1.5 * budget_mib if self.misbehaves else self.request_mib
        return peak if active else IDLE_SHARE * peak


class _Binder:
    async def bind(self, assignment: Assignment) -> None:
        return None


def workload(limit: int, seed: int, trace: str = "gpushare100") -> list[Task]:
    """The trace's single-GPU pods, in order, as tasks."""
    pods = load_pods(trace_path(trace))
    rng = random.Random(seed)
    out = []
    for i in range(pods.size):
        if int(pods.num_gpu[i]) != 1 or int(pods.gpu_milli[i]) <= 0:
            continue
        out.append(
            Task(
                name=f"task-{len(out):04d}",
                request_mib=GPU_MIB * int(pods.gpu_milli[i]) / 1000.0,
                active_share=rng.uniform(0.3, 0.9),
                misbehaves=len(out) % MISBEHAVE_EVERY == MISBEHAVE_EVERY - 1,
                seed=rng.randrange(2**31),
            )
        )
        if len(out) >= limit:
            break
    return out


def _report(node: str, gpus: list[dict[str, Any]], seq: int) -> dict[str, Any]:
    return {
        "schema": "edgegpu.io/telemetry/v1", "node": node,
        "agent": {"version": "bench", "backend": "simulated", "boot_id": "bench", "seq": seq},
        "sampled_at": "2026-12-05T00:00:00Z", "interval_s": 5.0, "gpus": gpus,
    }  # fmt: skip


def _gpu(i: int, used: float, procs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"index": i, "uuid": f"GPU-{i}", "model": MODEL, "vendor": "nvidia",
            "temperature_c": 50.0, "power_w": 30.0, "power_limit_w": 72.0,
            "utilization_pct": 50.0, "memory_total_mib": GPU_MIB,
            "memory_used_mib": min(used, GPU_MIB), "processes": procs}  # fmt: skip


TIE_SEED = 0
"""The extender's random choice among equally good nodes is seeded, so a run repeats."""


def arm_policy(lending: bool = False, block_mib: int | None = None) -> Policy:
    """Arm (b)'s policy: the defaults; arm (c)'s: idle blocks lent too (which needs remediation
    on). ``block_mib``: another ``memory.blockMiB`` than the default."""
    memory: dict[str, Any] = {} if block_mib is None else {"blockMiB": block_mib}
    if lending:
        memory["idleRelease"] = {"enabled": True}
    spec: dict[str, Any] = {"memory": memory} if memory else {}
    if lending:
        spec["remediation"] = {"enabled": True, "dryRun": False}
    return parse_policy({"spec": spec}) if spec else DEFAULT_POLICY


def _pod(task: Task, resource: dict[str, str], qos: str) -> dict[str, Any]:
    return {"metadata": {"name": task.name, "namespace": "bench", "uid": f"uid-{task.name}",
                         "annotations": {"edgegpu.io/qos": qos}},
            "spec": {"containers": [{"name": "app", "resources": {"limits": resource}}]}}  # fmt: skip


async def blocks(
    tasks: list[Task],
    lending: bool = False,
    *,
    policy: Policy | None = None,
    tie_seed: int = TIE_SEED,
) -> dict[str, Any]:
    """(b): the extender places tasks by memory blocks until one fits nowhere; then an hour.

    (c), where the policy lends idle blocks: the tasks that found no room wait as best-effort
    pods, and every minute of the hour the ones that fit in lent idle blocks are placed; the
    borrowers the leader would evict when owners grow (``borrowers_to_evict``) are released
    and wait again. ``policy``: the extender's (default: ``arm_policy(lending)``); ``tie_seed``
    seeds its choice among equally good nodes.
    """
    clock = FakeClock()
    policy = arm_policy(lending) if policy is None else policy
    lending = policy.spec.lends_idle_blocks
    settings = ExtenderSettings(tie_seed=tie_seed)
    app = create_app(settings, clock=clock, binder=_Binder(), policy=policy)
    state = app.state.ctx.state
    block_mib = state.policy.spec.memory.block_mib
    names = [f"edge-{n}" for n in range(NODES)]
    gpus = NODES * GPUS_PER_NODE
    seq = 0
    placed: dict[str, tuple[Task, str, int]] = {}
    ever: set[str] = set()
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://extender") as client:

        async def push(t: float) -> None:
            nonlocal seq
            seq += 1
            for node in names:
                gpus_ = []
                for i in range(GPUS_PER_NODE):
                    procs = [
                        {
                            "pid": 1000 + k,
                            "pod_uid": f"uid-{task.name}",
                            "used_mib": task.use_mib(t, blocks_ * block_mib),
                        }
                        for k, (task, where, blocks_) in enumerate(placed.values())
                        if where == f"{node}/{i}"
                    ]
                    gpus_.append(_gpu(i, sum(p["used_mib"] for p in procs), procs))
                await client.post("/v1/telemetry", json=_report(node, gpus_, seq))

        capacity = int(GPU_MIB // block_mib)

        async def place(task: Task, qos: str) -> bool:
            whole_gpu = task.request_mib >= GPU_MIB  # 1000 milli-GPU: the whole GPU
            want = capacity if whole_gpu else max(1, math.ceil(task.request_mib / block_mib))
            resource = (
                {"nvidia.com/gpu": "1"} if whole_gpu else {"edgegpu.io/gpu-mem-block": str(want)}
            )
            pod = _pod(task, resource, qos)
            fit = (await client.post("/filter", json={"Pod": pod, "NodeNames": names})).json()
            if not fit.get("NodeNames"):
                return False
            scores = (
                await client.post("/prioritize", json={"Pod": pod, "NodeNames": fit["NodeNames"]})
            ).json()
            node = max(scores, key=lambda s: (s["Score"], -names.index(s["Host"])))["Host"]
            await client.post("/bind", json={"PodName": task.name, "PodNamespace": "bench",
                                             "PodUID": f"uid-{task.name}", "Node": node})  # fmt: skip
            a = state.allocations.get(f"uid-{task.name}")
            assert a is not None
            placed[task.name] = (task, f"{node}/{a.gpu_indices[0]}", want)
            ever.add(task.name)
            return True

        await push(0.0)
        misses = 0
        waiting: list[Task] = []
        for task in tasks:
            if misses >= MISSES:
                waiting.append(task)
                continue
            if await place(task, "inference"):
                misses = 0
            else:
                misses += 1
                waiting.append(task)
        owners = len(placed)
        used: list[float] = []
        running: list[int] = []
        seen: set[str] = set()
        taken_back = short = 0
        for k in range(int(HOUR_S // SAMPLE_S)):
            t = k * SAMPLE_S
            clock.advance(SAMPLE_S)
            await push(t)
            if lending:
                # The leader's round: borrowers of GPUs whose owners grew go (and wait again).
                for pod, _ in state.borrowers_to_evict():
                    if pod.name in placed:
                        state.release(pod.pod_uid)
                        waiting.append(placed.pop(pod.name)[0])
                        taken_back += 1
                await push(t)
                misses, queue, waiting = 0, waiting, []
                for task in queue:
                    if misses < MISSES and await place(task, "best-effort"):
                        misses = 0
                    else:
                        misses += 1
                        waiting.append(task)
            demand = {
                g: sum(task.use_mib(t, b * block_mib) for task, w, b in placed.values() if w == g)
                for g in [f"{n}/{i}" for n in names for i in range(GPUS_PER_NODE)]
            }
            short += sum(1 for mib in demand.values() if mib > GPU_MIB)
            used.append(sum(min(mib, GPU_MIB) for mib in demand.values()) / (gpus * GPU_MIB))
            running.append(len(placed))
            seen |= set(over_budget(state))
    misbehaving = {f"uid-{t.name}" for t in tasks if t.misbehaves and t.name in ever}
    return {
        "tasks": owners,
        "tasks_per_gpu": float(np.mean(running)) / gpus,
        "memory_utilization": float(np.mean(used)),
        # Every pod seen over its blocks gets the leader's warning at once (and, with
        # memory.overBudget: evict, its eviction): seen is handled.
        "violations": {
            "seen": len(seen),
            "handled": len(seen),
            "misbehaving": len(misbehaving),
            "not_misbehaving_but_seen": len(seen - misbehaving),
        },
        "borrowers_evicted": taken_back,
        "gpu_minutes_short": short,
    }


def whole(tasks: list[Task]) -> dict[str, Any]:
    """(a): one task per GPU, the first ones to arrive."""
    gpus = NODES * GPUS_PER_NODE
    mine = tasks[:gpus]
    used = [
        sum(min(t.use_mib(k * SAMPLE_S, GPU_MIB), GPU_MIB) for t in mine) / (gpus * GPU_MIB)
        for k in range(int(HOUR_S // SAMPLE_S))
    ]
    return {"tasks": len(mine), "tasks_per_gpu": len(mine) / gpus,
            "memory_utilization": float(np.mean(used))}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run both arms, print them, write ``benchmarks/results/sharing.json``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--trace", default="gpushare100", help="OpenB trace (default gpushare100)")
    p.add_argument("--out", type=Path, default=OUT)
    ns = p.parse_args(argv)
    logging.getLogger("scheduler_extender").setLevel(logging.ERROR)
    tasks = workload(NODES * GPUS_PER_NODE * 8, ns.seed, ns.trace)
    a = whole(tasks)
    b = asyncio.run(blocks(tasks, tie_seed=ns.seed))
    c = asyncio.run(blocks(tasks, lending=True, tie_seed=ns.seed))
    result = {
        "tasks_per_gpu": {"whole": a["tasks_per_gpu"], "blocks": b["tasks_per_gpu"],
                          "blocks_idle_release": c["tasks_per_gpu"]},
        "memory_utilization": {"whole": a["memory_utilization"],
                               "blocks": b["memory_utilization"],
                               "blocks_idle_release": c["memory_utilization"]},
        "violations": {"seen": b["violations"]["seen"], "handled": b["violations"]["handled"]},
        "idle_release": {"borrowers_evicted": c["borrowers_evicted"],
                         "violations": {"seen": c["violations"]["seen"],
                                        "handled": c["violations"]["handled"]}},
        "gpu_minutes_over_memory": {"blocks": b["gpu_minutes_short"],
                                    "blocks_idle_release": c["gpu_minutes_short"]},
        "workload": {"trace": ns.trace, "seed": ns.seed, "gpus": NODES * GPUS_PER_NODE,
                     "gpu_mib": GPU_MIB,
                     "misbehaving_tasks": b["violations"]["misbehaving"]},
    }  # fmt: skip
    print(
        f"whole GPUs:    {a['tasks_per_gpu']:.2f} tasks/GPU, memory utilisation "
        f"{a['memory_utilization']:.1%}"
    )
    for label, arm in (("memory blocks:", b), ("blocks + idle release:", c)):
        print(
            f"{label} {arm['tasks_per_gpu']:.2f} tasks/GPU "
            f"(x{arm['tasks_per_gpu'] / a['tasks_per_gpu']:.2f}), memory utilisation "
            f"{arm['memory_utilization']:.1%}; over budget seen {arm['violations']['seen']} of "
            f"{arm['violations']['misbehaving']} misbehaving tasks placed"
        )
    print(
        f"idle release: {c['borrowers_evicted']} borrowers evicted when owners grew; GPU-minutes "
        f"whose use passed the GPU's memory: {c['gpu_minutes_short']} (blocks alone: "
        f"{b['gpu_minutes_short']}, the misbehaving tasks)"
    )
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
