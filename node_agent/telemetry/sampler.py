"""One sampling round of the node: every GPU, the node's checks and the XIDs since the last.

A GPU whose read fails becomes a lost reading, and a failed check or XID poll is logged: a
sample never raises. Imports the backend protocol, ``model`` and the exporter's metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from node_agent.backends.base import GpuBackend
from node_agent.model import GpuReading, Snapshot
from node_agent.telemetry.exporter import AgentMetrics

log = logging.getLogger("node_agent")


def sample(backend: GpuBackend, clock: Callable[[], float], metrics: AgentMetrics) -> Snapshot:
    """Read every GPU; one GPU's failure becomes a lost reading, not an exception."""
    now = clock()
    snap = Snapshot(taken_at=now)
    started = time.perf_counter()
    for i in range(backend.device_count()):
        try:
            snap.readings.append(backend.read(i))
        except Exception as exc:
            log.warning("gpu %d: read failed: %s", i, exc)
            snap.readings.append(GpuReading(index=i, uuid=f"unknown-{i}", lost=True))
    try:
        snap.checks = backend.node_checks()
    except Exception as exc:
        log.warning("node checks failed: %s", exc)
    try:
        snap.xids = backend.poll_xids(now)
    except Exception as exc:
        log.warning("xid poll failed: %s", exc)
    metrics.sample_seconds.observe(time.perf_counter() - started)
    return snap
