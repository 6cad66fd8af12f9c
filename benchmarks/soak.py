"""``make soak``: 5,000 nodes pushing every second for a minute while a scheduler schedules.

The extender runs as ``make run`` runs it (embedded, one process, one port) on CPU 1 with a
static agent token; the pusher (``benchmarks.e2e.Pusher``) and a scheduler driver (filter then
prioritize for a new pod each time, on a 500-node candidate list, as kube-scheduler sends)
share CPU 0. It prints pushes due/answered/accepted/failed/late, verb errors and latencies,
and the extender's RSS before and after, and exits 1 on any lost push or verb error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from benchmarks.e2e import Pusher, answers, pod_object
from benchmarks.latency import rss_mib
from benchmarks.workload import node_name
from tests.e2e.controlplane import ROOT, free_port, wait_until


async def schedule(port: int, nodes: int, stop: asyncio.Event) -> tuple[list[float], int, int]:
    """Filter + prioritize for a new pod each time until ``stop``: (latencies ms, pairs, errors)."""
    names = [node_name(i) for i in range(nodes)]
    rng = random.Random(7)
    latencies: list[float] = []
    errors = pairs = 0
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        while not stop.is_set():
            pod = pod_object(f"p-{pairs}", pairs, "edgegpu-scheduler")
            pod["metadata"].update(namespace="soak", uid=f"uid-{pairs}")
            start = rng.randrange(nodes)
            window = [names[(start + k) % nodes] for k in range(min(500, nodes))]
            for verb, body in (("filter", window), ("prioritize", window[:300])):
                t0 = time.perf_counter()
                try:
                    resp = await client.post(f"/{verb}", content=orjson.dumps(
                        {"Pod": pod, "NodeNames": body}),
                        headers={"content-type": "application/json"})  # fmt: skip
                    doc = resp.json()
                    bad = resp.status_code != 200 or (isinstance(doc, dict) and doc.get("Error"))
                except (httpx.HTTPError, ValueError):
                    bad = True
                latencies.append((time.perf_counter() - t0) * 1000)
                errors += bool(bad)
            pairs += 1
            await asyncio.sleep(0.005)  # about 100 pods a second, a busy scheduler's pace
    return latencies, pairs, errors


async def soak(nodes: int, seconds: float, interval_s: float, folder: Path) -> int:
    """One soak; the exit status."""
    token = secrets.token_hex(16)
    (folder / "tokens").write_text(f"{token} *\n")
    port = free_port()
    proc = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, "-m", "scheduler_extender", "--port", str(port),
         "--static-token-file", str(folder / "tokens"), "--log-level", "warning"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=(folder / "extender.log").open("wb"),
    )  # fmt: skip
    try:
        await asyncio.to_thread(wait_until, "the extender", lambda: answers(port), 30.0, 0.2)
        pusher = Pusher(port, token, nodes, connections=16, interval_s=interval_s)
        warm = asyncio.Event()
        warming = asyncio.create_task(pusher.run(warm, drain_s=30))
        await asyncio.sleep(interval_s * 2)
        warm.set()
        await warming
        rss_before = round(rss_mib(proc.pid), 1)
        print(f"soak: {nodes} nodes pushing every {interval_s:g} s for {seconds:g} s, "
              f"scheduling alongside; extender RSS after warm-up {rss_before} MiB", flush=True)  # fmt: skip
        pusher = Pusher(port, token, nodes, connections=16, interval_s=interval_s, seq_from=10**6)
        stop = asyncio.Event()
        pushing = asyncio.create_task(pusher.run(stop, drain_s=30))
        scheduling = asyncio.create_task(schedule(port, nodes, stop))
        await asyncio.sleep(seconds)
        stop.set()
        latencies, pairs, errors = await scheduling
        await pushing
        rss_after = round(rss_mib(proc.pid), 1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    s = pusher.stats
    lost = s.due - s.answered
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    print(f"pushes: due {s.due}, answered {s.answered}, accepted {s.accepted}, failed "
          f"{s.failed}, late {s.late}, lost {lost}")  # fmt: skip
    print(f"verbs: {pairs} filter+prioritize pairs, {errors} errors, p50 {q[49]:.2f} ms, "
          f"p99 {q[98]:.2f} ms")  # fmt: skip
    print(f"extender RSS: {rss_before} MiB before, {rss_after} MiB after "
          f"({rss_after - rss_before:+.1f})")  # fmt: skip
    if lost or s.failed or s.accepted != s.answered or errors:
        print("soak: FAILED (a push was lost, failed or refused, or a verb erred)")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the soak."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--interval-s", type=float, default=1.0)
    args = p.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        print("soak: needs two CPUs (the extender gets one to itself)", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {0})
    with tempfile.TemporaryDirectory(prefix="edgegpu-soak-") as tmp:
        return asyncio.run(soak(args.nodes, args.seconds, args.interval_s, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
