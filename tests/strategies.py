"""Hypothesis strategies for node batches and pod demands (the one place they live)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from scheduler_extender.domain import PodDemand, QosClass
from scheduler_extender.policy.batch import NodeBatch
from scheduler_extender.telemetry.fields import KEPT

_NAMED = ("temperature_c", "power_w", "power_limit_w", "utilization_pct", "memory_total_mib")
maybe_nan = st.one_of(st.just(float("nan")), st.floats(0, 1, allow_nan=False))


@st.composite
def node_batches(draw: st.DrawFn, max_nodes: int = 12, max_gpus: int = 4) -> NodeBatch:
    n = draw(st.integers(1, max_nodes))
    g = draw(st.integers(1, max_gpus))

    def grid(elements: st.SearchStrategy, dtype: type) -> np.ndarray:
        values = draw(st.lists(elements, min_size=n * g, max_size=n * g))
        return np.array(values, dtype=dtype).reshape(n, g)

    def line(elements: st.SearchStrategy, dtype: type) -> np.ndarray:
        return np.array(draw(st.lists(elements, min_size=n, max_size=n)), dtype=dtype)

    temps = st.one_of(st.just(float("nan")), st.floats(-10, 120))
    watts = st.one_of(st.just(float("nan")), st.floats(0, 400))
    allocated = grid(st.integers(0, 6), np.int64)
    lent = grid(st.integers(0, 2), np.int64)
    borrowed = np.minimum(grid(st.integers(0, 2), np.int64), np.minimum(allocated, lent))
    return NodeBatch(
        known=line(st.booleans(), np.bool_),
        age_s=line(st.floats(0, 100), np.float64),
        interval_s=line(st.sampled_from([1.0, 5.0, 10.0]), np.float64),
        driver_ok=line(st.booleans(), np.bool_),
        present=grid(st.booleans(), np.bool_),
        health=grid(st.integers(0, 2), np.int8),
        readings={
            "temperature_c": grid(temps, np.float64),
            "power_w": grid(watts, np.float64),
            "power_limit_w": grid(watts, np.float64),
            "utilization_pct": grid(
                st.one_of(st.just(float("nan")), st.floats(0, 100)), np.float64
            ),
            "memory_total_mib": grid(
                st.sampled_from([float("nan"), 15360.0, 16384.0, 81920.0]), np.float64
            ),
            **{name: grid(maybe_nan, np.float64) for name in KEPT if name not in _NAMED},
        },
        unaccounted_used_mib=grid(st.floats(0, 20000), np.float64),
        excluded_until=grid(st.sampled_from([-np.inf, np.inf, 990.0, 1010.0]), np.float64),
        allocated_blocks=allocated,
        lent_blocks=lent,
        borrowed_blocks=borrowed,
        whole_taken=grid(st.booleans(), np.bool_),
        rack=line(st.integers(-1, 2), np.int64),
        rdma=line(st.booleans(), np.bool_),
        host_cpu_free=line(st.sampled_from([float("nan"), 0.0, 2000.0, 64000.0]), np.float64),
        host_memory_free=line(st.sampled_from([float("nan"), 0.0, 8192.0, 262144.0]), np.float64),
    )


@st.composite
def demands(draw: st.DrawFn) -> PodDemand:
    whole = draw(st.booleans())
    return PodDemand(
        uid="uid-x",
        namespace="default",
        name="x",
        qos=draw(st.sampled_from(list(QosClass))),
        mem_blocks=0 if whole else draw(st.integers(1, 6)),
        whole_gpus=draw(st.integers(1, 3)) if whole else 0,
        group=draw(st.one_of(st.none(), st.just("job"))),
        cpu_milli=draw(st.sampled_from([0, 1000, 16000])),
        host_memory_mib=draw(st.sampled_from([0, 4096, 65536])),
    )


def holder_names() -> st.SearchStrategy[str]:
    """Text near the edges of the holder patterns: names, separators, newlines, control and
    non-ASCII characters."""
    return st.text(alphabet="ab9-./\n\x1b\x7f Aé", max_size=6)
