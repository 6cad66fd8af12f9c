"""The fleet and its tasks: OpenB nodes in racks with one hot cabinet, OpenB task shapes and
durations arriving as a Poisson stream, each task's compute and memory over time.

Every choice here is the same for every arm and is stated in ``ASSUMPTIONS`` (docs/outcomes.md).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from benchmarks.openb.trace import MILLI, Nodes, Pods, load_nodes, load_pods, trace_path
from benchmarks.sharing import Task as Activity
from scheduler_extender.domain import QosClass

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

RACK_NODES = 4
"""Nodes per cabinet."""
INLET_C = (20.0, 27.0)
"""Cool cabinets' inlet air, drawn per cabinet: ASHRAE's recommended envelope is 18–27 °C."""
HOT_INLET_C = 38.0
"""The hot cabinet (blocked airflow, recirculation): above the recommended 27 °C, within A3's 40."""
LOAD = 1.0
"""Offered GPU demand (GPU-seconds asked per second) as a share of the fleet's GPUs."""
DURATION_S = (60.0, 6 * 3600.0)
"""A task's work at full speed: the trace's deletion − creation time, clipped to this range."""
ACTIVE_SHARE = (0.3, 0.9)
"""A task is active in this share of its 5-minute phases (drawn per task), as in bench-sharing;
idle, it uses a fifth of its compute and memory."""

ASSUMPTIONS = {
    "rack_nodes": RACK_NODES,
    "cool_inlet_c": list(INLET_C),
    "hot_inlet_c": HOT_INLET_C,
    "hot_cabinets": 1,
    "offered_load": LOAD,
    "duration_s_clip": list(DURATION_S),
    "active_share": list(ACTIVE_SHARE),
    "task_use": "a task asking g milli-GPU uses g/1000 of its GPU's compute and memory while "
    "active and a fifth of that while idle (benchmarks/sharing.py's phases)",
}


@dataclass(frozen=True, slots=True)
class Fleet:
    """Sampled OpenB nodes, their cabinets and inlet temperatures."""

    nodes: Nodes
    rack: IntArray
    inlet_c: FloatArray
    """Per node."""
    hot_rack: int


@dataclass(frozen=True, slots=True)
class Task:
    """One task: its OpenB pod, when it arrives, how much work it brings."""

    name: str
    pod: int
    """Row in the trace's ``Pods``."""
    arrival_s: float
    work_s: float
    """Seconds at full speed."""
    qos: QosClass
    activity: Activity

    def active(self, t: float) -> float:
        """1 in an active phase, the idle share in an idle one."""
        return self.activity.use_mib(t, 0.0)


def fleet(node_count: int, rng: np.random.Generator) -> Fleet:
    """``node_count`` OpenB GPU nodes drawn at random, in cabinets of RACK_NODES; one is hot."""
    every = load_nodes()
    rows = np.sort(rng.choice(every.size, size=node_count, replace=False))
    nodes = Nodes(
        names=tuple(every.names[i] for i in rows),
        cpu=every.cpu[rows].copy(),
        memory=every.memory[rows].copy(),
        gpus=every.gpus[rows].copy(),
        model=every.model[rows].copy(),
        models=every.models,
    )
    rack = rng.permutation(node_count) // RACK_NODES
    racks = int(rack.max()) + 1
    inlet = rng.uniform(*INLET_C, size=racks)
    hot = int(rng.integers(racks))
    inlet[hot] = HOT_INLET_C
    return Fleet(nodes=nodes, rack=rack.astype(np.int64), inlet_c=inlet[rack], hot_rack=hot)


def _lifetimes(trace: str) -> dict[str, float]:
    with trace_path(trace).open(newline="") as fh:
        return {
            r["name"]: float(int(r["deletion_time"]) - int(r["creation_time"]))
            for r in csv.DictReader(fh)
        }


def tasks(
    pods: Pods, lifetimes: dict[str, float], gpus: int, horizon_s: float, rng: np.random.Generator
) -> list[Task]:
    """Poisson arrivals of the trace's GPU tasks (drawn with replacement) at LOAD × ``gpus``."""
    gpu_rows = np.flatnonzero(pods.gpu_request > 0)
    work = np.clip([lifetimes[pods.names[i]] for i in gpu_rows], *DURATION_S)
    gpu_seconds = float(np.mean(pods.gpu_request[gpu_rows] / MILLI * work))
    rate = LOAD * gpus / gpu_seconds
    out: list[Task] = []
    t = float(rng.exponential(1 / rate))
    while t < horizon_s:
        k = int(rng.integers(gpu_rows.size))
        i = int(gpu_rows[k])
        activity = Activity(
            name=f"t{len(out)}",
            request_mib=1.0,
            active_share=float(rng.uniform(*ACTIVE_SHARE)),
            misbehaves=False,
            seed=int(rng.integers(2**31)),
        )
        out.append(Task(f"t{len(out)}", i, t, float(work[k]), pods.qos[i], activity))
        t += float(rng.exponential(1 / rate))
    return out


def load_trace(trace: str = "default") -> tuple[Pods, dict[str, float]]:
    """The trace's pods and each pod's lifetime (s)."""
    return load_pods(trace_path(trace)), _lifetimes(trace)
