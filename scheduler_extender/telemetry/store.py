"""The latest report of every node, in report order, with what is worked out from it once.

Each record holds the node's status as remediation reads it (``NodeStatus``: the GPU faults,
the self-test verdict and the boot ids, so that no reader judges a report's strings again) and
the thermal state of its GPUs that the state layer worked out (``state.hysteresis``). Imports
the report structs and the type of ``policy.thermal``'s state; no web.
"""

from __future__ import annotations

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
    """Unhealthy GPUs, in report order (a degraded GPU is no fault: the filter judges it)."""
    self_test: tuple[str, Literal["pass", "fail"]] | None = None
    """(request id, verdict) of the last self-test the agent reported."""
    self_test_detail: str = ""
    """What the agent said of that self-test (its failed checks)."""
    step: tuple[str, Literal["pass", "fail"], bool, str] | None = None
    """(request id, outcome, reboot wanted, detail) of the last maintenance step it ran."""
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
    for g in report.gpus:
        if g.health == "unhealthy":
            reasons = tuple(r for r in g.health_reasons if r not in DEGRADED_REASONS)
            faults.append(GpuFault(g.index, reasons or ("unhealthy",)))
    test, step = report.self_test, report.maintenance
    return NodeStatus(
        faults=tuple(faults),
        self_test=None if test is None else (test.id, test.verdict),
        self_test_detail="" if test is None else test.detail,
        step=None if step is None else (step.id, step.outcome, step.reboot, step.detail),
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

    def put(
        self,
        push: Received,
        now: float,
        wall: float,
        heat: dict[str, thermal.ThermalState] | None = None,
    ) -> PutResult:
        """Keep the report unless it is not newer than the last one of the same agent boot.

        A new ``boot_id`` (agent restart) resets the ordering. ``heat``: the thermal state of
        the node's GPUs after this report (``state.hysteresis.advance``), kept with it.
        """
        d = push.digest
        previous = self._records.get(d.node)
        if previous is not None:
            last = previous.digest
            if last.boot_id == d.boot_id and d.seq <= last.seq:
                return PutResult(False, f"seq {d.seq} is not newer than {last.seq}")
        self._records[d.node] = NodeRecord(
            d, now, wall, push.report, status_of(push.report), thermal=heat or {}
        )
        return PutResult(True)

    def forget(self, node: str) -> None:
        """Drop a node (deleted from the cluster)."""
        self._records.pop(node, None)
