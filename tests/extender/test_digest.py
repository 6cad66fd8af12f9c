"""A push's digest (``scheduler_extender.report``): what the table and ledgers take of a report.

Relayed pushes are stored from the digest the relay made, and their reports are decoded only
when asked for; the state they leave must be the one the decoded report describes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
from hypothesis import given, settings, strategies as st

from scheduler_extender.domain import Health
from scheduler_extender.names import RACK_LABEL
from scheduler_extender.report import DIGEST_COLUMNS, digest, digest_body
from scheduler_extender.state.cluster import ClusterState
from scheduler_extender.telemetry.clock import FakeClock
from scheduler_extender.telemetry.decode import report_from
from scheduler_extender.telemetry.store import Received
from tests.builders import gpu, report

readings = st.one_of(st.none(), st.floats(0, 150, allow_nan=False))
processes = st.lists(
    st.fixed_dictionaries(
        {"pid": st.integers(1, 99)},
        optional={
            "pod_uid": st.sampled_from(["", "uid-1", "uid-2"]),
            "used_mib": st.one_of(st.none(), st.floats(0, 4096, allow_nan=False)),
        },
    ),
    max_size=3,
)


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """A valid report: readings known or not, any health, processes with and without pods."""
    indices = draw(st.lists(st.integers(0, 7), min_size=0, max_size=4, unique=True))
    gpus = [
        gpu(
            i,
            temperature_c=draw(readings),
            power_w=draw(readings),
            power_limit_w=draw(readings),
            utilization_pct=draw(st.one_of(st.none(), st.floats(0, 100, allow_nan=False))),
            memory_total_mib=draw(readings),
            memory_used_mib=draw(readings),
            health=draw(st.sampled_from(["healthy", "degraded", "unhealthy"])),
            processes=draw(processes),
            uuid=f"GPU-{i}-{draw(st.integers(0, 1))}",
        )
        for i in indices
    ]
    doc = report(
        "n1",
        gpus,
        seq=draw(st.integers(0, 9)),
        labels=draw(st.sampled_from([{}, {RACK_LABEL: "r1"}])),
        driver_ok=draw(st.sampled_from([True, False, None])),
    )
    doc["node_health"]["device_nodes_ok"] = draw(st.sampled_from([True, False, None]))
    return doc


def _value(v: float | None) -> float:
    return math.nan if v is None else float(v)


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True)
    )


@settings(max_examples=150, deadline=None)
@given(documents())
def test_a_digest_holds_what_the_report_says(doc):
    made = digest(report_from(doc))
    assert made == digest_body(orjson.dumps(doc))
    assert (made.node, made.boot_id, made.seq, made.interval_s, made.labels) == (
        doc["node"], doc["agent"]["boot_id"], doc["agent"]["seq"], doc["interval_s"], doc["labels"]
    )  # fmt: skip
    health = doc["node_health"]
    assert made.driver_ok == (
        health["driver_ok"] is not False and health["device_nodes_ok"] is not False
    )
    assert made.uuids == tuple(g["uuid"] for g in doc["gpus"])
    for name in DIGEST_COLUMNS:
        if name == "health":
            want = [float(Health.from_wire(g["health"])) for g in doc["gpus"]]
        else:
            want = [_value(g[name]) for g in doc["gpus"]]
        assert _same(made.column(name), want), name
    assert made.pods == tuple(
        (g["index"], p["pod_uid"], p.get("used_mib") or 0.0)
        for g in doc["gpus"]
        for p in g["processes"]
        if p.get("pod_uid")
    )


def test_a_body_that_is_not_a_valid_report_has_no_digest():
    doc = report("n1", [gpu(0, temperature_c=500.0)])
    assert digest_body(orjson.dumps(doc)) is None
    assert digest_body(b"{not json") is None


def _table(state: ClusterState) -> dict[str, np.ndarray]:
    names = ("received_at", "interval_s", "driver_ok", "rack", "present", "hot", "health")
    floats = ("temperature_c", "power_w", "power_limit_w", "utilization_pct")
    more = ("memory_total_mib", "unaccounted_used_mib", "below_since")
    return {n: state.table.column(n).copy() for n in (*names, *floats, *more)}


@settings(max_examples=100, deadline=None)
@given(st.lists(documents(), min_size=1, max_size=4))
def test_a_relayed_push_leaves_the_state_its_decoded_report_does(docs):
    clock = FakeClock()
    relayed, decoded = ClusterState(clock), ClusterState(clock)
    for doc in docs:
        body = orjson.dumps(doc)
        made = digest_body(body)
        assert made is not None
        assert relayed.ingest(Received(made, body)) == decoded.ingest(report_from(doc))
        clock.advance(2.0)
    a, b = _table(relayed), _table(decoded)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    ra, rb = relayed.store.get("n1"), decoded.store.get("n1")
    assert ra is not None and rb is not None
    assert ra.thermal == rb.thermal
    indices = list(range(8))
    assert relayed.gpu_uuids("n1", indices) == decoded.gpu_uuids("n1", indices)
    # The report itself is decoded from the body when it is first asked for.
    assert ra.decoded is None
    assert ra.report == rb.report
    assert ra.decoded is not None and ra.body == b""


def test_a_stored_report_fills_the_table_row_with_its_readings():
    clock = FakeClock()
    state = ClusterState(clock)
    doc = report(
        "n1",
        [
            gpu(0, temperature_c=61.5, power_w=None, memory_used_mib=1024.0),
            gpu(2, temperature_c=None, health="unhealthy", memory_total_mib=8192.0),
        ],
        interval_s=7.0,
        labels={RACK_LABEL: "r9"},
        driver_ok=False,
    )
    body = orjson.dumps(doc)
    made = digest_body(body)
    assert made is not None
    assert state.ingest(Received(made, body)).accepted
    row = state.table.row("n1")
    assert row is not None
    col = state.table.column
    assert col("temperature_c")[row, 0] == 61.5 and math.isnan(col("temperature_c")[row, 2])
    assert math.isnan(col("power_w")[row, 0]) and col("power_w")[row, 2] == 30.0
    assert col("unaccounted_used_mib")[row, 0] == 1024.0
    assert col("memory_total_mib")[row, 2] == 8192.0
    assert col("present")[row].tolist()[:3] == [True, False, True]
    assert col("health")[row, 2] == Health.UNHEALTHY and col("health")[row, 0] == Health.HEALTHY
    assert col("interval_s")[row] == 7.0 and not col("driver_ok")[row]
    assert state.table.rack_name(int(col("rack")[row])) == "r9"
    assert state.gpu_uuids("n1", [0, 1, 2]) == ("GPU-0000", "", "GPU-0002")
