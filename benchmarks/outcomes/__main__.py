"""``python -m benchmarks.outcomes``: every arm on every seed, the targets judged, the figures
printed and written to ``benchmarks/results/outcomes.json`` and ``outcomes.png``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.outcomes import physics, sim
from benchmarks.outcomes.arms import ARMS, NO_THERMAL, PWR_NOTE, one_seed, sharing_figures
from benchmarks.outcomes.faultloop import eviction_delay_s
from benchmarks.outcomes.figure import draw
from benchmarks.outcomes.workload import ASSUMPTIONS, load_trace

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _arm(tallies: list[sim.Tally], hours: float) -> dict[str, Any]:
    """Means over seeds (and the spread of the headline figures)."""

    def each(f: Any) -> list[float]:
        return [float(f(t)) for t in tallies]

    energy = each(lambda t: t.energy_j / 3.6e6)
    done = each(lambda t: t.completed)
    out: dict[str, Any] = {
        "gpu_minutes_over_max_temp": float(np.mean(each(lambda t: t.hot_min))),
        "throttled_gpu_minutes": float(np.mean(each(lambda t: t.throttled_min))),
        "throttled_clock_lost_gpu_minutes": float(np.mean(each(lambda t: t.clock_lost_min))),
        "throttled_gpu_minutes_by": {
            cause: float(np.mean(each(lambda t, c=cause: t.throttled_by[c])))
            for cause in tallies[0].throttled_by
        },
        "slowed_gpu_minutes": float(np.mean(each(lambda t: t.slowed_min))),
        "energy_kwh": float(np.mean(energy)),
        "energy_kwh_sd": float(np.std(energy)),
        "completed_tasks": float(np.mean(done)),
        "energy_wh_per_completed_task": float(
            np.mean([1000 * e / d for e, d in zip(energy, done, strict=True)])
        ),
        "unallocated_pct": float(np.mean(each(lambda t: np.mean(t.unallocated)))),
        "mean_waiting_tasks": float(np.mean(each(lambda t: np.mean(t.waiting)))),
        "mean_gpu_utilization": float(np.mean(each(lambda t: np.mean(t.gpu_util)))),
        "mean_gpu_memory_utilization": float(np.mean(each(lambda t: np.mean(t.mem_util)))),
        "measured_hours": hours,
    }
    per_fault: dict[str, Any] = {}
    for key in ("with_fault_loop", "without_fault_loop"):
        values = [v for t in tallies for v in t.interruptions[key]]
        per_fault[key] = float(np.mean(values)) if values else None
        per_fault[f"{key}_faults"] = len(values)
    out["interruption_s_per_fault"] = per_fault
    return out


def _targets(arms: dict[str, Any]) -> dict[str, Any]:
    e, d, f = arms["edgegpu"], arms["default"], arms["fgd"]

    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None

    hot_d = ratio(e["gpu_minutes_over_max_temp"], d["gpu_minutes_over_max_temp"])
    hot_f = ratio(e["gpu_minutes_over_max_temp"], f["gpu_minutes_over_max_temp"])
    thr = ratio(e["throttled_gpu_minutes"], f["throttled_gpu_minutes"])
    energy = e["energy_kwh"] / f["energy_kwh"]
    unalloc = e["unallocated_pct"] - f["unallocated_pct"]
    loop = e["interruption_s_per_fault"]["with_fault_loop"]

    def met(value: float | None, limit: float) -> bool | None:
        return None if value is None else value <= limit

    return {
        "hot_vs_default": {"value": hot_d, "target": 0.10, "met": met(hot_d, 0.10)},
        "hot_vs_fgd": {"value": hot_f, "target": 0.10, "met": met(hot_f, 0.10)},
        "throttled_vs_fgd": {"value": thr, "target": 0.25, "met": met(thr, 0.25)},
        "energy_vs_fgd": {"value": energy, "target": 0.85, "met": energy <= 0.85 and unalloc <= 0.5,
                          "unallocated_pt_vs_fgd": unalloc},
        "interruption_s_with_fault_loop": {"value": loop, "target": 60.0, "met": met(loop, 60.0)},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run, print, write."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="42-44", help="a range, as 42-44")
    p.add_argument("--nodes", type=int, default=32, help="OpenB nodes drawn per seed")
    p.add_argument("--hours", type=float, default=6.0, help="simulated time, warm-up included")
    p.add_argument("--warmup-hours", type=float, default=1.0)
    p.add_argument("--sharing-blocks", default="4096,1024", help="blockMiB values ('' for none)")
    p.add_argument("--json", type=Path, default=RESULTS / "outcomes.json")
    p.add_argument("--png", type=Path, default=RESULTS / "outcomes.png")
    ns = p.parse_args(argv)
    logging.getLogger("scheduler_extender").setLevel(logging.ERROR)
    lo, _, hi = ns.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    started = time.monotonic()
    pods, lifetimes = load_trace()
    delay = asyncio.run(eviction_delay_s())
    horizon, warmup = ns.hours * 3600, ns.warmup_hours * 3600
    runs = [
        asyncio.run(one_seed(s, pods, lifetimes, ns.nodes, horizon, warmup, delay)) for s in seeds
    ]
    arms = {a: _arm([r[a] for r in runs], ns.hours - ns.warmup_hours) for a in ARMS}
    blocks = tuple(int(b) for b in ns.sharing_blocks.split(",") if b)
    shared = asyncio.run(sharing_figures(seeds[0], "gpushare100", blocks)) if blocks else {}
    result: dict[str, Any] = {
        "arms": arms,
        "targets": _targets(arms),
        "sharing": shared,
        "fault_loop_eviction_s": delay,
        "assumptions": {
            **ASSUMPTIONS,
            "seeds": seeds, "nodes_per_seed": ns.nodes, "hours": ns.hours,
            "warmup_hours": ns.warmup_hours, "trace": "default", "step_s": sim.STEP_S,
            "max_temp_c": sim.MAX_TEMP_C, "fault_every_s": sim.FAULT_EVERY_S,
            "repair_s": sim.REPAIR_S, "operator_drain_s": sim.OPERATOR_S,
            "restart_s": sim.RESTART_S, "thermal_time_constant_s": physics.TAU_S,
            "power_clock_exponent": physics.ALPHA, "design_inlet_c": physics.DESIGN_INLET_C,
            "design_temp_c": physics.DESIGN_TEMP_C, "hw_slowdown_clock": physics.HW_SLOWDOWN_CLOCK,
            "thermal_resistance_spread": sim.R_SPREAD,
            "gpus": {name: {"tdp_w": m.spec.tdp_w, "idle_w": m.spec.idle_w,
                            "min_limit_w": m.spec.min_limit_w, "memory_mib": m.spec.memory_mib,
                            "max_clock_mhz": m.spec.max_clock_mhz,
                            "thermal_resistance_c_per_w": m.spec.thermal_resistance_c_per_w,
                            "slowdown_c": m.slowdown_c, "source": m.source}
                     for name, m in physics.MODELS.items()},
            "pwr": PWR_NOTE, "edgegpu_no_thermal": NO_THERMAL,
        },
        "seconds": round(time.monotonic() - started, 1),
    }  # fmt: skip
    _print(result)
    ns.json.parent.mkdir(parents=True, exist_ok=True)
    ns.json.write_text(json.dumps(result, indent=2) + "\n")
    draw(arms, runs, ns.png)
    return 0


def _print(result: dict[str, Any]) -> None:
    print(f"{'arm':20} {'>=maxT min':>10} {'throttled':>9} {'lost':>6} {'kWh':>7} {'Wh/task':>7} "
          f"{'unalloc%':>8} {'GPU util':>8} {'mem util':>8} {'loop s':>6} {'no-loop s':>9}")  # fmt: skip
    for name, a in result["arms"].items():
        f = a["interruption_s_per_fault"]
        print(
            f"{name:20} {a['gpu_minutes_over_max_temp']:10.1f} {a['throttled_gpu_minutes']:9.1f} "
            f"{a['throttled_clock_lost_gpu_minutes']:6.1f} "
            f"{a['energy_kwh']:7.2f} {a['energy_wh_per_completed_task']:7.1f} "
            f"{a['unallocated_pct']:8.2f} {a['mean_gpu_utilization']:8.1%} "
            f"{a['mean_gpu_memory_utilization']:8.1%} {f['with_fault_loop'] or 0:6.1f} "
            f"{f['without_fault_loop'] or 0:9.1f}"
        )
    for name, t in result["targets"].items():
        value = "n/a" if t["value"] is None else f"{t['value']:.3f}"
        verdict = {True: "met", False: "MISSED", None: "undefined"}[t["met"]]
        print(f"target {name}: {value} (≤ {t['target']}) {verdict}")
    for name, s in result["sharing"].items():
        print(
            f"sharing {name}: {s['tasks_per_gpu']:.2f} tasks/GPU, memory {s['memory_utilization']:.1%}"
        )
    print(f"({result['seconds']} s)")


if __name__ == "__main__":
    sys.exit(main())
