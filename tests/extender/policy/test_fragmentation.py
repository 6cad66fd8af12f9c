"""Fragmentation scoring: the fragment measure, the learned shape mix, and the verdict it drives."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_extender.domain import PodDemand, QosClass
from scheduler_extender.policy.document import parse_policy
from scheduler_extender.policy.fragmentation import (
    DemandMix,
    FragmentationArgs,
    MixLearner,
    amount,
    score,
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


def mix(blocks, whole, freq) -> DemandMix:
    return DemandMix(np.array(blocks), np.array(whole), np.array(freq, dtype=float), version=1)


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
