"""``make run``: the extender on 127.0.0.1 plus simulated node agents pushing to it.

The agents are the real agent processes with the simulated backend: varied models, loads and
racks, one node that overheats and one that reports a fatal XID, so that every filter reason
can be seen with curl at once. Ctrl-C stops everything.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = [
    "steady", "steady", "cabinet-overheat", "xid-79", "steady", "overheat", "ecc", "gpu-lost",
]  # fmt: skip
VENDOR_MODELS = {1: "AMD Instinct MI210", 4: "Intel Data Center GPU Flex 170"}
"""Simulated nodes of other vendors: edge-1 has AMD GPUs, edge-4 (with NODES=5 or more) Intel."""


def _wait_for(url: str, timeout_s: float, procs: list[subprocess.Popen[bytes]]) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            return False
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def _curl_examples(base: str, node: str, metrics_port: int) -> str:
    pod = (
        '{"Pod":{"metadata":{"name":"infer-0","namespace":"default","uid":"uid-infer-0",'
        '"annotations":{"edgegpu.io/qos":"inference"}},"spec":{"containers":[{"name":"app",'
        '"resources":{"limits":{"edgegpu.io/gpu-mem-block":"1"}}}]}},'
        '"NodeNames":[' + ",".join(f'"{n}"' for n in node.split(",")) + "]}"
    )
    return f"""
  curl -s {base}/debug/nodes | python3 -m json.tool | head -60
  J='Content-Type: application/json'
  curl -s -H "$J" {base}/filter -d '{pod}'
  curl -s -H "$J" {base}/prioritize -d '{pod}'
  curl -s -H "$J" {base}/debug/explain -d '{pod}' | python3 -m json.tool | head -60
  curl -s {base}/debug/policy | python3 -m json.tool
  curl -s {base}/metrics | grep edgegpu_extender_decisions_total
  curl -s 127.0.0.1:{metrics_port}/metrics | grep node_gpu_temperature_celsius
"""


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Start the extender and the agents, print the curl commands, wait for Ctrl-C."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8888)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--interval-s", type=float, default=2.0)
    p.add_argument("--metrics-base-port", type=int, default=9400)
    p.add_argument("--policy", help="GPUSchedulingPolicy file for the extender")
    p.add_argument("--duration-s", type=float, default=0.0, help="stop after this long (0 = never)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupted)  # stop the children too, as Ctrl-C does
    base = f"http://{args.host}:{args.port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "scheduler_extender",
        "--host",
        args.host,
        "--port",
        str(args.port),
    ]
    if args.policy:
        cmd += ["--policy-file", args.policy]
    procs: list[subprocess.Popen[bytes]] = [subprocess.Popen(cmd, cwd=ROOT, env=env)]
    try:
        if not _wait_for(f"{base}/healthz", 30.0, procs):
            print("the extender did not start; see its log above", file=sys.stderr)
            return 1
        names = []
        for i in range(args.nodes):
            name = f"edge-{i}"
            names.append(name)
            scenario = SCENARIOS[i % len(SCENARIOS)]
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable, "-m", "node_agent", "--backend", "simulated",
                        "--node-name", name, "--gpus", str(2 + (i % 3) * 2), "--seed", str(i),
                        "--scenario", scenario, "--scenario-after-s", "15",
                        "--extender-urls", base, "--interval-s", str(args.interval_s),
                        "--metrics-port", str(args.metrics_base_port + i),
                        "--metrics-host", "127.0.0.1",
                        "--labels", f"edgegpu.io/rack=rack-{'ab'[i % 2]}",
                        "--log-level", "warning",
                        *(["--model", VENDOR_MODELS[i]] if i in VENDOR_MODELS else []),
                    ],
                    cwd=ROOT,
                    env=env,
                )
            )  # fmt: skip
            port = args.metrics_base_port + i
            print(f"agent {name}: scenario {scenario}, metrics on 127.0.0.1:{port}")
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            nodes = httpx.get(f"{base}/debug/nodes", timeout=2.0).json()["nodes"]
            if len([n for n in nodes if n["reported"]]) >= args.nodes:
                break
            time.sleep(0.3)
        print(f"\nedgegpu extender on {base} with {args.nodes} simulated nodes. Try:")
        print(_curl_examples(base, ",".join(names), args.metrics_base_port))
        print("Ctrl-C stops everything.", flush=True)
        start = time.monotonic()
        while all(p.poll() is None for p in procs):
            if args.duration_s and time.monotonic() - start > args.duration_s:
                break
            time.sleep(0.5)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    raise SystemExit(main())
