"""The sharing benchmark's arms on a few tasks (the full run is ``make bench-sharing``)."""

import asyncio

from benchmarks.sharing import GPU_MIB, Task, blocks, whole


def _tasks() -> list[Task]:
    sizes = [0.3, 0.45, 0.2, 1.0, 0.5, 0.25]
    return [Task(f"task-{i}", GPU_MIB * f, 1.0, i == 2, seed=i) for i, f in enumerate(sizes)]


def test_blocks_pack_more_tasks_than_whole_gpus_and_see_the_task_over_its_blocks() -> None:
    tasks = _tasks()
    a = whole(tasks)
    assert a["tasks"] == len(tasks) and a["tasks_per_gpu"] == len(tasks) / 64
    b = asyncio.run(blocks(tasks))
    assert b["tasks"] == len(tasks)
    assert b["memory_utilization"] > 0
    assert b["violations"]["seen"] == 1 and b["violations"]["misbehaving"] == 1
    assert b["violations"]["not_misbehaving_but_seen"] == 0


def test_idle_blocks_lent_take_waiting_tasks_as_best_effort_pods() -> None:
    # 64 idle tasks fill every GPU (5 blocks each, 20 % used: 4 blocks idle); 10 more wait.
    owners = [Task(f"owner-{i}", GPU_MIB * 0.85, 0.0, False, seed=i) for i in range(64)]
    extra = [Task(f"extra-{i}", GPU_MIB * 0.3, 0.0, False, seed=100 + i) for i in range(10)]
    b = asyncio.run(blocks(owners + extra))
    c = asyncio.run(blocks(owners + extra, lending=True))
    assert b["tasks"] == c["tasks"] == 64 and b["tasks_per_gpu"] == 1.0
    # Lent after 5 idle minutes: the 10 run for most of the hour, and nobody takes them back.
    assert 1.0 + 10 * 0.8 / 64 < c["tasks_per_gpu"] < 1.0 + 10 / 64
    assert c["memory_utilization"] > b["memory_utilization"]
    assert c["borrowers_evicted"] == 0 and c["gpu_minutes_short"] == 0
