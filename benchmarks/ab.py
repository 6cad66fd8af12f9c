"""Interleaved A/B of decision latency under telemetry pushes: several builds, one machine.

``python -m benchmarks.ab A_TREE B_TREE [C_TREE ...] [--floor] [--rounds 20] [--rate 5000]``
(``make bench-ab A=.. B=..``)

The under-ingest figure of ``benchmarks.latency`` moves by about ±0.3 from one run to the next
on a shared 2-core machine, so two runs of two builds one after the other cannot tell a change
of 10-20 % from drift. Here the builds run at once, each from its own checkout (for example a
``git worktree`` of the commit before), with the same telemetry; rounds alternate A B C, then
C B A, and each round gives a server a block of pods with no pushes, then starts pushers at
``--rate`` and gives it a block under pushes. A side's samples are pooled over all rounds
before the percentiles are taken, and the running figures are printed every few rounds so that
drift shows. Run the same tree as both sides first: what A/A differs by is the noise to beat.
A tree may be named (``name=path``); ``--floor`` adds the floor server (``benchmarks.floor``)
as one more side, fed the same telemetry.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

from benchmarks.latency import Server, load, names_block, names_block_under_pushes, pct


def _summary(
    idle: list[float], busy: list[float], pushed: list[float], by_round: list[float]
) -> dict[str, Any]:
    idle_p99, busy_p99 = pct(idle, 0.99), pct(busy, 0.99)
    return {
        "idle_p50_ms": round(pct(idle, 0.5), 3), "idle_p99_ms": round(idle_p99, 3),
        "busy_p50_ms": round(pct(busy, 0.5), 3), "busy_p99_ms": round(busy_p99, 3),
        "ratio_p99": round(busy_p99 / idle_p99, 2),
        "idle_p999_ms": round(pct(idle, 0.999), 3), "busy_p999_ms": round(pct(busy, 0.999), 3),
        "busy_max_ms": round(max(busy) * 1000, 3),
        "pushes_per_s": round(sum(pushed) / len(pushed)) if pushed else 0,
        "requests_per_side": len(busy),
        "busy_p99_by_round_ms": [round(p, 3) for p in by_round],
    }  # fmt: skip


def sign_test(lower: int, higher: int) -> float:
    """Two-sided sign test: how likely a split of rounds at least this uneven would be if
    neither side were faster (each round a fair coin; ties left out)."""
    rounds = lower + higher
    if rounds == 0:
        return 1.0
    k = max(lower, higher)
    tail = sum(math.comb(rounds, i) for i in range(k, rounds + 1)) / (1 << rounds)
    return min(1.0, 2 * tail)


def paired(first: list[float], other: list[float]) -> dict[str, Any]:
    """A side against the first, round by round (p99 under pushes of each round's block).

    Each round ran both sides' blocks back to back, so a slow stretch of the machine hits
    both: the rounds one side wins, and the median of the per-round ratios, are not swayed by
    it the way the pooled p99 is.
    """
    ratios = [o / f for f, o in zip(first, other, strict=True) if f > 0]
    lower, higher = sum(r < 1 for r in ratios), sum(r > 1 for r in ratios)
    return {
        "rounds": len(ratios), "rounds_lower": lower, "rounds_higher": higher,
        "sign_test_p": float(f"{sign_test(lower, higher):.3g}"),
        "median_round_ratio": round(statistics.median(ratios), 3) if ratios else None,
    }  # fmt: skip


def compare(
    servers: dict[str, Server], rounds: int, rate: float, nodes: int, cycles: int,
    pace: float = 0.0, ramp_s: float = 1.0, every: int = 5,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Pooled idle and busy decision latency of each server, rounds interleaved; also each
    round's p99 under pushes (``busy_p99_by_round_ms``) for ``paired``."""
    idle: dict[str, list[float]] = {name: [] for name in servers}
    busy: dict[str, list[float]] = {name: [] for name in servers}
    pushed: dict[str, list[float]] = {name: [] for name in servers}
    by_round: dict[str, list[float]] = {name: [] for name in servers}
    order = list(servers)
    for n in range(rounds):
        for name in order if n % 2 == 0 else reversed(order):
            server = servers[name]
            idle[name] += names_block(server, nodes, cycles, pace)
            samples, reached = names_block_under_pushes(server, nodes, rate, cycles, pace, ramp_s)
            busy[name] += samples
            pushed[name].append(reached)
            by_round[name].append(pct(samples, 0.99))
        if (n + 1) % every == 0 or n + 1 == rounds:
            now = {
                name: _summary(idle[name], busy[name], pushed[name], by_round[name])
                for name in order
            }
            line = "  ".join(
                f"{name}: {s['idle_p99_ms']:.3f} -> {s['busy_p99_ms']:.3f} ms "
                f"(×{s['ratio_p99']:.2f}, p50 under pushes {s['busy_p50_ms']:.3f}, "
                f"p99.9 {s['busy_p999_ms']:.3f})"
                for name, s in now.items()
            )
            print(f"after {n + 1:3d} rounds, p99 idle -> under pushes: {line}", flush=True)
    return {name: _summary(idle[name], busy[name], pushed[name], by_round[name]) for name in order}


def _side(spec: str, position: int) -> tuple[str, Path]:
    """``name=path`` or a bare path (named A, B, C... by position)."""
    name, sep, path = spec.partition("=")
    if not sep:
        name, path = chr(ord("A") + position), spec
    return name, Path(path)


def main() -> int:
    p = argparse.ArgumentParser(prog="benchmarks.ab", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "trees", nargs="+", metavar="[NAME=]TREE",
        help="source trees of the builds (each holds scheduler_extender/); unnamed ones are A, B...",
    )  # fmt: skip
    p.add_argument("--floor", action="store_true", help="also measure the floor server")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--rate", type=float, default=5000.0, help="pushes a second (default 5000)")
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--cycles", type=int, default=150, help="pods per block")
    p.add_argument("--pace", type=float, default=0.0, help="pods a second (0: back to back)")
    p.add_argument("--json", type=Path, help="also write the summary here")
    args = p.parse_args()
    sides = [_side(spec, i) for i, spec in enumerate(args.trees)]
    names = [name for name, _ in sides] + (["floor"] if args.floor else [])
    if len(names) < 2:
        p.error("give two trees, or one tree and --floor")
    if len(set(names)) < len(names):
        p.error(f"each side needs a name of its own: {', '.join(names)}")
    for _, tree in sides:
        if not (tree / "scheduler_extender" / "__init__.py").is_file():
            p.error(f"{tree} is not a source tree of this project (no scheduler_extender/)")
    servers: dict[str, Server] = {}
    try:
        for name, tree in sides:
            servers[name] = Server("ours", root=tree.resolve())
        if args.floor:
            servers["floor"] = Server("floor")
        for server in servers.values():
            load(server, args.nodes)
        result = compare(servers, args.rounds, args.rate, args.nodes, args.cycles, args.pace)
    finally:
        for s in servers.values():
            s.stop()
    trees = {name: str(tree) for name, tree in sides}
    first = result[names[0]]
    out: dict[str, Any] = {
        **{name: ({"tree": trees[name]} if name in trees else {}) | result[name] for name in names},
        "busy_p99_over_first": {
            name: round(result[name]["busy_p99_ms"] / first["busy_p99_ms"], 2) for name in names
        },
        "busy_p50_over_first": {
            name: round(result[name]["busy_p50_ms"] / first["busy_p50_ms"], 2) for name in names
        },
        "paired_with_first": {
            name: paired(first["busy_p99_by_round_ms"], result[name]["busy_p99_by_round_ms"])
            for name in names[1:]
        },
        "rounds": args.rounds, "rate": args.rate, "nodes": args.nodes, "cycles": args.cycles,
        "pace": args.pace,
    }  # fmt: skip
    print(json.dumps(out, indent=1))
    for name, pair in out["paired_with_first"].items():
        print(
            f"{name} against {names[0]}, round by round: p99 under pushes lower in "
            f"{pair['rounds_lower']} of {pair['rounds']} rounds, higher in {pair['rounds_higher']} "
            f"(sign test p = {pair['sign_test_p']}), median ratio {pair['median_round_ratio']}"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
