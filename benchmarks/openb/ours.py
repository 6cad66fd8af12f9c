"""Our policy in the replay, through the extender's own verdict functions.

Each GPU of the trace becomes a GPU of 1000 one-MiB blocks, so a pod's ``gpu_milli`` is its
block request; a whole-GPU pod asks for ``num_gpu`` whole GPUs. Telemetry is the same on every
GPU (the replay has no temperatures), so thermal, power and health do not tell nodes apart.
kube-scheduler's own CPU and memory fit and the pod's GPU model constraint are the replay's
filter; the extender filters on GPUs (``gpu_verdict``), scores (``finish``) and chooses the
GPUs bind gives (``GpuVerdict.gpus``).

Two modes: ``ideal`` picks by the full-precision score, as filter does when it answers the best
node (``--filter-answer best``); ``protocol`` by the integer 0..10 points /prioritize answers
(``--filter-answer all``, kube-scheduler's own scorers left out). Ties as the replay breaks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import yaml

from benchmarks.openb.replay import Chooser, Cluster, pick
from benchmarks.openb.trace import MAX_GPUS, MILLI, Pods, Shape
from scheduler_extender.domain import Health, PodDemand, QosClass
from scheduler_extender.policy.batch import NodeBatch
from scheduler_extender.policy.combine import finish, prioritize_points
from scheduler_extender.policy.document import Policy, parse_policy
from scheduler_extender.policy.rules.fragmentation import DemandMix, MixLearner
from scheduler_extender.policy.verdict import gpu_facts, gpu_verdict, host_verdict
from scheduler_extender.state.verdicts import DemandKey, demand_key
from scheduler_extender.telemetry.fields import KEPT

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

POLICY_FILE = Path(__file__).with_name("policy.yaml")
BLOCK_MIB = 256
"""policy.yaml's blockMiB: a GPU of ``MILLI`` blocks has ``MILLI * BLOCK_MIB`` MiB."""
"""The GPUSchedulingPolicy the replay runs (one MiB per block so milli-GPU maps exactly)."""
NOW = 1_000.0


def load_policy(path: Path = POLICY_FILE) -> Policy:
    """The replay's policy document."""
    return parse_policy(yaml.safe_load(path.read_text()))


def demand_of(shape: Shape, qos: QosClass, uid: str, memory_mib: int = 0) -> PodDemand:
    """The extender's view of a pod: blocks on one GPU or whole GPUs, and its host requests."""
    return PodDemand(
        uid=uid,
        namespace="openb",
        name=uid,
        qos=qos,
        mem_blocks=shape.milli if shape.sharing else 0,
        whole_gpus=shape.num if shape.wants_gpu and not shape.sharing else 0,
        cpu_milli=shape.cpu,
        host_memory_mib=memory_mib,
    )


def node_batch(cluster: Cluster, rows: IntArray) -> NodeBatch:
    """What the node agents would report for these rows, plus the extender's allocations."""
    n = rows.size
    present = np.arange(MAX_GPUS)[None, :] < cluster.nodes.gpus[rows][:, None]
    free = cluster.gpu[rows]
    full = (n, MAX_GPUS)
    return NodeBatch(
        known=np.ones(n, dtype=np.bool_),
        age_s=np.zeros(n),
        interval_s=np.full(n, 10.0),
        driver_ok=np.ones(n, dtype=np.bool_),
        present=present,
        health=np.full(full, Health.HEALTHY, dtype=np.int8),
        readings={
            **{name: np.full(full, np.nan) for name in KEPT},
            "temperature_c": np.where(present, 50.0, np.nan),
            "power_w": np.where(present, 100.0, np.nan),
            "power_limit_w": np.where(present, 300.0, np.nan),
            "utilization_pct": np.where(present, 0.0, np.nan),
            "memory_total_mib": np.where(present, float(MILLI * BLOCK_MIB), np.nan),
        },
        unaccounted_used_mib=np.where(present, 0.0, np.nan),
        excluded_until=np.full(full, -np.inf),
        allocated_blocks=np.where(present, MILLI - free, 0).astype(np.int64),
        lent_blocks=np.zeros(full, dtype=np.int64),
        borrowed_blocks=np.zeros(full, dtype=np.int64),
        whole_taken=np.zeros(full, dtype=np.bool_),
        rack=np.full(n, -1, dtype=np.int64),
        rdma=np.zeros(n, dtype=np.bool_),
        host_cpu_free=cluster.cpu[rows].astype(np.float64),
        host_memory_free=cluster.memory[rows].astype(np.float64),
    )


@dataclass(slots=True)
class _Cached:
    version: IntArray
    mix_version: int
    reason: IntArray
    gpu_sum: FloatArray
    gpus: IntArray


class Ours:
    """A replay chooser backed by ``gpu_verdict`` and ``finish`` with a learned shape mix.

    CPU-only pods are scored by ``host_verdict``: the extender configured for every pod (no
    ``managedResources``) sees them too. With ``gpu_pods_only`` they score 0 everywhere, as
    with the default scheduler configuration that sends the extender GPU pods only.
    """

    def __init__(
        self,
        pods: Pods,
        policy: Policy,
        mode: str,
        qos_aware: bool = False,
        gpu_pods_only: bool = False,
    ) -> None:
        if mode not in ("protocol", "ideal"):
            raise ValueError(f"mode must be protocol or ideal, not {mode!r}")
        self.pods = pods
        self.policy = policy
        self.mode = mode
        self.qos_aware = qos_aware
        self.gpu_pods_only = gpu_pods_only
        self.seconds = 0.0
        self.calls = 0

    def chooser(self, rng: np.random.Generator, priority: IntArray) -> Chooser:
        """A fresh decision function for one run (its own learner and verdict cache)."""
        del rng
        learner = MixLearner(self.policy.spec.fragmentation)
        cache: dict[DemandKey, _Cached] = {}
        default = self.policy.spec.qos.default_class

        def decide(
            cluster: Cluster, rows: IntArray, shape: Shape, pod: int
        ) -> tuple[int, IntArray] | None:
            qos = self.pods.qos[pod] if self.qos_aware else default
            demand = demand_of(shape, qos, f"p{pod}", int(self.pods.memory[pod]))
            if not demand.wants_gpu and self.gpu_pods_only:
                # kube-scheduler asks the extender about GPU pods only; the rest score 0.
                return pick(np.zeros(rows.size), rows, priority), np.array([-1])
            learner.observe(demand)
            key = demand_key(demand)
            mix: DemandMix = learner.mix
            entry = cache.get(key)
            size = cluster.nodes.size
            if entry is None or entry.mix_version != mix.version:
                k = max(demand.gpu_count, 1)
                entry = _Cached(
                    version=np.full(size, -1, dtype=np.int64),
                    mix_version=mix.version,
                    reason=np.zeros(size, dtype=np.int64),
                    gpu_sum=np.zeros(size),
                    gpus=np.full((size, k), -1, dtype=np.int64),
                )
                cache[key] = entry
            todo = rows[entry.version[rows] != cluster.version[rows]]
            if todo.size:
                facts = gpu_facts(node_batch(cluster, todo), self.policy)
                if demand.wants_gpu:
                    verdict = gpu_verdict(facts, demand, self.policy, NOW, mix)
                    entry.reason[todo] = verdict.reason
                    entry.gpu_sum[todo] = verdict.gpu_sum
                    entry.gpus[todo] = verdict.gpus
                else:
                    entry.gpu_sum[todo] = host_verdict(facts, demand, self.policy, mix)
                entry.version[todo] = cluster.version[todo]
            n = rows.size
            if demand.wants_gpu:
                passed, _, score, points = finish(
                    entry.reason[rows],
                    entry.gpu_sum[rows],
                    np.ones(n, dtype=np.bool_),
                    np.zeros(n, dtype=np.bool_),
                    np.zeros(n),
                    demand,
                    self.policy,
                )
            else:
                passed = np.ones(n, dtype=np.bool_)
                score = entry.gpu_sum[rows]
                points = None
            if not passed.any():
                return None
            # What /prioritize answers for the nodes that passed.
            points = prioritize_points(score, passed, self.policy, points)
            ok = rows[passed]
            by = points[passed].astype(np.float64) if self.mode == "protocol" else score[passed]
            node = pick(by, ok, priority)
            return node, entry.gpus[node]

        return decide
