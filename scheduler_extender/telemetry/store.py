"""The latest report of every node, with report ordering and per-GPU thermal hysteresis.

Imports the schema and ``policy.thermal`` (the hysteresis step is a policy rule); no web.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from scheduler_extender.policy import thermal
from scheduler_extender.telemetry.decode import TelemetryReport


class NodeRecord(msgspec.Struct, gc=False):
    """What the extender knows of one node from its agent.

    Not tracked by the garbage collector, like the report it holds (see ``telemetry.decode``):
    a record refers to nothing that refers back to it.
    """

    report: TelemetryReport
    received_at: float
    """Monotonic time of the last accepted report."""
    received_wall: float
    thermal: dict[str, thermal.ThermalState] = msgspec.field(default_factory=dict)
    """Hysteresis state per GPU uuid; a GPU that was never hot has none (``thermal.COOL``)."""


@dataclass(frozen=True, slots=True)
class PutResult:
    """Outcome of one push."""

    accepted: bool
    reason: str = ""


class TelemetryStore:
    """In-memory store of the latest report per node. Not thread-safe: use one event loop."""

    def __init__(self) -> None:
        self._records: dict[str, NodeRecord] = {}

    def __len__(self) -> int:
        return len(self._records)

    def get(self, node: str) -> NodeRecord | None:
        """The node's record, if it ever reported."""
        return self._records.get(node)

    def nodes(self) -> list[str]:
        """Every node that has reported, sorted."""
        return sorted(self._records)

    def put(
        self, report: TelemetryReport, now: float, wall: float, args: thermal.ThermalArgs
    ) -> PutResult:
        """Keep the report unless it is not newer than the last one of the same agent boot.

        A new ``boot_id`` (agent restart) resets the ordering. Thermal state advances per GPU
        uuid, so that a GPU keeps its cool-down across re-indexing.
        """
        previous = self._records.get(report.node)
        if previous is not None:
            last = previous.report.agent
            if last.boot_id == report.agent.boot_id and report.agent.seq <= last.seq:
                return PutResult(False, f"seq {report.agent.seq} is not newer than {last.seq}")
        states = previous.thermal if previous is not None else {}
        new_states: dict[str, thermal.ThermalState] = {}
        max_c = args.max_temp_c
        for gpu in report.gpus:
            state = states.get(gpu.uuid, thermal.COOL)
            temp = gpu.temperature_c
            if state is thermal.COOL and (temp is None or temp < max_c):
                continue  # never hot and not hot now: the step would keep it COOL
            state = thermal.step(state, temp, now, args)
            if state is not thermal.COOL:
                new_states[gpu.uuid] = state
        self._records[report.node] = NodeRecord(report, now, wall, new_states)
        return PutResult(True)

    def forget(self, node: str) -> None:
        """Drop a node (deleted from the cluster)."""
        self._records.pop(node, None)
