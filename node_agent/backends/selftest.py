"""``--self-test``: a node's GPU self-test, run on demand (the remediation loop asks for it).

Runs what is there: ``nvidia-smi -q``, ``dcgmi diag -r 1`` and the CUDA context probe on every
GPU, and prints one verdict as JSON. A tool that is missing is reported as skipped, not failed;
having nothing at all to run is a failure (nothing was verified).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

from node_agent.backends.cuda_probe import CudaProbe


@dataclass(frozen=True, slots=True)
class Check:
    """One step of the self-test."""

    name: str
    outcome: str
    """``pass``, ``fail`` or ``skipped``."""
    detail: str = ""
    duration_s: float = 0.0


def _run_tool(
    name: str, argv: Sequence[str], timeout_s: float, which: Callable[[str], str | None]
) -> Check:
    if which(argv[0]) is None:
        return Check(name, "skipped", f"{argv[0]} not found on PATH")
    start = time.monotonic()
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return Check(name, "fail", f"timed out after {timeout_s:.0f} s", time.monotonic() - start)
    except OSError as exc:
        return Check(name, "fail", f"could not run: {exc}", time.monotonic() - start)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    tail = " | ".join(out[-3:])[:500]
    failed = proc.returncode != 0 or any("fail" in line.lower() for line in out if "diag" in name)
    return Check(
        name,
        "fail" if failed else "pass",
        f"exit {proc.returncode}: {tail}",
        time.monotonic() - start,
    )


NVIDIA_TOOLS: Final = (
    ("nvidia-smi", ["nvidia-smi", "-q"]),
    ("dcgm-diag-r1", ["dcgmi", "diag", "-r", "1"]),
)


def nvidia_tools(level: int = 1) -> tuple[tuple[str, list[str]], ...]:
    """``nvidia-smi -q`` and ``dcgmi diag -r <level>`` (1 quick, 2 medium, 3 long)."""
    return (
        ("nvidia-smi", ["nvidia-smi", "-q"]),
        (f"dcgm-diag-r{level}", ["dcgmi", "diag", "-r", str(level)]),
    )


def run_self_test(
    gpu_count: int,
    *,
    probe: CudaProbe | None = None,
    which: Callable[[str], str | None] = shutil.which,
    timeout_s: float = 180.0,
    tools: Sequence[tuple[str, Sequence[str]]] = NVIDIA_TOOLS,
    cuda: bool = True,
) -> dict[str, Any]:
    """Every check, then the verdict: ``pass`` only if something ran and nothing failed.

    ``tools``: (name, argv) of each diagnostic tool, run where installed; ``cuda``: also
    create and destroy a CUDA context on every GPU.
    """
    started = time.monotonic()
    checks = [_run_tool(name, argv, timeout_s, which) for name, argv in tools]
    probe = (probe or CudaProbe()) if cuda else None
    if probe is not None and not probe.available:
        checks.append(Check("cuda-context", "skipped", "libcuda not found"))
    for i in range(gpu_count if probe is not None and probe.available else 0):
        assert probe is not None
        t0 = time.monotonic()
        result = probe.probe(i)
        checks.append(
            Check(
                f"cuda-context-gpu{i}",
                "pass" if result.ok else "fail",
                result.detail,
                time.monotonic() - t0,
            )
        )
    return verdict_of(checks, gpu_count, started)


def verdict_of(checks: Sequence[Check], gpu_count: int, started: float) -> dict[str, Any]:
    """The verdict document of some checks: ``pass`` only if something ran and nothing failed."""
    ran = [c for c in checks if c.outcome != "skipped"]
    verdict = "pass" if ran and all(c.outcome == "pass" for c in ran) else "fail"
    return {
        "verdict": verdict,
        "reason": "" if ran else "no GPU tool or CUDA driver found: nothing could be verified",
        "gpus": gpu_count,
        "checks": [asdict(c) for c in checks],
        "duration_s": round(time.monotonic() - started, 3),
    }
