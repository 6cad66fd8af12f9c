"""Load the OpenB node and pod lists and build one seed's workload (arrival order, 130 %).

Units are the trace's: CPU in milli-cores, host memory in MiB, GPU in milli-GPU (1000 per GPU).
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from scheduler_extender.domain import QosClass
from scheduler_extender.policy.rules.fragmentation import commonest

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

MILLI = 1000
"""Milli-GPU per GPU."""
MAX_GPUS = 8
"""GPU slots per node (the largest OpenB node has 8)."""
TUNE_RATIO = 1.3
"""The workload is topped up until its GPU request is this share of the cluster's GPUs."""
POPULARITY = 0.95
"""Typical pods: the most common shapes covering this share of pods."""
DEFAULT_CPU_MILLI = 100
"""Kubernetes' non-zero default request, used for scoring a pod that asks for no CPU."""

QOS_CLASSES: dict[str, QosClass] = {
    "LS": QosClass.INFERENCE,
    "BE": QosClass.BEST_EFFORT,
    "Burstable": QosClass.BEST_EFFORT,
    "Guaranteed": QosClass.TRAINING,
}
"""The trace's qos column in our classes: latency-sensitive serving is inference, best-effort
and burstable jobs are best-effort, guaranteed jobs get training's protection."""

NODE_FILE = "openb_node_list_gpu_node.csv"
TRACES = (
    "default",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
)
"""The 17 traces the paper's run script uses, by file suffix."""


def data_dir() -> Path:
    """Where the trace lives: ``$OPENB_DATA`` or the shared data folder beside the checkout."""
    env = os.environ.get("OPENB_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data" / "openb"


@dataclass(frozen=True, slots=True)
class Nodes:
    """The cluster, sorted by node name (the simulator's order before renaming)."""

    names: tuple[str, ...]
    cpu: IntArray
    memory: IntArray
    gpus: IntArray
    model: IntArray
    """Index into ``models``."""
    models: tuple[str, ...]

    @property
    def size(self) -> int:
        """Number of nodes."""
        return len(self.names)

    @property
    def total_gpus(self) -> int:
        """GPUs in the cluster."""
        return int(self.gpus.sum())


@dataclass(frozen=True, slots=True)
class Pods:
    """A pod list in name order, as arrays."""

    names: tuple[str, ...]
    cpu: IntArray
    memory: IntArray
    num_gpu: IntArray
    gpu_milli: IntArray
    """Milli-GPU per GPU (1000 for whole-GPU pods, 0 for CPU-only ones)."""
    spec: IntArray
    """Index into ``specs``: the GPU models the pod accepts; 0 = any."""
    specs: tuple[frozenset[str], ...]
    """``specs[0]`` is the empty set, meaning any model."""
    qos: tuple[QosClass, ...]

    @property
    def size(self) -> int:
        """Number of pods."""
        return len(self.names)

    @property
    def gpu_request(self) -> IntArray:
        """Total milli-GPU per pod."""
        out: IntArray = self.num_gpu * self.gpu_milli
        return out

    def shape(self, i: int) -> Shape:
        """What scoring sees of pod ``i`` (memory only filters)."""
        return Shape(
            cpu=int(self.cpu[i]) or DEFAULT_CPU_MILLI,
            milli=int(self.gpu_milli[i]),
            num=int(self.num_gpu[i]),
            spec=int(self.spec[i]),
        )


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """A pod's resource shape: CPU, milli-GPU per GPU, GPU count, accepted models."""

    cpu: int
    milli: int
    num: int
    spec: int

    @property
    def sharing(self) -> bool:
        """One GPU, less than all of it."""
        return self.num == 1 and 0 < self.milli < MILLI

    @property
    def wants_gpu(self) -> bool:
        """The pod asks for some GPU."""
        return self.num > 0 and self.milli > 0

    @property
    def total(self) -> int:
        """Milli-GPU in all."""
        return self.num * self.milli


@dataclass(frozen=True, slots=True)
class TypicalPods:
    """FGD's workload model: the most common shapes and their frequencies (sum 1)."""

    shapes: tuple[Shape, ...]
    freq: npt.NDArray[np.float64]


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found; set OPENB_DATA to the folder holding the OpenB csv files"
        )
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def load_nodes(path: Path | None = None) -> Nodes:
    """The GPU node list (``openb_node_list_gpu_node.csv``)."""
    rows = sorted(_rows(path or data_dir() / NODE_FILE), key=lambda r: r["sn"])
    models = tuple(sorted({r["model"] for r in rows}))
    index = {m: i for i, m in enumerate(models)}
    gpus = np.array([int(r["gpu"]) for r in rows], dtype=np.int64)
    if gpus.max(initial=0) > MAX_GPUS:
        raise ValueError(f"a node has more than {MAX_GPUS} GPUs")
    return Nodes(
        names=tuple(r["sn"] for r in rows),
        cpu=np.array([int(r["cpu_milli"]) for r in rows], dtype=np.int64),
        memory=np.array([int(r["memory_mib"]) for r in rows], dtype=np.int64),
        gpus=gpus,
        model=np.array([index[r["model"]] for r in rows], dtype=np.int64),
        models=models,
    )


def trace_path(trace: str) -> Path:
    """The pod list of a trace named by its file suffix (``default``, ``gpushare40``, ...)."""
    return data_dir() / f"openb_pod_list_{trace}.csv"


def load_pods(path: Path) -> Pods:
    """A pod list, sorted by name. ``gpu_spec`` lists accepted models joined by ``|``.

    A file without ``gpu_spec`` accepts any model; without ``qos`` every pod is LS.
    """
    rows = sorted(_rows(path), key=lambda r: r["name"])
    specs: dict[frozenset[str], int] = {frozenset(): 0}
    spec_ids = []
    for r in rows:
        accepted = frozenset(m for m in (r.get("gpu_spec") or "").split("|") if m)
        spec_ids.append(specs.setdefault(accepted, len(specs)))
    num_gpu = np.array([int(r["num_gpu"]) for r in rows], dtype=np.int64)
    milli = np.array([int(r["gpu_milli"]) for r in rows], dtype=np.int64)
    milli = np.where(num_gpu > 0, milli, 0)
    for r in rows:  # the multigpu traces have neither gpu_spec nor qos
        r.setdefault("qos", "LS")
    unknown = sorted({r["qos"] for r in rows} - QOS_CLASSES.keys())
    if unknown:
        raise ValueError(f"{path.name}: unknown qos values {unknown}")
    return Pods(
        names=tuple(r["name"] for r in rows),
        cpu=np.array([int(r["cpu_milli"]) for r in rows], dtype=np.int64),
        memory=np.array([int(r["memory_mib"]) for r in rows], dtype=np.int64),
        num_gpu=num_gpu,
        gpu_milli=milli,
        spec=np.array(spec_ids, dtype=np.int64),
        specs=tuple(sorted(specs, key=specs.__getitem__)),
        qos=tuple(QOS_CLASSES[r["qos"]] for r in rows),
    )


def typical_pods(pods: Pods, threshold: float = POPULARITY) -> TypicalPods:
    """Shapes by count, most common first (ties: smaller shape first), until ≥ ``threshold``."""
    taken = commonest(Counter(pods.shape(i) for i in range(pods.size)), threshold)
    freq = np.array([c for _, c in taken], dtype=np.float64)
    return TypicalPods(shapes=tuple(s for s, _ in taken), freq=freq / freq.sum())


def spec_mask(pods: Pods, nodes: Nodes) -> BoolArray:
    """(specs, nodes): may a pod of each spec use each node's GPUs."""
    out = np.ones((len(pods.specs), nodes.size), dtype=np.bool_)
    for s, accepted in enumerate(pods.specs):
        if accepted:
            allowed = np.array([m in accepted for m in nodes.models])
            out[s] = allowed[nodes.model]
    return out


def workload(pods: Pods, total_gpus: int, rng: np.random.Generator) -> IntArray:
    """One seed's arrival order, as indices into ``pods`` (clones repeat an index).

    Shuffle the name-sorted pods, then append random clones until the GPU request reaches
    TUNE_RATIO of the cluster (stopping at the first clone whose per-GPU milli would pass it),
    or drop random pods while the request is above it.
    """
    order = rng.permutation(pods.size)
    request = pods.gpu_request
    target = TUNE_RATIO * total_gpus * MILLI
    total = int(request.sum())
    if total < target:
        extra: list[int] = []
        while True:
            j = int(rng.integers(pods.size))
            if total + int(pods.gpu_milli[j]) > target:
                break
            extra.append(j)
            total += int(request[j])
        return np.concatenate([order, np.array(extra, dtype=np.int64)])
    keep = list(order)
    while total > target and keep:
        k = int(rng.integers(len(keep)))
        total -= int(request[keep[k]])
        del keep[k]
    return np.array(keep, dtype=np.int64)
