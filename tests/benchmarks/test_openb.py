"""The OpenB replay: loader, frag measure, baseline scores (hand-computed cases), replay loop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.openb import frag, policies, replay, trace
from benchmarks.openb.trace import Shape, TypicalPods

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


@pytest.fixture
def nodes(tmp_path: Path) -> trace.Nodes:
    return trace.load_nodes(
        write(
            tmp_path,
            "nodes.csv",
            "sn,cpu_milli,memory_mib,gpu,model\nn-b,32000,65536,2,T4\nn-a,64000,131072,4,V100M16\n",
        )
    )


@pytest.fixture
def pods(tmp_path: Path) -> trace.Pods:
    return trace.load_pods(
        write(
            tmp_path,
            "pods.csv",
            POD_HEADER
            + "p-2,4000,1024,1,500,,LS,Running,0,1,0\n"
            + "p-1,8000,2048,2,1000,V100M16|A10,BE,Running,0,1,0\n"
            + "p-3,2000,512,0,0,,Guaranteed,Running,0,1,0\n"
            + "p-4,4000,1024,1,500,,Burstable,Running,0,1,0\n",
        )
    )


def test_loader_sorts_by_name_and_maps_specs_and_classes(nodes, pods):
    assert nodes.names == ("n-a", "n-b")
    assert nodes.models == ("T4", "V100M16")
    assert nodes.gpus.tolist() == [4, 2] and nodes.total_gpus == 6
    assert pods.names == ("p-1", "p-2", "p-3", "p-4")
    assert pods.specs[pods.spec[0]] == frozenset({"V100M16", "A10"})
    assert pods.spec[1] == 0 and pods.specs[0] == frozenset()
    assert pods.gpu_request.tolist() == [2000, 500, 0, 500]
    assert [q.wire for q in pods.qos] == ["best-effort", "inference", "training", "best-effort"]
    assert trace.spec_mask(pods, nodes)[pods.spec[0]].tolist() == [True, False]
    assert pods.shape(1) == Shape(cpu=4000, milli=500, num=1, spec=0) and pods.shape(1).sharing


def test_a_missing_file_and_an_unknown_qos_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="OPENB_DATA"):
        trace.load_nodes(tmp_path / "absent.csv")
    bad = write(tmp_path, "bad.csv", POD_HEADER + "p,1,1,1,100,,Gold,Running,0,1,0\n")
    with pytest.raises(ValueError, match="Gold"):
        trace.load_pods(bad)


def test_typical_pods_take_the_commonest_shapes_until_the_threshold(pods):
    typ = trace.typical_pods(pods, threshold=0.5)
    assert typ.shapes == (pods.shape(1),)  # 2 of 4 pods share that shape: 50 %
    assert typ.freq.tolist() == [1.0]
    full = trace.typical_pods(pods, threshold=1.0)
    assert len(full.shapes) == 3 and full.freq.tolist() == [0.5, 0.25, 0.25]


def test_workload_tops_up_to_130_percent_with_clones(pods):
    order = trace.workload(pods, total_gpus=6, rng=np.random.default_rng(0))
    assert sorted(order[: pods.size].tolist()) == [0, 1, 2, 3]
    total = int(pods.gpu_request[order].sum())
    assert total <= 1.3 * 6000 + 2000 and total + 1000 > 1.3 * 6000 - 2000


def _model(shapes: list[Shape], freq: list[float], access: list[list[bool]] | None = None):
    return frag.FragModel(
        cpu=np.array([s.cpu for s in shapes]),
        milli=np.array([s.milli for s in shapes]),
        num=np.array([s.num for s in shapes]),
        freq=np.array(freq),
        access=np.array(access if access else [[True] * len(shapes)]),
    )


def test_frag_measure_hand_cases():
    share = Shape(cpu=4000, milli=500, num=1, spec=0)
    two = Shape(cpu=4000, milli=1000, num=2, spec=0)
    cpu_only = Shape(cpu=1000, milli=0, num=0, spec=0)
    fm = _model([share, two, cpu_only], [0.5, 0.25, 0.25])
    gpu = np.array([[300, 1000, 600, 0]])
    model = np.array([0])
    # share fits (600 and 1000 ≥ 500): only 300 is fragment; two whole GPUs: no → 1900;
    # CPU-only: all 1900.  0.5·300 + 0.25·1900 + 0.25·1900 = 1100
    assert frag.amount(np.array([8000]), gpu, model, fm)[0] == pytest.approx(1100)
    # Without CPU for the sharing pod every idle milli-GPU is fragment for it.
    assert frag.amount(np.array([2000]), gpu, model, fm)[0] == pytest.approx(1900)
    # A model the pods may not use: everything is fragment.
    blocked = _model([share], [1.0], access=[[False]])
    assert frag.amount(np.array([8000]), gpu, model, blocked)[0] == pytest.approx(1900)
    # Two free GPUs host the 2-GPU pod: the partly used ones are its fragment.
    gpu2 = np.array([[1000, 1000, 200, 0]])
    only_two = _model([two], [1.0])
    assert frag.amount(np.array([8000]), gpu2, model, only_two)[0] == pytest.approx(200)


def view(cpu, gpu, gpus=None, tags=None, fm=None):
    gpu = np.array(gpu)
    n = gpu.shape[0]
    cpu = np.array(cpu)
    model = np.zeros(n, dtype=np.int64)
    return policies.View(
        cpu=cpu,
        gpu=gpu,
        model=model,
        gpus=np.array(gpus if gpus else [int((r > 0).sum()) for r in gpu]),
        frag=frag.amount(cpu, gpu, model, fm) if fm is not None else np.zeros(n),
        tags=np.array(tags) if tags else np.zeros((n, policies.TAGS), dtype=np.int64),
    )


SHARE = Shape(cpu=8000, milli=400, num=1, spec=0)
ONE = Shape(cpu=8000, milli=1000, num=1, spec=0)


def test_least_free_picks_the_fullest_fitting_gpu_and_lowest_index_free_gpus():
    gpu = np.array([[1000, 500, 450, 300]])
    assert policies.least_free(gpu, SHARE).tolist() == [[2]]
    assert policies.least_free(
        np.array([[0, 1000, 1000, 1000]]), Shape(1, 1000, 2, 0)
    ).tolist() == [[1, 2]]


def test_dotprod_prefers_the_smallest_dot_product():
    v = view([64000, 16000], [[1000, 1000], [1000, 500]])
    score, _ = policies.DotProd().score(v, SHARE)
    # node 0: 0.5·0.0625 + 0.25·0.05 = 0.04375 → ⌊100·(1 − 0.021875)⌋ = 97
    # node 1: 0.125·0.0625 + 0.1875·0.05 = 0.0171875 → ⌊100·0.99140625⌋ = 99
    assert score.tolist() == [97.0, 99.0]


def test_bestfit_raw_score_and_integer_min_max_rescale():
    v = view([64000, 16000], [[1000, 1000], [1000, 500]])
    score, slots = policies.BestFit().score(v, SHARE)
    # node 0: 0.5·56000/128000 + 0.5·1600/8000 = 0.31875 → 68; node 1: 0.03125 + 0.06875 → 90
    assert score.tolist() == [68.0, 90.0]
    assert slots.tolist() == [[0], [1]]
    assert policies.BestFit().normalize(np.array([68.0, 90.0, 79.0])).tolist() == [0, 100, 50]
    assert policies.BestFit().normalize(np.array([5.0, 5.0])).tolist() == [0, 0]


def test_packing_tiers():
    v = view(
        [64000] * 3,
        [[1000, 1000, 0, 0], [1000, 500, 0, 0], [1000, 1000, 1000, 1000]],
        gpus=[4, 2, 4],
    )
    # node 0: 2 of 4 GPUs in use, must use a free GPU → tier 2: max(50 − 1, 33) = 49
    # node 1: shared GPU with 500 free fits → tier 1: 100 − ⌊50/10⌋ = 95
    # node 2: every GPU free → tier 3: max(33 − 4, 4) = 29
    score, _ = policies.GpuPacking().score(v, SHARE)
    assert score.tolist() == [49.0, 95.0, 29.0]
    zero, _ = policies.GpuPacking().score(v, Shape(1000, 0, 0, 0))
    assert zero.tolist() == [0.0, 0.0, 0.0]


def test_clustering_tiers():
    tags = np.zeros((4, policies.TAGS), dtype=np.int64)
    tags[0, 0] = 2  # only sharing pods
    tags[1, [0, 1]] = 1  # sharing and one-GPU pods
    tags[3, 1] = 1  # only one-GPU pods
    v = view(
        [64000] * 4,
        [[600, 1000], [200, 0], [1000, 1000], [0, 1000]],
        gpus=[2] * 4,
        tags=tags.tolist(),
    )
    score, _ = policies.GpuClustering().score(v, SHARE)
    # base 75 / 50 / 25 / 0 plus ⌊25·(8000 − free)/8000⌋: 20, 24, 18, 21
    assert score.tolist() == [95.0, 74.0, 43.0, 21.0]


def test_fgd_places_a_sharing_pod_where_the_frag_grows_least():
    typ = _model([SHARE], [1.0])
    v = view([64000], [[1000, 400, 0, 0]], gpus=[2], fm=typ)
    score, slot = policies.Fgd(typ).score(v, SHARE)
    # On GPU 1 (400 free) the pod fills it: frag 0 → 0, score ⌊100·σ(0)⌋ = 50; on GPU 0 it
    # leaves 600 (still hosts a 400) and 400: frag stays 0 as well; ties go to the lowest
    # index, GPU 0 — unless GPU 1 scores higher. Both are 50 here.
    assert score.tolist() == [50.0] and slot.tolist() == [[0]]
    typ2 = _model([Shape(8000, 700, 1, 0)], [1.0])
    v2 = view([64000], [[1000, 400, 0, 0]], gpus=[2], fm=typ2)
    score2, slot2 = policies.Fgd(typ2).score(v2, SHARE)
    # Frag before: 400 (too small for 700). GPU 1 → 0 left: frag 0 (Δ +400, σ(0.4) → 59);
    # GPU 0 → 600 and 400 left, nothing hosts 700: frag 1000 (Δ −600 → 35).
    assert slot2.tolist() == [[1]] and score2.tolist() == [59.0]


def test_replay_places_everything_on_a_roomy_cluster_and_bins_the_metric(nodes, pods):
    typ = trace.typical_pods(pods)
    fm = frag.FragModel.build(typ, pods, nodes)
    rp = replay.Replay(nodes, pods, fm)
    for scorer in (policies.BestFit(), policies.Fgd(fm), policies.GpuPacking()):
        result = rp.run(1, scorer=scorer)
        assert result.decisions == result.arrived.size
        assert (np.diff(result.arrived) >= 0).all() and (result.used <= result.arrived).all()
    rnd = rp.run(1, chooser=replay.random_chooser)
    assert rnd.used[-1] <= 6000
    alloc, _ = replay.binned(rnd)
    assert np.nanmax(alloc) <= 100.0


def test_binning_uses_neighbours_for_an_empty_bin():
    result = replay.RunResult(
        arrived=np.array([990, 1010, 1030]),
        used=np.array([990, 1010, 1010]),
        frag=np.zeros(3),
        failed=1,
        total_gpus=1,
        seconds=0.0,
        decisions=3,
    )
    alloc, _ = replay.binned(result)
    # 99 %, 101 % and 103 % hold events; 100 % is empty and takes the events of 99..101
    assert alloc[99] == pytest.approx(99.0) and alloc[100] == pytest.approx(100.0)


def test_typical_pods_types(pods):
    assert isinstance(trace.typical_pods(pods), TypicalPods)


def test_a_pod_list_without_gpu_spec_and_qos_accepts_any_model_as_ls(tmp_path):
    path = write(
        tmp_path, "m.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,8,1000\n"
    )
    pods = trace.load_pods(path)
    assert pods.spec.tolist() == [0] and [q.wire for q in pods.qos] == ["inference"]
