"""A push's digest (``scheduler_extender.telemetry.report``): what the table and ledgers take of a report."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings, strategies as st

from scheduler_extender.domain import Health
from scheduler_extender.names import RACK_LABEL
from scheduler_extender.telemetry.decode import report_from
from scheduler_extender.telemetry.fields import GPU_FIELDS, REPORTED, GpuField
from scheduler_extender.telemetry.report import DIGEST_COLUMNS, digest
from tests.builders import gpu, report

REASONS = ["gpu_idle", "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "sync_boost"]


def reading(field: GpuField) -> st.SearchStrategy[float | int | None]:
    """Any value the contract takes for one reading of the field table, or none."""
    if field.type == "int":
        values: st.SearchStrategy[Any] = st.integers(
            None if field.ge is None else math.ceil(field.ge),
            None if field.le is None else math.floor(field.le),
        )
    else:
        values = st.floats(field.ge, field.le, allow_nan=False, allow_infinity=False)
    return st.one_of(st.none(), values)


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
    """A valid report: every reading of the field table known or not, any health, processes
    with and without pods."""
    indices = draw(st.lists(st.integers(0, 7), min_size=0, max_size=4, unique=True))
    gpus = [
        gpu(
            i,
            **{f.name: draw(reading(f)) for f in REPORTED},
            health=draw(st.sampled_from(["healthy", "degraded", "unhealthy"])),
            processes=draw(processes),
            uuid=f"GPU-{i}-{draw(st.integers(0, 1))}",
            throttle_reasons=draw(st.lists(st.sampled_from(REASONS), max_size=3, unique=True)),
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


DERIVED = {f.name: f for f in GPU_FIELDS if f.derive is not None}


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True)
    )


@settings(max_examples=150, deadline=None)
@given(documents())
def test_a_digest_holds_what_the_report_says(doc):
    made = digest(report_from(doc))
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
        elif name in DERIVED:  # worked out from other fields: the field table's own test
            want = [_value(DERIVED[name].read(SimpleNamespace(**g))) for g in doc["gpus"]]
        else:
            want = [_value(g[name]) for g in doc["gpus"]]
        assert _same(made.column(name), want), name
    assert made.pods == tuple(
        (g["index"], p["pod_uid"], p.get("used_mib") or 0.0)
        for g in doc["gpus"]
        for p in g["processes"]
        if p.get("pod_uid")
    )
