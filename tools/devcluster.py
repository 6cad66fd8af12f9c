"""``make run``: the extender on 127.0.0.1 plus simulated node agents pushing to it.

The agents are the real agent processes with the simulated backend: varied models, loads and
racks, one node that overheats and one that reports a fatal XID, so that every filter reason
can be seen with curl at once. Ctrl-C stops everything.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = [
    "steady", "steady", "cabinet-overheat", "xid-79", "steady", "overheat", "ecc", "gpu-lost",
]  # fmt: skip
VENDOR_MODELS = {1: "AMD Instinct MI210", 4: "Intel Data Center GPU Flex 170"}
"""Simulated nodes of other vendors: edge-1 has AMD GPUs, edge-4 (with NODES=5 or more) Intel."""


@dataclass
class Child:
    """A process the launcher started: its name, and its last lines (relayed as they come)."""

    name: str
    proc: subprocess.Popen[bytes]
    last: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=15))

    @classmethod
    def start(cls, name: str, cmd: list[str], env: dict[str, str]) -> Child:
        """Start ``cmd``; its output goes to ours, each line behind its name."""
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        child = cls(name, proc)
        threading.Thread(target=child._relay, daemon=True).start()
        return child

    def _relay(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.last.append(line)
            print(f"[{self.name}] {line}", flush=True)

    def died(self) -> str:
        """What to say of a child that exited: its name, status and last lines."""
        time.sleep(0.2)  # its last lines are still being relayed
        lines = "\n".join(f"  {line}" for line in self.last) or "  (nothing)"
        return f"{self.name} (pid {self.proc.pid}) exited with status {self.proc.returncode}; " \
            f"its last lines:\n{lines}"  # fmt: skip


def _taken(host: str, port: int) -> bool:
    """Whether something listens on host:port already (another ``make run``?)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def _wait_for(url: str, timeout_s: float, procs: list[Child]) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(c.proc.poll() is not None for c in procs):
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
    wanted = [("the extender", args.host, args.port, "PORT")] + [
        (f"agent edge-{i}'s metrics", "127.0.0.1", args.metrics_base_port + i, "METRICS_PORT")
        for i in range(args.nodes)
    ]
    for what, host, port, variable in wanted:
        if _taken(host, port):
            print(f"{host}:{port}, for {what}, is in use already (another make run?): stop it, "
                  f"or choose another port, e.g. make run {variable}={port + 100}",
                  file=sys.stderr)  # fmt: skip
            return 2
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
    procs = [Child.start("extender", cmd, env)]
    try:
        if not _wait_for(f"{base}/healthz", 30.0, procs):
            why = procs[0].died() if procs[0].proc.poll() is not None else "no answer in 30 s"
            print(f"the extender did not start: {why}", file=sys.stderr)
            return 1
        names = []
        for i in range(args.nodes):
            name = f"edge-{i}"
            names.append(name)
            scenario = SCENARIOS[i % len(SCENARIOS)]
            procs.append(
                Child.start(
                    f"agent {name}",
                    [
                        sys.executable, "-m", "node_agent", "--backend", "simulated",
                        "--node-name", name, "--gpus", str(2 + (i % 3) * 2), "--seed", str(i),
                        "--scenario", scenario, "--scenario-after-s", "15",
                        "--extender-urls", base, "--interval-s", str(args.interval_s),
                        "--metrics-port", str(args.metrics_base_port + i),
                        "--metrics-host", "127.0.0.1",
                        "--labels", f"edgegpu.io/rack=rack-{'ab'[i % 2]}",
                        "--log-level", "info",  # power and thermal steps are info
                        *(["--model", VENDOR_MODELS[i]] if i in VENDOR_MODELS else []),
                    ],
                    env,
                )
            )  # fmt: skip
            port = args.metrics_base_port + i
            print(f"agent {name}: scenario {scenario}, metrics on 127.0.0.1:{port}")
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            if (dead := _dead(procs)) is not None:
                print(f"make run stopped: {dead.died()}", file=sys.stderr)
                return 1
            nodes = httpx.get(f"{base}/debug/nodes", timeout=2.0).json()["nodes"]
            if len([n for n in nodes if n["reported"]]) >= args.nodes:
                break
            time.sleep(0.3)
        print(f"\nedgegpu extender on {base} with {args.nodes} simulated nodes. Try:")
        print(_curl_examples(base, ",".join(names), args.metrics_base_port))
        print("Ctrl-C stops everything.", flush=True)
        start = time.monotonic()
        while (dead := _dead(procs)) is None:
            if args.duration_s and time.monotonic() - start > args.duration_s:
                return 0
            time.sleep(0.5)
        print(f"make run stopped: {dead.died()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for child in procs:
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        for child in procs:
            try:
                child.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.proc.kill()


def _dead(procs: list[Child]) -> Child | None:
    """The first child that exited, if any."""
    return next((c for c in procs if c.proc.poll() is not None), None)


if __name__ == "__main__":
    raise SystemExit(main())
