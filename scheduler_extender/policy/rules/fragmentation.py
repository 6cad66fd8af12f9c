"""Fragmentation rule: place a pod where it leaves the least idle GPU that future pods cannot use.

A node's *fragment* with respect to a demand shape m (b_m blocks on one GPU, or k_m whole GPUs)
is the idle GPU it could not give m: every free block of the node if m fits nowhere on it, else
only the free blocks on GPUs too small for m (for whole-GPU shapes: every partly used GPU).
Weighted by how often each shape is asked for, F = Σ_m p_m · frag_m, in GPUs. A candidate
placement scores σ((F_before − F_after) / scale): the more fragment it removes (or the less it
adds), the better. This is the measure of Weng et al., "Beware of Fragmentation" (USENIX ATC
'23): a node whose free host CPU is below a shape's CPU request cannot give it any GPU either.

On top of it, ours: idle GPU *stranded* by the host. A node keeps a free GPU usable only while it
keeps the CPU and memory that pods bring with each GPU. With the cluster's learned demand of c
CPU and m memory per GPU (CPU-only pods included), a node with f free GPUs, C free CPU and M free
memory can still give out min(f, C / (s·c), M / (s·m)) GPUs (s = ``hostShare``); the rest is
stranded. The score adds ``hostWeight`` × stranded GPUs to the fragment, so a pod that eats a
node's host room out of proportion to its GPUs scores low there, and a CPU-only pod is sent
where it strands no GPU. Nodes whose host room is unknown (NaN) count by their GPUs alone.

The shape mix is learned online from the requests the extender is asked about
(``MixLearner``); its snapshot changes every ``refreshEvery`` requests so that cached
verdicts stay valid in between.

Pure; imports only numpy, pydantic, ``domain`` and ``policy.base``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import Field

from scheduler_extender.domain import PodDemand
from scheduler_extender.policy.base import ArgsModel, Section

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


K = TypeVar("K", bound=Hashable)


def commonest(counts: Counter[K], coverage: float) -> list[tuple[K, int]]:
    """The most common keys (ties: smaller key first) until they cover ``coverage`` of all."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    need = coverage * sum(counts.values())
    taken: list[tuple[K, int]] = []
    covered = 0
    for key, count in ranked:
        if covered >= need:
            break
        taken.append((key, count))
        covered += count
    return taken


class FragmentationArgs(ArgsModel):
    """``spec.fragmentation`` (ours)."""

    enabled: bool = Field(
        False,
        description="Score memoryFit by the fragmentation a placement leaves instead of best fit.",
    )
    window: int = Field(
        5000, gt=0, description="How many recent GPU requests the shape mix is learned from."
    )
    coverage: float = Field(
        0.95,
        gt=0,
        le=1,
        description="The most common shapes that cover this share of requests form the mix.",
    )
    refresh_every: int = Field(
        200,
        alias="refreshEvery",
        gt=0,
        description="Requests between two snapshots of the mix (cached verdicts last that long).",
    )
    scale_gpus: float = Field(
        1.0,
        alias="scaleGPUs",
        gt=0,
        description="Fragment change (GPUs) that moves the score from 0.5 to 0.73.",
    )
    host_weight: float = Field(
        0.5,
        alias="hostWeight",
        ge=0,
        description="Weight of idle GPUs stranded by too little free host CPU or memory.",
    )
    host_share: float = Field(
        0.8,
        alias="hostShare",
        gt=0,
        description="Share of the learned CPU and memory per GPU a free GPU needs to count usable.",
    )


SECTION = Section(
    "fragmentation",
    FragmentationArgs,
    "Score placements by the GPU fragmentation they leave (FGD).",
)


@dataclass(frozen=True, slots=True)
class HostDemand:
    """Host requests of a window of pods against their GPU requests (CPU-only pods count).

    GPU requests are split in whole GPUs and blocks, because how many blocks make a GPU
    depends on the node: per GPU of ``b`` blocks, the demand is ``cpu / (whole + blocks / b)``.
    """

    cpu_milli: float = 0.0
    memory_mib: float = 0.0
    whole: float = 0.0
    blocks: float = 0.0

    def per_gpu(self, capacity: FloatArray) -> tuple[FloatArray, FloatArray]:
        """(CPU, memory) asked per GPU on nodes whose GPUs hold ``capacity`` blocks; NaN if none."""
        with np.errstate(divide="ignore", invalid="ignore"):
            gpus = self.whole + np.where(capacity > 0, self.blocks / capacity, np.nan)
            ok = gpus > 0
            cpu = np.where(ok, self.cpu_milli / gpus, np.nan)
            mem = np.where(ok, self.memory_mib / gpus, np.nan)
        return cpu, mem


@dataclass(frozen=True, slots=True)
class DemandMix:
    """Shapes asked for and their frequencies (sum 1); ``version`` changes with every snapshot."""

    blocks: IntArray
    """Blocks on one GPU for a shared shape; 0 for a whole-GPU shape."""
    whole: IntArray
    """Whole GPUs for a whole-GPU shape; 0 for a shared one."""
    cpu: IntArray
    """Host CPU (millicores) of each shape."""
    freq: FloatArray
    version: int
    host: HostDemand = dataclasses.field(default_factory=lambda: HostDemand())
    """Host CPU and memory asked for per GPU, over every pod of the window."""

    @property
    def empty(self) -> bool:
        """No shape learned yet."""
        return self.freq.size == 0


EMPTY_MIX = DemandMix(
    blocks=np.zeros(0, dtype=np.int64),
    whole=np.zeros(0, dtype=np.int64),
    cpu=np.zeros(0, dtype=np.int64),
    freq=np.zeros(0),
    version=0,
)


def demand_shape(demand: PodDemand) -> tuple[int, int, int]:
    """(blocks, whole GPUs, host CPU) of a demand; a whole-GPU demand has no block count."""
    if demand.needs_whole_gpu:
        return 0, demand.gpu_count, demand.cpu_milli
    return demand.mem_blocks, 0, demand.cpu_milli


class MixLearner:
    """Counts the shapes of the last ``window`` requests; snapshots them now and then.

    Shapes are learned from GPU requests; the host demand per GPU from every request.
    """

    def __init__(self, args: FragmentationArgs) -> None:
        self.args = args
        self._recent: deque[tuple[int, int, int]] = deque(maxlen=args.window)
        self._host: deque[tuple[int, int, int, int]] = deque(maxlen=args.window)
        self._since = 0
        self._mix = EMPTY_MIX

    @property
    def mix(self) -> DemandMix:
        """The snapshot in force."""
        return self._mix

    def observe(self, demand: PodDemand) -> None:
        """Count one pod's request; the caller counts each pod once (``remember_demand``)."""
        blocks, whole, cpu = demand_shape(demand)
        self._host.append((cpu, demand.host_memory_mib, whole, blocks))
        if not demand.wants_gpu:
            return
        self._recent.append((blocks, whole, cpu))
        self._since += 1
        if self._mix.empty or self._since >= self.args.refresh_every:
            self._mix = self.snapshot()
            self._since = 0

    def snapshot(self) -> DemandMix:
        """The most common shapes covering ``coverage`` of the window, renormalised."""
        taken = commonest(Counter(self._recent), self.args.coverage)
        freq = np.array([c for _, c in taken], dtype=np.float64)
        sums = np.array(self._host, dtype=np.float64).reshape(-1, 4).sum(axis=0)
        return DemandMix(
            blocks=np.array([s[0] for s, _ in taken], dtype=np.int64),
            whole=np.array([s[1] for s, _ in taken], dtype=np.int64),
            cpu=np.array([s[2] for s, _ in taken], dtype=np.int64),
            freq=freq / freq.sum() if freq.size else freq,
            version=self._mix.version + 1,
            host=HostDemand(*map(float, sums)),
        )


@dataclass(frozen=True, slots=True)
class HostRoom:
    """Free host CPU (millicores) and memory (MiB) per node, (N,); NaN where unknown."""

    cpu: FloatArray
    memory: FloatArray

    def minus(self, cpu: int, memory: int) -> HostRoom:
        """The room left after a pod takes its requests."""
        return HostRoom(self.cpu - cpu, self.memory - memory)


def amount(
    free: IntArray,
    idle: BoolArray,
    capacity: IntArray,
    mix: DemandMix,
    host_cpu: FloatArray | None = None,
) -> FloatArray:
    """Fragment (GPUs) of node states: free blocks (..., G), idle GPUs (..., G), capacity (..., G).

    ``host_cpu`` (...) is each state's free host CPU: a shape asking for more CPU fits nowhere
    on that node. NaN (unknown) lets every shape through. A slot without a GPU has capacity 0
    and adds nothing.
    """
    return _amount(free, idle, _share(free, capacity), mix, host_cpu)


def _share(free: IntArray, capacity: IntArray) -> FloatArray:
    """Free room of each GPU slot as a share of the GPU (a slot without a GPU: 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out: FloatArray = np.where(capacity > 0, free / capacity, 0.0)
    return out


def _amount(
    free: IntArray,
    idle: BoolArray,
    share: FloatArray,
    mix: DemandMix,
    host_cpu: FloatArray | None,
) -> FloatArray:
    """``amount`` with each slot's free share (``_share``) already worked out."""
    total = share.sum(axis=-1)  # (...)
    # F = Σ_m p_m · (total − [m fits] · share of the GPUs big enough for m)
    shared = mix.whole == 0
    blocks, freq_s, freq_w = mix.blocks[shared], mix.freq[shared], mix.freq[~shared]
    big = free[..., None, :] >= blocks[:, None]  # (..., Ms, G)
    hosts = big.any(axis=-1)  # (..., Ms)
    fits_whole = idle.sum(axis=-1)[..., None] >= mix.whole[~shared]  # (..., Mw)
    if host_cpu is not None:  # NaN compares False: unknown room fits
        cpu = host_cpu[..., None]
        hosts &= ~(cpu < mix.cpu[shared])
        fits_whole &= ~(cpu < mix.cpu[~shared])
    usable = (big @ share[..., :, None])[..., 0]  # (..., Ms)
    idle_share = np.where(idle, share, 0.0).sum(axis=-1)  # (...)
    out: FloatArray = (
        total * mix.freq.sum()
        - np.where(hosts, usable, 0.0) @ freq_s
        - (fits_whole @ freq_w) * idle_share
    )
    return out


def stranded(
    total: FloatArray, room: HostRoom, per_gpu: tuple[FloatArray, FloatArray], share: float
) -> FloatArray:
    """Free GPUs (``total``, (...)) a node cannot give out for lack of host CPU or memory.

    ``per_gpu`` is the demand per GPU on each node, broadcastable to ``total``; NaN room or
    demand does not limit.
    """
    cpu, mem = per_gpu
    with np.errstate(divide="ignore", invalid="ignore"):
        by_cpu = np.maximum(room.cpu, 0.0) / (share * cpu)
        by_mem = np.maximum(room.memory, 0.0) / (share * mem)
    usable = np.fmin(total, np.fmin(by_cpu, by_mem))
    out: FloatArray = total - usable
    return out


def sigmoid(x: FloatArray) -> FloatArray:
    """The logistic function."""
    out: FloatArray = 1.0 / (1.0 + np.exp(-x))
    return out


def _fragment(
    free: IntArray,
    idle: BoolArray,
    capacity: IntArray,
    mix: DemandMix,
    room: HostRoom,
    per_gpu: tuple[FloatArray, FloatArray],
    args: FragmentationArgs,
) -> FloatArray:
    """Fragment plus weighted stranded GPUs of node states (..., G) with host room (...)."""
    share = _share(free, capacity)
    out = _amount(free, idle, share, mix, room.cpu)
    if args.host_weight > 0:
        total = share.sum(axis=-1)
        out = out + args.host_weight * stranded(total, room, per_gpu, args.host_share)
    return out


def _node_capacity(capacity: IntArray) -> FloatArray:
    """Blocks per GPU of each node (its largest GPU; 0 without GPUs)."""
    out: FloatArray = capacity.max(axis=-1, initial=0).astype(np.float64)
    return out


def host_score(
    free: IntArray,
    idle: BoolArray,
    capacity: IntArray,
    room: HostRoom,
    demand: PodDemand,
    mix: DemandMix,
    args: FragmentationArgs,
) -> FloatArray:
    """Per node (N,): σ(fragment removed / scale) for a pod that takes host room only."""
    per_gpu = mix.host.per_gpu(_node_capacity(capacity))
    before = _fragment(free, idle, capacity, mix, room, per_gpu, args)
    left = room.minus(demand.cpu_milli, demand.host_memory_mib)
    after = _fragment(free, idle, capacity, mix, left, per_gpu, args)
    return sigmoid((before - after) / args.scale_gpus)


def score(
    free: IntArray,
    idle: BoolArray,
    capacity: IntArray,
    usable: BoolArray,
    demand: PodDemand,
    mix: DemandMix,
    args: FragmentationArgs,
    room: HostRoom | None = None,
) -> FloatArray:
    """Per GPU slot (N, G): σ(fragment removed / scale) if the pod takes this slot.

    A shared demand takes its blocks from that one slot. A whole-GPU demand takes ``gpu_count``
    idle GPUs and every idle GPU is alike, so all usable slots of a node score the same.
    Either also takes its host CPU and memory from the node's ``room`` (unknown if None).
    Slots that are not ``usable`` score 0.
    """
    n, g = free.shape
    if room is None:
        room = HostRoom(np.full(n, np.nan), np.full(n, np.nan))
    per_gpu = mix.host.per_gpu(_node_capacity(capacity))
    before = _fragment(free, idle, capacity, mix, room, per_gpu, args)  # (N,)
    left = room.minus(demand.cpu_milli, demand.host_memory_mib)
    if demand.needs_whole_gpu:
        k = demand.gpu_count
        # Take the first k usable idle slots: which ones does not change the fragment.
        rank = np.cumsum(usable & idle, axis=1)
        taken = usable & idle & (rank <= k)
        after = _fragment(
            np.where(taken, 0, free), idle & ~taken, capacity, mix, left, per_gpu, args
        )
        delta = np.broadcast_to((before - after)[:, None], (n, g))
    else:
        eye = np.eye(g, dtype=np.bool_)
        taken = np.broadcast_to(eye[None], (n, g, g))  # (N, slot taken, G)
        free_after = np.where(taken, free[:, None, :] - demand.mem_blocks, free[:, None, :])
        idle_after = idle[:, None, :] & ~taken
        each = HostRoom(
            np.broadcast_to(left.cpu[:, None], (n, g)),
            np.broadcast_to(left.memory[:, None], (n, g)),
        )
        after = _fragment(
            np.maximum(free_after, 0),
            idle_after,
            np.broadcast_to(capacity[:, None, :], taken.shape),
            mix,
            each,
            (per_gpu[0][:, None], per_gpu[1][:, None]),
            args,
        )  # (N, G)
        delta = before[:, None] - after
    out: FloatArray = np.where(usable, sigmoid(delta / args.scale_gpus), 0.0)
    return out
