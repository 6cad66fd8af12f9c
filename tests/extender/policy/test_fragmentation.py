"""Fragmentation scoring: the fragment measure, the learned shape mix, and the verdict it drives."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_extender.domain import PodDemand, QosClass
from scheduler_extender.policy.document import parse_policy
from scheduler_extender.policy.rules.fragmentation import (
    DemandMix,
    FragmentationArgs,
    HostDemand,
    HostRoom,
    MixLearner,
    amount,
    host_score,
    score,
    stranded,
)


def demand(blocks: int = 0, whole: int = 0, uid: str = "p") -> PodDemand:
    return PodDemand(
        uid=uid,
        namespace="d",
        name=uid,
        qos=QosClass.INFERENCE,
        mem_blocks=blocks,
        whole_gpus=whole,
    )


def mix(blocks, whole, freq, cpu=None, host=None) -> DemandMix:
    return DemandMix(
        np.array(blocks),
        np.array(whole),
        np.array(cpu if cpu is not None else [0] * len(blocks)),
        np.array(freq, dtype=float),
        version=1,
        host=host or HostDemand(),
    )


CAP = np.array([[10, 10, 10, 0]])


def test_fragment_amount_hand_cases():
    free = np.array([[3, 10, 6, 0]])
    idle = np.array([[False, True, False, False]])
    # A 5-block shape fits (10 and 6 free): only the GPU with 3 free is fragment: 0.3 GPU.
    assert amount(free, idle, CAP, mix([5], [0], [1.0]))[0] == pytest.approx(0.3)
    # Two whole GPUs: only one idle GPU → every free block is fragment: 1.9 GPU.
    assert amount(free, idle, CAP, mix([0], [2], [1.0]))[0] == pytest.approx(1.9)
    # One whole GPU fits: the partly used GPUs are fragment: 0.9 GPU. Mixed 50/50 with 2 GPUs.
    assert amount(free, idle, CAP, mix([0, 0], [1, 2], [0.5, 0.5]))[0] == pytest.approx(1.4)


def test_score_prefers_the_gpu_the_request_fills():
    free = np.array([[10, 4, 7, 0]])
    idle = np.array([[True, False, False, False]])
    usable = free >= 4
    m = mix([4, 7], [0, 0], [0.5, 0.5])
    s = score(free, idle, CAP, usable, demand(blocks=4), m, FragmentationArgs())
    assert s.shape == (1, 4) and s[0, 3] == 0.0
    # Filling the GPU with 4 free removes 0.4·(fragment for the 7-block shape): the best slot.
    assert int(np.argmax(s[0])) == 1
    whole = score(free, idle, CAP, idle, demand(whole=1), m, FragmentationArgs())
    assert whole[0, 0] > 0 and (whole[0, 1:] == 0).all()


def test_mix_learner_counts_shapes_and_snapshots_every_refresh():
    learner = MixLearner(FragmentationArgs(window=10, coverage=0.8, refreshEvery=5))
    assert learner.mix.empty
    learner.observe(demand(blocks=2))
    first = learner.mix
    assert first.blocks.tolist() == [2] and first.version == 1
    for i in range(4):
        learner.observe(demand(whole=1, uid=f"w{i}"))
    assert learner.mix is first  # four requests since the snapshot: not yet refreshed
    learner.observe(demand(whole=1, uid="w4"))
    m = learner.mix
    # 5 whole-GPU requests of 6 cover 0.83 ≥ 0.8: the 2-block shape is left out.
    assert m.version == 2 and m.whole.tolist() == [1] and m.freq.tolist() == [1.0]
    learner.observe(demand())  # no GPU: not counted
    assert learner.mix.version == 2


def test_policy_document_accepts_fragmentation_and_rejects_typos():
    policy = parse_policy({"spec": {"fragmentation": {"enabled": True, "scaleGPUs": 0.5}}})
    assert policy.spec.fragmentation.enabled and policy.spec.fragmentation.scale_gpus == 0.5
    with pytest.raises(Exception, match="scaleGpus"):
        parse_policy({"spec": {"fragmentation": {"scaleGpus": 1}}})


def test_a_node_without_host_cpu_for_a_shape_gives_it_nothing():
    free = np.array([[3, 10, 6, 0], [3, 10, 6, 0], [3, 10, 6, 0]])
    idle = np.array([[False, True, False, False]] * 3)
    cap = np.repeat(CAP, 3, axis=0)
    m = mix([5], [0], [1.0], cpu=[4000])
    # 8 cores free: the shape fits, 0.3 GPU is fragment; 2 cores: all 1.9 free GPU is;
    # unknown room (NaN) counts by GPUs alone.
    got = amount(free, idle, cap, m, np.array([8000.0, 2000.0, np.nan]))
    assert got.tolist() == pytest.approx([0.3, 1.9, 0.3])


def test_stranded_gpus_hand_cases():
    per_gpu = (np.array([10_000.0]), np.array([40_960.0]))  # 10 cores and 40 GiB per GPU
    total = np.array([4.0, 4.0, 4.0, 4.0])
    room = HostRoom(
        cpu=np.array([40_000.0, 20_000.0, 40_000.0, np.nan]),
        memory=np.array([163_840.0, 163_840.0, 40_960.0, np.nan]),
    )
    # Enough of both: nothing stranded. 20 cores feed 2 GPUs: 2 stranded. 40 GiB feeds 1: 3.
    # Unknown room strands nothing.
    assert stranded(total, room, per_gpu, 1.0).tolist() == pytest.approx([0, 2, 3, 0])
    # hostShare 0.5: a GPU needs only half the demand, so 20 cores feed all 4.
    assert stranded(total, room, per_gpu, 0.5)[1] == pytest.approx(0.0)


def test_host_demand_per_gpu_counts_blocks_by_the_nodes_gpu_size():
    host = HostDemand(cpu_milli=30_000, memory_mib=60_000, whole=1, blocks=20)
    cpu, mem = host.per_gpu(np.array([10.0, 20.0, 0.0]))
    # 1 whole + 20 blocks: 3 GPUs of 10 blocks, 2 of 20; a node without GPUs has no demand.
    assert cpu[:2].tolist() == pytest.approx([10_000, 15_000]) and np.isnan(cpu[2])
    assert mem[:2].tolist() == pytest.approx([20_000, 30_000])


def test_learner_counts_host_demand_of_every_pod_and_cpu_in_shapes():
    learner = MixLearner(FragmentationArgs(window=10, refreshEvery=1))
    learner.observe(PodDemand("a", "d", "a", QosClass.INFERENCE, mem_blocks=5, cpu_milli=2000))
    learner.observe(PodDemand("b", "d", "b", QosClass.INFERENCE, cpu_milli=6000))  # CPU only
    learner.observe(
        PodDemand("c", "d", "c", QosClass.INFERENCE, whole_gpus=2, host_memory_mib=4096)
    )
    m = learner.mix
    assert sorted(zip(m.blocks.tolist(), m.whole.tolist(), m.cpu.tolist(), strict=True)) == [
        (0, 2, 0),
        (5, 0, 2000),
    ]
    assert m.host == HostDemand(cpu_milli=8000, memory_mib=4096, whole=2, blocks=5)


def test_score_avoids_stranding_a_nodes_gpus():
    # Two nodes, each one idle GPU of 10 blocks; node 0 has 12 cores left, node 1 has 40.
    free = np.array([[10], [10]])
    idle = np.array([[True], [True]])
    cap = np.array([[10], [10]])
    host = HostDemand(cpu_milli=100_000, whole=10)  # 10 cores asked per GPU
    m = mix([3], [0], [1.0], cpu=[10_000], host=host)
    room = HostRoom(np.array([12_000.0, 40_000.0]), np.array([np.nan, np.nan]))
    args = FragmentationArgs(hostWeight=1.0, hostShare=1.0)
    # A 3-block pod asking 8 cores leaves node 0 with 4 cores for 0.7 GPU: it strands it.
    pod = PodDemand("p", "d", "p", QosClass.INFERENCE, mem_blocks=3, cpu_milli=8000)
    s = score(free, idle, cap, free >= 3, pod, m, args, room)
    assert s[1, 0] > s[0, 0]
    # Without host room the two nodes are alike.
    same = score(free, idle, cap, free >= 3, pod, m, args)
    assert same[0, 0] == pytest.approx(same[1, 0])


def test_a_cpu_only_pod_scores_best_where_it_strands_no_gpu():
    free = np.array([[10, 10], [0, 0], [10, 10]])
    idle = free == 10
    cap = np.full((3, 2), 10)
    host = HostDemand(cpu_milli=40_000, whole=4)  # 10 cores per GPU
    m = mix([0], [1], [1.0], cpu=[10_000], host=host)
    room = HostRoom(np.array([20_000.0, 20_000.0, np.nan]), np.full(3, np.nan))
    pod = PodDemand("c", "d", "c", QosClass.INFERENCE, cpu_milli=16_000)
    s = host_score(free, idle, cap, room, pod, m, FragmentationArgs())
    # Node 0 would keep 4 cores for 2 idle GPUs; node 1's GPUs are all taken (nothing to
    # strand); node 2's room is unknown (nothing known to strand).
    assert s[0] < 0.5 and s[1] == pytest.approx(0.5) and s[2] == pytest.approx(0.5)
