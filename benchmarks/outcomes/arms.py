"""The five arms, one seed: the same fleet, tasks and fault schedule for each; then the sharing
figures from ``benchmarks.sharing`` at two block sizes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import yaml

import benchmarks.sharing as sharing
from benchmarks.openb.ours import POLICY_FILE
from benchmarks.openb.trace import Pods
from benchmarks.outcomes import sim
from benchmarks.outcomes.placement import PWR_WEIGHT, Extender, Placer, Spreading
from benchmarks.outcomes.workload import fleet, tasks
from scheduler_extender.policy.document import parse_policy

ARMS = ("default", "fgd", "pwr", "edgegpu_no_thermal", "edgegpu")
NO_THERMAL = {
    "weights": {"thermal": 0, "power": 0, "powerSaving": 0, "throttle": 0},
    "thermalThrottling": {"maxTemp": 150},
    "powerSaving": {"enabled": False},
}
"""edgegpu blind to heat and power: those score terms weigh nothing and the hot filter never
fires (its agents still protect their GPUs, as in the full arm)."""
PWR_NOTE = (
    f"PWR-like (after arXiv 2412.17484): {1 - PWR_WEIGHT:g} × FGD's score + {PWR_WEIGHT:g} × "
    "the negated dynamic power the task adds on the node's GPU model ((TDP − idle) × GPUs "
    "asked), each min-max scaled over the feasible nodes; our weights, not the paper's"
)


def policy_doc(arm: str) -> dict[str, Any]:
    """The OpenB replay's policy (fragmentation on, 256 MiB blocks), ablated for the no-thermal arm."""
    doc: dict[str, Any] = yaml.safe_load(POLICY_FILE.read_text())
    if arm == "edgegpu_no_thermal":
        doc["spec"].update(NO_THERMAL)
    return doc


async def one_seed(
    seed: int, pods: Pods, lifetimes: dict[str, float], nodes: int, horizon_s: float,
    warmup_s: float, delay_s: float, arms: tuple[str, ...] = ARMS,
) -> dict[str, sim.Tally]:  # fmt: skip
    """Every arm on this seed's fleet and tasks."""
    rng = np.random.default_rng(seed)
    f = fleet(nodes, rng)
    work = tasks(pods, lifetimes, int(f.nodes.total_gpus), horizon_s, rng)
    out: dict[str, sim.Tally] = {}
    for arm in arms:
        arm_rng = np.random.default_rng([seed, 1])  # the same ties, R spread and fault order
        placer: Placer
        if arm.startswith("edgegpu"):
            ext = Extender(f.nodes, pods, parse_policy(policy_doc(arm)), arm_rng, seed)
            try:
                out[arm] = await sim.run(
                    f, pods, work, ext, True, horizon_s, warmup_s, delay_s, arm_rng, ext.push
                )
            finally:
                await ext.close()
        else:
            placer = Spreading(f.nodes, pods, arm, arm_rng)
            out[arm] = await sim.run(
                f, pods, work, placer, False, horizon_s, warmup_s, delay_s, arm_rng
            )
    return out


async def sharing_figures(seed: int, trace: str, block_sizes: tuple[int, ...]) -> dict[str, Any]:
    """Tasks per GPU and memory use: whole GPUs, blocks, blocks with idle release, per block size."""
    work = sharing.workload(sharing.NODES * sharing.GPUS_PER_NODE * 8, seed, trace)
    whole = sharing.whole(work)
    out: dict[str, Any] = {"whole": {k: whole[k] for k in ("tasks_per_gpu", "memory_utilization")}}
    for mib in block_sizes:
        for label, lending in (("blocks", False), ("blocks_idle_release", True)):
            policy = sharing.arm_policy(lending, block_mib=mib)
            r = await sharing.blocks(work, policy=policy, tie_seed=seed)
            out[f"{label}_{mib}"] = {
                "tasks_per_gpu": r["tasks_per_gpu"],
                "tasks_per_gpu_ratio": r["tasks_per_gpu"] / whole["tasks_per_gpu"],
                "memory_utilization": r["memory_utilization"],
                "gpu_minutes_over_memory": r["gpu_minutes_short"],
            }
    return out
