"""``make gpu-check``: the agent's checks on a machine with a real GPU (NVIDIA, AMD or Intel).

1. The backend present (NVML, else amdsmi, else xpu-smi): open, read every GPU, node checks,
   XID poll (what ``--once --print`` sends).
2. Power-limit dry run: the limits NVML allows and what thermal protection and power saving
   would set, planned but not applied; the GPU's settings are read before and after and must
   be the same.
3. CUDA context probe on every GPU (create + destroy, timed; NVIDIA only).
4. The agent itself: ``--backend <that backend> --once --print --dry-run``.
Prints what it saw; exits 0 when every step ran, 1 otherwise, 2 without a GPU. Well under 5 min.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from node_agent.backends.amd import AmdBackend
from node_agent.backends.base import GpuBackend
from node_agent.backends.cuda_probe import CudaProbe
from node_agent.backends.intel import IntelBackend
from node_agent.backends.nvml import NvmlBackend
from node_agent.errors import BackendUnavailable
from node_agent.model import Capabilities, GpuReading
from node_agent.protection.power import IDLE, PowerArgs, plan

ROOT = Path(__file__).resolve().parent.parent


def _settings(b: GpuBackend, i: int) -> tuple[float | None, float | None]:
    r = b.read(i)
    return r.power_limit_w, r.sm_clock_mhz if r.sm_clock_mhz is None else r.sm_clock_max_mhz


def main() -> int:
    """Run every step and print what it saw."""
    ok = True
    started = time.monotonic()
    backend: GpuBackend | None = None
    tried = []
    for candidate in (NvmlBackend(cuda_probe=None), AmdBackend(), IntelBackend()):
        try:
            candidate.open()
        except BackendUnavailable as exc:
            tried.append(f"{candidate.name}: {exc}")
            continue
        backend = candidate
        break
    if backend is None:
        print("gpu-check: no GPU here (" + "; ".join(tried) + ")")
        return 2
    try:
        print(f"== 1. {backend.name} sampling: {backend.device_count()} GPU(s)")
        for i in range(backend.device_count()):
            t0 = time.perf_counter()
            reading = backend.read(i)
            ms = (time.perf_counter() - t0) * 1000
            print(json.dumps(asdict(reading), default=str))
            print(f"   read in {ms:.2f} ms; capabilities {asdict(backend.capabilities(i))}")
            ok &= not reading.lost
        print(f"   node checks: {asdict(backend.node_checks())}")
        print(f"   xids now: {backend.poll_xids(time.monotonic())}")

        print("== 2. Power-limit dry run (nothing is applied)")
        args = PowerArgs(window_s=0.0)
        for i in range(backend.device_count()):
            before = _settings(backend, i)
            limits = backend.power_limits(i)
            caps = backend.capabilities(i)
            print(f"   gpu {i}: limits {limits and asdict(limits)}")
            hot = GpuReading(
                index=i,
                uuid="",
                temperature_c=args.max_temp_c + 1,
                utilization_pct=90.0,
                power_limit_w=limits.default_w if limits else None,
            )
            _, thermal = plan(IDLE, hot, limits, caps, False, 0.0, args)
            idle = GpuReading(index=i, uuid="", temperature_c=40.0, utilization_pct=0.0)
            _, saving = plan(
                IDLE,
                idle,
                limits,
                Capabilities(power_limit=caps.power_limit, locked_clocks=True),
                False,
                0.0,
                args,
            )
            print(f"   gpu {i}: thermal protection would do {[asdict(a) for a in thermal]}")
            print(f"   gpu {i}: power saving would do {[asdict(a) for a in saving]}")
            after = _settings(backend, i)
            same = "unchanged" if before == after else "CHANGED"
            print(f"   gpu {i}: settings before {before} after {after} -> {same}")
            ok &= before == after

        print("== 3. CUDA context probe")
        probe = CudaProbe()
        if backend.name != "nvml":
            print("   not an NVIDIA GPU: skipped")
        elif not probe.available:
            print("   libcuda not found")
            ok = False
        for i in range(backend.device_count() if probe.available and backend.name == "nvml" else 0):
            t0 = time.perf_counter()
            result = probe.probe(i)
            ms = (time.perf_counter() - t0) * 1000
            print(f"   gpu {i}: {'ok' if result.ok else 'FAILED ' + result.detail} in {ms:.1f} ms")
            ok &= result.ok
    finally:
        backend.close()

    print(f"== 4. Agent: --backend {backend.name} --once --print --dry-run")
    env = {**os.environ, "NODE_NAME": os.environ.get("NODE_NAME") or os.uname().nodename}
    probe_args = ["--cuda-probe-interval-s", "1"] if backend.name == "nvml" else []
    proc = subprocess.run(
        [sys.executable, "-m", "node_agent", "--backend", backend.name, "--once", "--print",
         "--dry-run", *probe_args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    print(proc.stdout)
    print(proc.stderr[-2000:], file=sys.stderr)
    ok &= proc.returncode == 0
    print(f"== gpu-check {'passed' if ok else 'FAILED'} in {time.monotonic() - started:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
