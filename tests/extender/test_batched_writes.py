"""Pushes stored together (``ClusterState.ingest_many``, ``NodeTable.write_nodes``).

The rows of a batch are written in one go. Whatever the batch, the state must be exactly what
storing the same pushes one by one leaves.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings, strategies as st

from scheduler_extender.names import RACK_LABEL, RDMA_LABEL
from scheduler_extender.state.cluster import ClusterState
from scheduler_extender.state.columns import GPU_REPORT_COLUMNS
from scheduler_extender.state.table import NodeTable
from scheduler_extender.telemetry.clock import FakeClock
from scheduler_extender.telemetry.decode import report_from
from tests.builders import gpu, report

NODES = [f"n{i}" for i in range(6)]

readings = st.one_of(st.none(), st.floats(0, 100, allow_nan=False))


@st.composite
def gpu_rows(draw: st.DrawFn) -> np.ndarray:
    """One node's GPUs as ``write_node`` takes them: mostly 0..n-1, sometimes gaps."""
    if draw(st.booleans()):
        slots = list(range(draw(st.integers(0, 4))))
    else:
        slots = sorted(draw(st.sets(st.integers(0, 5), max_size=4)))
    rows = [
        (
            i,
            *(
                draw(st.one_of(st.just(np.nan), st.floats(0, 100)))
                for _ in GPU_REPORT_COLUMNS[1:-2]
            ),
            float(draw(st.booleans())),
            float(draw(st.integers(0, 2))),
        )
        for i in slots
    ]
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(GPU_REPORT_COLUMNS))


@st.composite
def node_writes(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A batch of writes, each node at most once, every node with the same GPUs or not."""
    nodes = draw(st.lists(st.sampled_from(NODES), min_size=1, max_size=5, unique=True))
    same = draw(st.booleans())
    shared = draw(gpu_rows())
    return [
        {
            "node": node,
            "received_at": draw(st.floats(0, 1e6)),
            "interval_s": draw(st.floats(0.1, 60)),
            "driver_ok": draw(st.booleans()),
            "rack": draw(st.sampled_from([None, "r1", "r2"])),
            "rdma": draw(st.booleans()),
            "gpus": shared if same else draw(gpu_rows()),
        }
        for node in nodes
    ]


def columns(table: NodeTable) -> dict[str, np.ndarray]:
    names = [
        *("received_at", "interval_s", "known", "driver_ok", "rdma", "rack"),
        *("version", "present", "hot", "health"),
        *GPU_REPORT_COLUMNS[1:-2],
    ]
    return {name: table.column(name).copy() for name in names}


def same_tables(a: NodeTable, b: NodeTable) -> None:
    assert a.names() == b.names()
    assert [a.row(n) for n in NODES] == [b.row(n) for n in NODES]
    assert a.writes == b.writes
    for name, column in columns(a).items():
        np.testing.assert_array_equal(column, columns(b)[name], err_msg=name)


@settings(max_examples=150, deadline=None)
@given(st.lists(node_writes(), min_size=1, max_size=4))
def test_a_batch_of_row_writes_leaves_what_writing_them_one_by_one_does(batches):
    together, one_by_one = NodeTable(rows=2, gpus=2), NodeTable(rows=2, gpus=2)
    for batch in batches:
        together.write_nodes(
            [w["node"] for w in batch],
            received_at=[w["received_at"] for w in batch],
            interval_s=[w["interval_s"] for w in batch],
            driver_ok=[w["driver_ok"] for w in batch],
            racks=[w["rack"] for w in batch],
            rdma=[w["rdma"] for w in batch],
            gpus=np.concatenate([w["gpus"] for w in batch]),
            counts=[len(w["gpus"]) for w in batch],
        )
        for w in batch:
            one_by_one.write_node(
                w["node"], received_at=w["received_at"], interval_s=w["interval_s"],
                driver_ok=w["driver_ok"], rack=w["rack"], rdma=w["rdma"], gpus=w["gpus"],
            )  # fmt: skip
        same_tables(together, one_by_one)


@st.composite
def pushes(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Reports of a few nodes: repeats, stale sequence numbers, hot GPUs, GPU pods."""
    out = []
    for _ in range(draw(st.integers(1, 8))):
        node = draw(st.sampled_from(NODES[:3]))
        gpus = [
            gpu(
                i,
                temperature_c=draw(st.sampled_from([40.0, 70.0, 95.0, None])),
                memory_used_mib=draw(st.sampled_from([0.0, 2048.0])),
                processes=draw(st.sampled_from([[], [{"pid": 7, "pod_uid": "uid-1"}]])),
            )
            for i in range(draw(st.integers(1, 3)))
        ]
        rack = draw(
            st.sampled_from([{}, {RACK_LABEL: "r1"}, {RACK_LABEL: "r2", RDMA_LABEL: "true"}])
        )
        out.append(report(node, gpus, seq=draw(st.integers(1, 6)), labels=rack))
    return out


@settings(max_examples=100, deadline=None)
@given(st.lists(pushes(), min_size=1, max_size=3))
def test_pushes_stored_together_leave_what_storing_them_one_by_one_does(steps):
    clock = FakeClock()
    together, one_by_one = ClusterState(clock), ClusterState(clock)
    for step in steps:
        reports = [report_from(doc) for doc in step]
        assert together.ingest_many(reports) == [one_by_one.ingest(r) for r in reports]
        clock.advance(3.0)
    assert together.table.names() == one_by_one.table.names()
    for name, column in columns(together.table).items():
        if name not in ("version", "rack"):  # a node pushed twice in a step is
            # written once, so versions and the order racks were first seen in may differ
            np.testing.assert_array_equal(column, columns(one_by_one.table)[name], err_msg=name)
    racks = [(t.column("rack") >= 0).tolist() for t in (together.table, one_by_one.table)]
    assert racks[0] == racks[1]
    assert [together.table.rack_name(int(r)) for r in together.table.column("rack") if r >= 0] == [
        one_by_one.table.rack_name(int(r)) for r in one_by_one.table.column("rack") if r >= 0
    ]
    for node in NODES:
        a, b = together.store.get(node), one_by_one.store.get(node)
        assert (a and (a.report, a.thermal)) == (b and (b.report, b.thermal))
