"""The latest report of every node, with report ordering and per-GPU thermal hysteresis.

Each record also holds the node's status as remediation reads it (``NodeStatus``): the GPU
faults, the self-test verdict and the boot ids, worked out once when the report is taken, so
that no reader judges a report's strings again. Imports the report structs and
``policy.thermal`` (the hysteresis step is a policy rule); no web.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from scheduler_extender.policy.rules import thermal
from scheduler_extender.telemetry.report import Digest, TelemetryReport, digest


class Received(msgspec.Struct, frozen=True, gc=False):
    """One push to store: its report, and the digest the table is written from."""

    digest: Digest
    report: TelemetryReport

    @classmethod
    def of(cls, report: TelemetryReport) -> Received:
        """A push whose report is decoded already."""
        return cls(digest(report), report=report)


DEGRADED_REASONS = frozenset({"temp:over-max", "throttle:hw-slowdown", "cuda:ctx-flaky"})
"""Reasons the agent gives at the ``degraded`` level: not faults, even on an unhealthy GPU."""


class GpuFault(msgspec.Struct, frozen=True, gc=False):
    """A GPU its agent reports unhealthy: a fault for remediation."""

    index: int
    reasons: tuple[str, ...]
    """Its health reasons but the degraded ones (``DEGRADED_REASONS``); ``("unhealthy",)`` when
    none is left."""


class NodeStatus(msgspec.Struct, frozen=True, gc=False):
    """A node's health, self-test verdict and boots, as its last report says (``status_of``)."""

    faults: tuple[GpuFault, ...] = ()
    """Unhealthy GPUs, in report order."""
    degraded: tuple[int, ...] = ()
    """Indices of the GPUs reported degraded: not faults (the filter judges them)."""
    self_test: tuple[str, Literal["pass", "fail"]] | None = None
    """(request id, verdict) of the last self-test the agent reported."""
    agent_boot: str = ""
    """The agent's own boot id (a new one: the agent restarted)."""
    host_boot: str | None = None
    """The host's boot id, where the agent reads it."""

    @property
    def boot(self) -> str:
        """The node's boot: the host's, else the agent's own."""
        return self.host_boot or self.agent_boot


def status_of(report: TelemetryReport) -> NodeStatus:
    """The status a report gives its node: its GPUs' health classified, its verdict, its boots."""
    faults: list[GpuFault] = []
    degraded: list[int] = []
    for g in report.gpus:
        if g.health == "unhealthy":
            reasons = tuple(r for r in g.health_reasons if r not in DEGRADED_REASONS)
            faults.append(GpuFault(g.index, reasons or ("unhealthy",)))
        elif g.health == "degraded":
            degraded.append(g.index)
    test = report.self_test
    return NodeStatus(
        faults=tuple(faults),
        degraded=tuple(degraded),
        self_test=None if test is None else (test.id, test.verdict),
        agent_boot=report.agent.boot_id,
        host_boot=report.host_boot_id,
    )


class NodeRecord(msgspec.Struct, gc=False):
    """What the extender knows of one node from its agent.

    Not tracked by the garbage collector, like the report it holds (see ``report``): a record
    refers to nothing that refers back to it.
    """

    digest: Digest
    received_at: float
    """Monotonic time of the last accepted report."""
    received_wall: float
    report: TelemetryReport
    """The full report, as ``/debug/nodes/{name}`` shows it."""
    status: NodeStatus
    """The node's faults, self-test verdict and boots, from ``report`` (``status_of``)."""
    thermal: dict[str, thermal.ThermalState] = msgspec.field(default_factory=dict)
    """Hysteresis state per GPU uuid; a GPU that was never hot has none (``thermal.COOL``)."""

    def gpu_uuids(self, indices: Sequence[int]) -> tuple[str, ...]:
        """UUIDs of the node's GPUs by index ('' for an index the report does not have)."""
        d = self.digest
        by_index = dict(zip(map(int, d.column("index")), d.uuids, strict=True))
        return tuple(by_index.get(i, "") for i in indices)


@dataclass(frozen=True, slots=True)
class PutResult:
    """Outcome of one push."""

    accepted: bool
    reason: str = ""
    refused: bool = False
    """Not merely ignored (an old ``seq``): refused, for the sender to be answered an error
    (a new node over ``ClusterState.max_unlisted_nodes``)."""


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

    def put(self, push: Received, now: float, wall: float, args: thermal.ThermalArgs) -> PutResult:
        """Keep the report unless it is not newer than the last one of the same agent boot.

        A new ``boot_id`` (agent restart) resets the ordering. Thermal state advances per GPU
        uuid, so that a GPU keeps its cool-down across re-indexing; a GPU reported under a new
        uuid at the index of one that was hot or cooling takes that one's state, and a GPU a
        report leaves out keeps its state until its cool-down is over (neither a new uuid nor
        a report without it ends a cool-down). A GPU this store has no state for (after the
        extender's restart, or a report it missed) takes the agent's word for when it was last
        hot (``hot_s_ago``, counted from no higher a temperature than ``maxTemp``).
        """
        d = push.digest
        previous = self._records.get(d.node)
        if previous is not None:
            last = previous.digest
            if last.boot_id == d.boot_id and d.seq <= last.seq:
                return PutResult(False, f"seq {d.seq} is not newer than {last.seq}")
        states = previous.thermal if previous is not None else {}
        new_states: dict[str, thermal.ThermalState] = {}
        max_c = args.max_temp_c
        temps = d.column("temperature_c")  # NaN: not read
        report = push.report
        threshold = report.hot_threshold_c
        hints = (
            {
                g.uuid: g.hot_s_ago
                for g in report.gpus
                if g.hot_s_ago is not None and g.hot_s_ago < args.cool_down_s
            }
            if threshold is not None and threshold <= max_c
            else {}
        )
        if states or hints or any(t >= max_c for t in temps):
            was_at: dict[float, str] = {}
            if states and previous is not None:
                was_at = dict(
                    zip(previous.digest.column("index"), previous.digest.uuids, strict=True)
                )
            taken: set[str] = set()
            for uuid, index, temp in zip(d.uuids, d.column("index"), temps, strict=True):
                state = states.get(uuid)
                old = was_at.get(index)
                if state is None and old is not None and old not in d.uuids:
                    state = states.get(old)  # the same slot under a new uuid
                    taken.add(old)
                if state is None and uuid in hints:
                    state = thermal.ThermalState(below_since=now - hints[uuid])  # ends, or not
                state = state or thermal.COOL
                if state is thermal.COOL and not temp >= max_c:
                    continue  # never hot and not hot now: the step would keep it COOL
                state = thermal.step(state, None if math.isnan(temp) else temp, now, args)
                if state is not thermal.COOL:
                    new_states[uuid] = state
            for uuid, state in states.items():
                if uuid in new_states or uuid in taken or uuid in d.uuids:
                    continue
                if state.hot_since is not None or (
                    state.below_since is not None and now < state.below_since + args.cool_down_s
                ):
                    new_states[uuid] = state  # left out of this report: kept
        self._records[d.node] = NodeRecord(
            d, now, wall, report, status_of(report), thermal=new_states
        )
        return PutResult(True)

    def forget(self, node: str) -> None:
        """Drop a node (deleted from the cluster)."""
        self._records.pop(node, None)
