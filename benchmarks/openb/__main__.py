"""``python -m benchmarks.openb``: replay OpenB traces, print the table, write JSON and a PNG."""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.openb import frag, ours, policies, replay, trace

POLICIES = (*policies.BASELINES, "edgegpu", "edgegpu-points", "edgegpu-gpupods")
"""``edgegpu``: the best node by the full score, as filter answers it; ``edgegpu-points``: by the
0..10 points (``--filter-answer all``); ``edgegpu-gpupods``: the extender asked about GPU pods
only (``managedResources`` naming the GPU resources), so CPU-only pods land by kube-scheduler's
tie-break alone."""
PUBLISHED_NAMES = {
    "01-Random": "random",
    "02-DotProd": "dotprod",
    "03-GpuClustering": "clustering",
    "04-GpuPacking": "packing",
    "05-BestFit": "bestfit",
    "06-FGD": "fgd",
}


def published() -> dict[str, dict[str, list[float]]]:
    """Unallocated GPU % at 100 % arrived per (trace, policy), from the authors' cached runs."""
    path = trace.data_dir() / "fgd_expected_results" / "analysis_allo_discrete.csv"
    out: dict[str, dict[str, list[float]]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            name = PUBLISHED_NAMES.get(row["sc_policy"])
            if name is None:
                continue
            t = row["workload"].removeprefix("openb_pod_list_")
            out.setdefault(t, {}).setdefault(name, []).append(100.0 - float(row["100"]))
    return out


def run_one(job: tuple[str, str, int]) -> dict[str, Any]:
    """One (trace, policy, seed): the headline number, the curve, the cost per decision."""
    name, policy, seed = job
    nodes = trace.load_nodes()
    pods = trace.load_pods(trace.trace_path(name))
    fm = frag.FragModel.build(trace.typical_pods(pods), pods, nodes)
    rp = replay.Replay(nodes, pods, fm)
    if policy == "random":
        result = rp.run(seed, chooser=replay.random_chooser)
    elif policy.startswith("edgegpu"):
        mode = "protocol" if policy == "edgegpu-points" else "ideal"
        chooser = ours.Ours(
            pods, ours.load_policy(), mode, gpu_pods_only=policy == "edgegpu-gpupods"
        ).chooser
        result = rp.run(seed, chooser=chooser)
    else:
        scorers: dict[str, policies.Scorer] = {
            "dotprod": policies.DotProd(),
            "clustering": policies.GpuClustering(),
            "packing": policies.GpuPacking(),
            "bestfit": policies.BestFit(),
            "fgd": policies.Fgd(fm),
        }
        result = rp.run(seed, scorer=scorers[policy])
    alloc, _ = replay.binned(result)
    return {
        "trace": name,
        "policy": policy,
        "seed": seed,
        "unallocated": float(100.0 - alloc[100]),
        "curve": [None if a != a else round(float(100.0 - a), 3) for a in alloc],
        "us_per_decision": 1e6 * result.seconds / result.decisions,
    }


def seeds_arg(text: str) -> list[int]:
    """``42-51`` or ``0,3,5``."""
    if "-" in text:
        lo, hi = text.split("-", 1)
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def plot(
    results: dict[str, dict[str, Any]],
    curves: dict[str, list[list[Any]]],
    path: Path,
    fgd_published: dict[str, list[float]],
) -> None:
    """Bars per trace (mean ± sd, FGD's published runs beside ours) and the default curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(results)
    results = {
        t: {
            **per,
            "FGD (published)": {
                "mean": statistics.fmean(fgd_published[t]),
                "sd": statistics.stdev(fgd_published[t]),
            },
        }
        if t in fgd_published and "fgd" not in per
        else per
        for t, per in results.items()
    }
    names = [*POLICIES, "FGD (published)"]
    pols = [p for p in names if any(p in results[t] for t in traces)]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 1.2 * len(traces) + 4), 9))
    width = 0.8 / max(len(pols), 1)
    for i, p in enumerate(pols):
        xs = [k + i * width for k, t in enumerate(traces) if p in results[t]]
        ys = [results[t][p]["mean"] for t in traces if p in results[t]]
        es = [results[t][p]["sd"] for t in traces if p in results[t]]
        ax1.bar(xs, ys, width, yerr=es, label=p, capsize=2)
    ax1.set_xticks([k + 0.4 - width / 2 for k in range(len(traces))], traces, rotation=30)
    ax1.set_ylabel("unallocated GPU % at 100 % arrived")
    ax1.legend(ncol=4, fontsize=8)
    for p, runs in curves.items():
        pct = list(range(75, 121))
        med = [statistics.median(r[a] for r in runs if r[a] is not None) for a in pct]
        ax2.plot(pct, med, label=p)
    ax2.plot([75, 100, 120], [25, 0, 0], "k:", label="ideal")
    ax2.set_xlabel("arrived GPU request (% of capacity), default trace")
    ax2.set_ylabel("unallocated GPU % (median over seeds)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the jobs in processes, print and write the results."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.openb", description=__doc__)
    ap.add_argument(
        "--trace", default="default", help="file suffix (default, gpushare40...) or all"
    )
    ap.add_argument("--seeds", default="42-51", help="e.g. 42-51 (the paper's) or 0-9")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", type=Path, help="write the summary here")
    ap.add_argument("--png", type=Path, help="write the figure here (needs matplotlib)")
    ap.add_argument("--jobs", type=int, default=None, help="processes (default: CPU count)")
    args = ap.parse_args(argv)
    traces = list(trace.TRACES) if args.trace == "all" else args.trace.split(",")
    chosen = args.policies.split(",")
    unknown = [p for p in chosen if p not in POLICIES]
    bad = [t for t in traces if not trace.trace_path(t).is_file()]
    if unknown or bad:
        print(f"unknown policies {unknown} or traces {bad}; policies: {', '.join(POLICIES)}")
        return 2
    seeds = seeds_arg(args.seeds)
    jobs = [(t, p, s) for t in traces for p in chosen for s in seeds]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(run_one, jobs))
    pub = published()
    summary: dict[str, dict[str, Any]] = {}
    curves: dict[str, list[list[Any]]] = {}
    cost: dict[str, list[float]] = {}
    for t in traces:
        for p in chosen:
            mine = [r for r in rows if r["trace"] == t and r["policy"] == p]
            vals = [r["unallocated"] for r in mine]
            ref = pub.get(t, {}).get(p)
            summary.setdefault(t, {})[p] = {
                "mean": round(statistics.fmean(vals), 3),
                "sd": round(statistics.stdev(vals), 3) if len(vals) > 1 else 0.0,
                "published_mean": round(statistics.fmean(ref), 3) if ref else None,
                "seeds": {str(r["seed"]): round(r["unallocated"], 3) for r in mine},
            }
            cost.setdefault(p, []).extend(r["us_per_decision"] for r in mine)
            if t == "default":
                curves[p] = [r["curve"] for r in mine]
    fgd_pub = {t: statistics.fmean(v["fgd"]) for t, v in pub.items() if "fgd" in v}
    print(f"unallocated GPU % at 100 % arrived, seeds {args.seeds} (lower is better)")
    print(
        f"{'trace':<12} {'policy':<14} {'mean ± sd':>14} {'published':>10} {'diff':>7} {'vs FGD':>7}"
    )
    for t, per in summary.items():
        for p, v in per.items():
            pubm = v["published_mean"]
            diff = f"{v['mean'] - pubm:+.2f}" if pubm is not None else ""
            vs = f"{v['mean'] - fgd_pub[t]:+.2f}" if t in fgd_pub else ""
            pubs = f"{pubm:.2f}" if pubm is not None else "-"
            print(
                f"{t:<12} {p:<14} {v['mean']:>7.2f} ± {v['sd']:<4.2f} {pubs:>10} {diff:>7} {vs:>7}"
            )
    print("replay cost per pod (µs, whole decision incl. filter and bookkeeping):")
    for p, c in cost.items():
        print(f"  {p:<14} {statistics.fmean(c):8.0f}")
    print(f"{len(jobs)} runs in {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    if args.png:
        plot(summary, curves, args.png, {t: v["fgd"] for t, v in pub.items() if "fgd" in v})
    return 0


if __name__ == "__main__":
    sys.exit(main())
