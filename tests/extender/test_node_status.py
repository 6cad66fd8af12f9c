"""A node's status is worked out once, when its report is taken: faults, verdict and boots."""

from __future__ import annotations

from scheduler_extender.state.cluster import ClusterState
from scheduler_extender.telemetry.clock import FakeClock
from scheduler_extender.telemetry.decode import report_from
from scheduler_extender.telemetry.store import GpuFault, NodeStatus, status_of
from tests.builders import gpu, report


def test_an_unhealthy_gpu_is_a_fault_for_its_reasons_but_the_degraded_ones() -> None:
    doc = report(
        gpus=[
            gpu(0),
            gpu(1, health="unhealthy", health_reasons=["xid:79", "temp:over-max"]),
            gpu(2, health="unhealthy", health_reasons=["throttle:hw-slowdown"]),
            gpu(3, health="degraded", health_reasons=["cuda:ctx-flaky"]),
        ]
    )
    status = status_of(report_from(doc))
    assert status.faults == (GpuFault(1, ("xid:79",)), GpuFault(2, ("unhealthy",)))


def test_the_boot_is_the_hosts_else_the_agents_own() -> None:
    doc = report(boot_id="agent-1")
    assert status_of(report_from(doc)).boot == "agent-1"
    assert status_of(report_from({**doc, "host_boot_id": "host-1"})).boot == "host-1"


def test_the_state_keeps_the_status_of_the_last_report_taken() -> None:
    state = ClusterState(FakeClock())
    assert state.node_status("n1") is None
    doc = {**report("n1", seq=1), "self_test": {"id": "t1", "verdict": "fail"}}
    assert state.ingest(report_from(doc)).accepted
    status = state.node_status("n1")
    assert status == NodeStatus(self_test=("t1", "fail"), agent_boot="boot-1")
    state.ingest(report_from(report("n1", seq=0)))  # not newer: ignored, the status stays
    assert state.node_status("n1") == status
