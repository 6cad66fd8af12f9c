"""The GPU self-test and regression suite: what the fault loop and a maintenance validate with.

Each backend builds its list of checks for a level (1 quick, 2 medium, 3 long) and this module
runs them: the backend's own library checks, the vendor's diagnostic tools and benchmark
programs where installed (each output parsed by ``diag_output`` into pass/fail and figures),
and, on NVIDIA, a CUDA context on every GPU. A tool that is not installed is reported as
skipped, not failed; having nothing at all to run is a failure (nothing was verified). The
figures (bandwidths in GB/s) are compared with the node's own last passing run by the agent
(``protection.baseline``), not here.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from node_agent.backends import diag_output
from node_agent.backends.cuda_probe import CudaProbe
from node_agent.backends.diag_output import Check, Parse

__all__ = ["Check", "Tool", "finder", "gpu_checks", "nvidia_tools", "run_self_test", "verdict_of"]
from node_agent.model import GpuReading

log = logging.getLogger("node_agent.selftest")

DEFAULT_TOOL_DIRS: Final = (Path("/usr/local/cuda/extras/demo_suite"), Path("/opt/rocm/bin"))
"""Searched before PATH for the suite's programs: where the CUDA toolkit installs deviceQuery,
vectorAdd and bandwidthTest, and where ROCm installs rvs and rocm-bandwidth-test."""

TIMEOUT_S: Final = {1: 300.0, 2: 900.0, 3: 2700.0}
"""Seconds each program may run, by level (``dcgmi diag -r 3`` takes tens of minutes)."""

OUTPUT_LIMIT: Final = 1024 * 1024
"""Bytes of a program's output kept and parsed: its last MiB (read as it comes)."""

SUITE_S: Final = {1: 540.0, 2: 1500.0, 3: 6600.0}
"""Seconds the whole suite may run, by level: under the fault loop's selfTestTimeout (10
minutes, level 1) and a maintenance's validationTimeout (30 minutes; 2 hours at level 3), so
that a verdict comes in time, failing what did not run."""

READ_GRACE_S: Final = 5.0
"""How long the end of a program's output, and its death after SIGKILL, are waited for."""


@dataclass(frozen=True, slots=True)
class Tool:
    """A program the suite runs where it is installed."""

    name: str
    argv: tuple[str, ...]
    parse: Parse = diag_output.exit_status
    env: Mapping[str, str] = field(default_factory=dict)
    """Set on top of the agent's environment."""


def finder(dirs: Sequence[Path]) -> Callable[[str], str | None]:
    """``shutil.which`` over ``dirs`` then PATH, taking only a program nobody else may replace.

    The agent runs as root: a program (or its folder) owned by another user, or writable by
    group or others, is passed over.
    """
    path = os.pathsep.join([*(str(d) for d in dirs), os.environ.get("PATH", os.defpath)])

    def find(program: str) -> str | None:
        for folder in path.split(os.pathsep):
            found = shutil.which(program, path=folder) if folder else None
            if found and _trusted(Path(found)):
                return found
        return None

    return find


def _trusted(program: Path) -> bool:
    me = os.geteuid()
    try:
        for path in (program.resolve(), program.resolve().parent):
            st = path.stat()
            if st.st_uid not in (0, me) or st.st_mode & 0o022:
                return False
    except OSError:
        return False
    return True


def _run_tool(
    tool: Tool, timeout_s: float, which: Callable[[str], str | None], stop: threading.Event
) -> list[Check]:
    if stop.is_set():
        return [Check(tool.name, "fail", "not run: the agent is stopping")]
    if timeout_s <= 0:
        return [Check(tool.name, "fail", "not run: the suite's time is spent")]
    program = which(tool.argv[0])
    if program is None:
        return [Check(tool.name, "skipped", f"{tool.argv[0]} not found")]
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [program, *tool.argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **tool.env},
            start_new_session=True,
        )
    except OSError as exc:
        return [Check(tool.name, "fail", f"could not run: {exc}")]
    output = _Tail(proc)
    code: int | None = None
    try:
        deadline = start + timeout_s
        while code is None and not stop.is_set() and time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
    finally:  # whatever ends the wait (an exception, the agent stopping): none of it outlives it
        _kill_group(proc)  # what it left behind too (stress workers, a stuck child)
    text = output.text()
    if code is None and stop.is_set():
        return [Check(tool.name, "fail", "stopped: the agent is stopping", _since(start))]
    if code is None:
        why = f"timed out after {timeout_s:.0f} s: {diag_output.tail(text)}".rstrip(": ")
        return [Check(tool.name, "fail", why[: diag_output.DETAIL_LIMIT], _since(start))]
    try:
        checks = tool.parse(tool.name, code, text)
    except Exception as exc:  # a parser bug must not lose the verdict
        why = f"output not understood ({exc}): {diag_output.tail(text)}"
        checks = [Check(tool.name, "fail", why[: diag_output.DETAIL_LIMIT])]
    took = _since(start)
    return [replace(c, duration_s=took) for c in checks]


class _Tail:
    """A program's output read in a thread, its last ``OUTPUT_LIMIT`` bytes kept."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._pipe = proc.stdout
        self._kept = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._pipe is not None
        try:
            while chunk := os.read(self._pipe.fileno(), 65536):
                self._kept += chunk
                if len(self._kept) > 2 * OUTPUT_LIMIT:
                    del self._kept[:-OUTPUT_LIMIT]
        except (OSError, ValueError):
            pass
        finally:
            self._pipe.close()

    def text(self) -> str:
        """What was read; a descendant that still holds the pipe is not waited for long."""
        self._reader.join(timeout=READ_GRACE_S)
        return bytes(self._kept[-OUTPUT_LIMIT:]).decode(errors="replace")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL its process group, then reap it without waiting on a process the kernel holds."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.wait(timeout=READ_GRACE_S)
    except subprocess.TimeoutExpired:
        log.warning("pid %d did not die on SIGKILL (stuck in the driver?): left behind", proc.pid)


def _since(start: float) -> float:
    return round(time.monotonic() - start, 3)


def nvidia_tools(
    level: int = 1, gpu_count: int = 1, uuids: Sequence[str] | None = None
) -> tuple[Tool, ...]:
    """The NVIDIA suite at ``level``.

    1: ``nvidia-smi -q``, ``dcgmi diag -r 1``, deviceQuery (all ``gpu_count`` GPUs seen),
    vectorAdd; 2: ``dcgmi diag -r 2`` and bandwidthTest on every GPU; 3: ``dcgmi diag -r 3``
    and p2pBandwidthLatencyTest (more than one GPU). With ``uuids`` (NVML's, by index) the
    CUDA programs see exactly those GPUs, and bandwidthTest of GPU i only GPU i, whatever
    ``CUDA_VISIBLE_DEVICES`` the agent inherited.
    """
    every = {"CUDA_VISIBLE_DEVICES": ",".join(uuids)} if uuids else {}
    tools = [
        Tool("nvidia-smi", ("nvidia-smi", "-q")),
        Tool(f"dcgm-diag-r{level}", ("dcgmi", "diag", "-r", str(level), "-j"), diag_output.dcgmi),
        Tool("deviceQuery", ("deviceQuery",),
             functools.partial(diag_output.device_query, expected=gpu_count), every),
        Tool("vectorAdd", ("vectorAdd",), diag_output.vector_add, every),
    ]  # fmt: skip
    if level >= 2:
        for i in range(gpu_count):
            if uuids:
                argv, env = ("bandwidthTest", "--device=0"), {"CUDA_VISIBLE_DEVICES": uuids[i]}
            else:
                argv, env = ("bandwidthTest", f"--device={i}"), {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
            tools.append(Tool(f"bandwidthTest-gpu{i}", argv, diag_output.bandwidth_test, env))
    if level >= 3 and gpu_count > 1:
        tools.append(
            Tool(
                "p2pBandwidthLatencyTest",
                ("p2pBandwidthLatencyTest",),
                diag_output.p2p_bandwidth,
                every,
            )
        )
    return tuple(tools)


def gpu_checks(
    gpu_count: int,
    read: Callable[[int], GpuReading],
    more: Callable[[int], list[str]] | None = None,
) -> list[Check]:
    """The library's own word on each GPU.

    It answers, has no uncorrectable ECC errors since the driver loaded, and ``more`` (a list
    of problems; empty: none) finds nothing wrong.
    """
    checks = []
    for i in range(gpu_count):
        t0 = time.monotonic()
        try:
            reading = read(i)
            problems = ["lost: the library cannot read it"] if reading.lost else []
            if reading.ecc_uncorrected:
                problems.append(f"{reading.ecc_uncorrected} uncorrectable ECC error(s)")
            if not reading.lost and more is not None:
                problems += more(i)
        except Exception as exc:  # a library that raises is a failed check, not a crash
            problems = [f"{type(exc).__name__}: {exc}"]
        outcome = "fail" if problems else "pass"
        checks.append(Check(f"library-gpu{i}", outcome, "; ".join(problems), _since(t0)))
    return checks


def run_self_test(
    gpu_count: int,
    *,
    probe: CudaProbe | None = None,
    which: Callable[[str], str | None] | None = None,
    timeout_s: float = TIMEOUT_S[1],
    tools: Sequence[Tool] = (),
    cuda: bool = True,
    checks: Sequence[Check] = (),
    bandwidth: bool = False,
    budget_s: float | None = None,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """``checks`` (the backend's own), every tool, the CUDA probe, then the verdict.

    ``tools`` run where installed (``which``: how a program is found; PATH by default);
    ``cuda``: also create and destroy a CUDA context on every GPU; ``timeout_s``: per tool,
    its whole process group is killed then; ``bandwidth``: the level asks for bandwidths, and
    none measured (no bandwidth program installed) fails; ``budget_s``: the whole suite's time
    (a program that would start after it is not run, and fails); ``stop``: set (the backend
    closing as the agent stops), the program running is killed and no other starts.
    """
    started = time.monotonic()
    find = which or finder(())
    results = list(checks)
    for tool in tools:
        left = budget_s - (time.monotonic() - started) if budget_s is not None else timeout_s
        results += _run_tool(tool, min(timeout_s, left), find, stop or threading.Event())
    probe = (probe or CudaProbe()) if cuda else None
    if probe is not None and not probe.available:
        results.append(Check("cuda-context", "skipped", "libcuda not found"))
    for i in range(gpu_count if probe is not None and probe.available else 0):
        assert probe is not None
        t0 = time.monotonic()
        result = probe.probe(i)
        results.append(
            Check(
                f"cuda-context-gpu{i}",
                "pass" if result.ok else "fail",
                result.detail,
                _since(t0),
            )
        )
    if bandwidth and not any(k.endswith("_gbps") for c in results for k in c.figures):
        why = "this level measures bandwidths and no program of the suite that does was found"
        results.append(Check("bandwidth", "fail", f"{why} (see --diag-path)"))
    return verdict_of(results, gpu_count, started)


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
