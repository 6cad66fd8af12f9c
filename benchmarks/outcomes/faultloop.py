"""How long the GPU fault loop takes from an XID to the pod's eviction: the real ``Remediator``
against the fake API server of the tests, on a fake clock, fed the agent's reports.

The XID lands half an agent interval before the agent's next sample; the leader's rounds run
every ``PERIOD_S``. Imports the tests' fake API server and report builders (a benchmark, not
shipped code).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry

from scheduler_extender.domain import Assignment, QosClass
from scheduler_extender.k8s.client import KubeApi, load_api_client
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.policy.document import parse_policy
from scheduler_extender.remediation.runner import PERIOD_S, Remediator
from scheduler_extender.state.cluster import ClusterState
from scheduler_extender.telemetry.clock import FakeClock
from scheduler_extender.telemetry.decode import report_from
from tests.builders import gpu, report
from tests.fakes.fake_kube import FakeKube

AGENT_INTERVAL_S = 5.0
"""The agent's default sampling interval."""
NODES = 10
"""Nodes in the fake cluster (one faulty), so the unavailability cap allows the cordon."""
TICK_S = 0.5
LIMIT_S = 600.0


def _push(state: ClusterState, node: str, seq: int, faulty: bool) -> None:
    unhealthy = {"health": "unhealthy", "health_reasons": ["xid:79"]} if faulty else {}
    state.ingest(report_from(report(node, [gpu(0, **unhealthy), gpu(1)], seq=seq)))  # type: ignore[arg-type]


async def eviction_delay_s() -> float:
    """Seconds from the XID to the eviction of the pod on the faulty GPU (the loop's real steps)."""
    with FakeKube(bookmark_interval_s=0.2) as kube, tempfile.TemporaryDirectory() as tmp:
        api = KubeApi(load_api_client(kube.kubeconfig(Path(tmp) / "kubeconfig")))
        clock = FakeClock()
        doc = {"enabled": True, "dryRun": False}
        state = ClusterState(clock, parse_policy({"spec": {"remediation": doc}}))
        seq = 0
        for i in range(NODES):
            kube.add_node(f"n{i}")
            kube.objects[("nodes", "", f"n{i}")]["status"]["conditions"] = [
                {"type": "Ready", "status": "True"}
            ]
            seq += 1
            _push(state, f"n{i}", seq, False)
        kube.add_pod("victim", node="n0", uid="uid-victim", phase="Running")
        state.assign(
            Assignment("uid-victim", "default", "victim", "n0", (0,), ("GPU-0000",), 1, False,
                       QosClass.INFERENCE, None, 0.0),
            authoritative=True,
        )  # fmt: skip
        remediator = Remediator(
            state, api, ExtenderMetrics(CollectorRegistry(), state), lambda _s: True,
            nodes=lambda: {k[2]: v for k, v in kube.objects.items() if k[0] == "nodes"},
            pods=lambda: {(k[1], k[2]): v for k, v in kube.objects.items() if k[0] == "pods"},
        )  # fmt: skip
        t = 0.0
        next_sample, next_round = AGENT_INTERVAL_S / 2, PERIOD_S / 2
        while t < LIMIT_S:
            t += TICK_S
            clock.advance(TICK_S)
            if t >= next_sample:
                seq += 1
                _push(state, "n0", seq, True)
                next_sample += AGENT_INTERVAL_S
            if t >= next_round:
                await remediator.step()
                next_round += PERIOD_S
            if ("pods", "default", "victim") not in kube.objects:
                return t
        raise RuntimeError(f"the fault loop did not evict the pod within {LIMIT_S:.0f} s")


if __name__ == "__main__":
    print(asyncio.run(eviction_delay_s()))
