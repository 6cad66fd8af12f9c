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
