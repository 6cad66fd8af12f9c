"""One seed of the replay: each pod of the 130 % workload gets one scheduling attempt, in order.

As the FGD paper's simulator does it (research notes §3): filter on CPU, memory, GPU model and
GPU room; score every feasible node with the one enabled plugin; the highest score wins and
ties go to the node with the smallest seed-permuted name; Reserve picks the GPUs. A pod that
fits nowhere is dropped. After every pod the arrived request, allocated milli-GPU and cluster
frag are recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from benchmarks.openb import frag
from benchmarks.openb.policies import TAGS, Scorer, View, cluster_tag
from benchmarks.openb.trace import MILLI, Nodes, Pods, Shape, spec_mask, workload

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(slots=True)
class Cluster:
    """Mutable node state of one run."""

    nodes: Nodes
    fm: frag.FragModel
    cpu: IntArray = field(init=False)
    memory: IntArray = field(init=False)
    gpu: IntArray = field(init=False)
    tags: IntArray = field(init=False)
    frag: FloatArray = field(init=False)
    version: IntArray = field(init=False)

    def __post_init__(self) -> None:
        self.cpu, self.gpu = frag.node_states(self.nodes)
        self.memory = self.nodes.memory.copy()
        self.tags = np.zeros((self.nodes.size, TAGS), dtype=np.int64)
        self.frag = frag.amount(self.cpu, self.gpu, self.nodes.model, self.fm)
        self.version = np.zeros(self.nodes.size, dtype=np.int64)

    def view(self, rows: IntArray) -> View:
        """The scorers' view of some rows."""
        return View(
            cpu=self.cpu[rows],
            gpu=self.gpu[rows],
            model=self.nodes.model[rows],
            gpus=self.nodes.gpus[rows],
            frag=self.frag[rows],
            tags=self.tags[rows],
        )

    def feasible(self, cpu: int, memory: int, shape: Shape, allowed: BoolArray) -> BoolArray:
        """NodeResourcesFit (CPU, memory) and Open-Gpu-Share's filter (model, GPU room)."""
        ok: BoolArray = (self.cpu >= cpu) & (self.memory >= memory)
        if shape.wants_gpu:
            ok &= allowed
            if shape.sharing:
                ok &= (self.gpu >= shape.milli).any(axis=1)
            else:
                ok &= (self.gpu == MILLI).sum(axis=1) >= shape.num
        return ok

    def place(self, node: int, cpu: int, memory: int, shape: Shape, slots: IntArray) -> None:
        """Bind a pod: take its CPU, memory and milli-GPU on ``slots``."""
        self.cpu[node] -= cpu
        self.memory[node] -= memory
        if shape.wants_gpu:
            for slot in slots[: shape.num]:
                if self.gpu[node, slot] < shape.milli:
                    raise AssertionError(f"slot {slot} of node {node} cannot hold {shape}")
                self.gpu[node, slot] -= shape.milli
            self.tags[node, cluster_tag(shape)] += 1
        self.frag[node] = frag.amount(
            self.cpu[node : node + 1],
            self.gpu[node : node + 1],
            self.nodes.model[node : node + 1],
            self.fm,
        )[0]
        self.version[node] += 1


@dataclass(slots=True)
class _Cached:
    version: IntArray
    score: FloatArray
    slots: IntArray


@dataclass(frozen=True, slots=True)
class RunResult:
    """Per event: arrived milli-GPU, allocated milli-GPU and cluster frag (milli-GPU)."""

    arrived: IntArray
    used: IntArray
    frag: FloatArray
    failed: int
    total_gpus: int
    seconds: float
    decisions: int


Chooser = Callable[[Cluster, IntArray, Shape, int], tuple[int, IntArray] | None]
"""A whole decision (for policies that are not a cacheable score): feasible rows → node, slots."""


def pick(scores: FloatArray, rows: IntArray, priority: IntArray) -> int:
    """Highest score; ties go to the smallest renamed node (lowest priority number)."""
    best = scores == scores.max()
    candidates = rows[best]
    return int(candidates[np.argmin(priority[candidates])])


class Replay:
    """Run one (trace, policy, seed)."""

    def __init__(self, nodes: Nodes, pods: Pods, fm: frag.FragModel) -> None:
        self.nodes = nodes
        self.pods = pods
        self.fm = fm
        self.allowed = spec_mask(pods, nodes)

    def run(
        self,
        seed: int,
        scorer: Scorer | None = None,
        chooser: Callable[[np.random.Generator, IntArray], Chooser] | None = None,
    ) -> RunResult:
        """Replay with a cacheable ``scorer``, or a ``chooser`` built from the run's rng."""
        import time

        started = time.perf_counter()
        rng = np.random.default_rng(seed)
        order = workload(self.pods, self.nodes.total_gpus, rng)
        priority = rng.permutation(self.nodes.size)
        decide = chooser(rng, priority) if chooser is not None else None
        cluster = Cluster(self.nodes, self.fm)
        cache: dict[Shape, _Cached] = {}
        pods = self.pods
        request = pods.gpu_request
        n = len(order)
        arrived = np.zeros(n, dtype=np.int64)
        used = np.zeros(n, dtype=np.int64)
        frag_total = np.zeros(n)
        arrived_sum = used_sum = failed = 0
        for e, j in enumerate(order):
            shape = pods.shape(int(j))
            arrived_sum += int(request[j])
            cpu, memory = int(pods.cpu[j]), int(pods.memory[j])
            ok = cluster.feasible(cpu, memory, shape, self.allowed[pods.spec[j]])
            rows = np.flatnonzero(ok)
            choice: tuple[int, IntArray] | None = None
            if rows.size:
                if decide is not None:
                    choice = decide(cluster, rows, shape, int(j))
                else:
                    assert scorer is not None
                    entry = cache.get(shape)
                    if entry is None:
                        k = max(shape.num, 1)
                        entry = _Cached(
                            version=np.full(self.nodes.size, -1, dtype=np.int64),
                            score=np.zeros(self.nodes.size),
                            slots=np.full((self.nodes.size, k), -1, dtype=np.int64),
                        )
                        cache[shape] = entry
                    todo = rows[entry.version[rows] != cluster.version[rows]]
                    if todo.size:
                        entry.score[todo], entry.slots[todo] = scorer.score(
                            cluster.view(todo), shape
                        )
                        entry.version[todo] = cluster.version[todo]
                    scores = scorer.normalize(entry.score[rows])
                    node = pick(scores, rows, priority)
                    choice = (node, entry.slots[node])
            if choice is None:
                failed += 1
            else:
                node, slots = choice
                cluster.place(node, cpu, memory, shape, slots)
                used_sum += int(request[j])
            arrived[e], used[e], frag_total[e] = arrived_sum, used_sum, cluster.frag.sum()
        return RunResult(
            arrived=arrived,
            used=used,
            frag=frag_total,
            failed=failed,
            total_gpus=self.nodes.total_gpus,
            seconds=time.perf_counter() - started,
            decisions=n,
        )


def random_chooser(rng: np.random.Generator, priority: IntArray) -> Chooser:
    """The Random plugin: a uniform feasible node, then a uniform fitting GPU (sharing pods)."""
    del priority

    def decide(cluster: Cluster, rows: IntArray, shape: Shape, pod: int) -> tuple[int, IntArray]:
        node = int(rows[rng.integers(rows.size)])
        free = cluster.gpu[node]
        if not shape.wants_gpu:
            return node, np.array([-1], dtype=np.int64)
        if shape.sharing:
            fitting = np.flatnonzero(free >= shape.milli)
            return node, fitting[rng.integers(fitting.size)][None]
        return node, np.flatnonzero(free == MILLI)[: shape.num]

    return decide


def binned(result: RunResult, bins: int = 130) -> tuple[FloatArray, FloatArray]:
    """Allocation % and frag % of capacity per arrived % bin 0..bins (simulator's analysis).

    Events are grouped by round(arrived / 1 % of capacity) and averaged; an empty bin takes the
    events of the bins within ±1.
    """
    unit = result.total_gpus * MILLI / 100
    pct = np.floor(result.arrived / unit + 0.5).astype(np.int64)
    alloc = result.used / unit
    fragp = result.frag / unit
    out_a = np.full(bins + 1, np.nan)
    out_f = np.full(bins + 1, np.nan)
    for b in range(bins + 1):
        sel = pct == b
        if not sel.any():
            sel = np.abs(pct - b) <= 1
        if sel.any():
            out_a[b] = alloc[sel].mean()
            out_f[b] = fragp[sel].mean()
    return out_a, out_f


def unallocated_at(result: RunResult, arrived_pct: int = 100) -> float:
    """100 − allocation % at the given arrived % (the paper's headline metric)."""
    alloc, _ = binned(result)
    return float(100.0 - alloc[arrived_pct])
