"""The leader's remediation round, every few seconds: one controller per job, one actuator.

Thermal migration (``thermal.Migration``), memory budgets and lent blocks taken back
(``memory.Budgets``, ``memory.Reclaim``), the GPU fault loop (``faultloop.FaultLoop``) and GPU
maintenances (``maintainer.Maintainer``) act through one ``Actuator``, whose gate every action
passes (enabled, paused, leadership, opt-out, fresh telemetry) and which owns timeouts,
fencing, the disruption budget and Events. A round that finds leadership gone stops where it
is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from scheduler_extender.k8s.client import JsonDict, KubeApi
from scheduler_extender.k8s.dra import DraView
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.remediation.actuator import CALL_TIMEOUT_S, COMPONENT, Actuator, NotLeading
from scheduler_extender.remediation.breaker import CONFIG_MAP
from scheduler_extender.remediation.faultloop import FaultLoop
from scheduler_extender.remediation.faults import Record
from scheduler_extender.remediation.maintainer import Maintainer
from scheduler_extender.remediation.memory import Budgets, Reclaim
from scheduler_extender.remediation.slices import SlicePublisher
from scheduler_extender.remediation.thermal import Eviction, Migration
from scheduler_extender.state.cluster import ClusterState

log = logging.getLogger("scheduler_extender.remediation")

PERIOD_S = 2.0


def _always(_for_s: float) -> bool:
    return True


class Remediator:
    """Runs every controller each ``PERIOD_S`` while the app runs."""

    def __init__(
        self,
        state: ClusterState,
        kube: KubeApi,
        metrics: ExtenderMetrics,
        leading: Callable[[float], bool] = _always,
        *,
        nodes: Callable[[], Mapping[str, JsonDict]] = dict,
        pods: Callable[[], Mapping[str, JsonDict]] = dict,
        synced: Callable[[], bool] = lambda: True,
        identity: str = COMPONENT,
        timeout_s: float = CALL_TIMEOUT_S,
        namespace: str = "edgegpu-system",
        dra: DraView | None = None,
    ) -> None:
        """``leading(s)``: whether this replica leads now and will still ``s`` seconds on.

        ``pods``: the Pod objects by uid. ``namespace``: the extender's own, where the circuit
        breaker's ConfigMap lives.
        """
        self.state = state
        self.leading = leading
        self.act = Actuator(
            kube, metrics, state.clock, leading, nodes=nodes, fresh=state.telemetry_fresh,
            identity=identity, timeout_s=timeout_s, namespace=namespace,
        )  # fmt: skip
        self.migration = Migration(state, self.act, pods)
        self.budgets = Budgets(state, self.act)
        self.reclaim = Reclaim(state, self.act)
        self.faults = FaultLoop(
            state, self.act, nodes=nodes, pods=pods, synced=synced, identity=identity,
        )  # fmt: skip
        self.maintainer = Maintainer(state, self.act, self.faults, nodes=nodes, synced=synced)
        self.slices = (
            SlicePublisher(state, self.act, nodes, dra, synced) if dra is not None else None
        )
        """The DRA driver's ResourceSlices: published whether remediation is on or not, in a
        loop of their own (``SlicePublisher.run``), so that no write of theirs delays a fault."""
        self._paused_said = False

    @property
    def records(self) -> dict[str, Record]:
        """The fault loop's records, while leading."""
        return self.faults.records

    def requests(self, node: str) -> dict[str, Any]:
        """Requests for the node's agent, sent in the answer to its push."""
        args = self.state.policy.spec.remediation
        if args.dry_run:
            return {}
        return {**self.faults.requests(node, args), **self.maintainer.requests(node, args)}

    async def step(self) -> list[Eviction]:
        """One round: thermal migration, memory budgets, lent blocks taken back, the fault loop.

        The records are read back from the annotations whenever leadership is new.
        """
        args = self.state.policy.spec.remediation
        if not args.enabled or not self.leading(0.0) or args.paused:
            self._stand_down()
            if args.paused and args.enabled and not self._paused_said:
                log.warning("remediation is paused (spec.remediation.paused): acting on nothing")
                self._paused_said = True
            return []
        self._paused_said = False
        self.act.forget_backoffs()
        await self.act.sync_clock(self.act.breaker.namespace, CONFIG_MAP)
        due: list[Eviction] = []
        controllers = (("thermal migration", self.migration.step), ("memory budgets",
                       self.budgets.step), ("reclaim", self.reclaim.step),
                       ("fault loop", lambda: self.faults.step(args)),
                       ("maintenance", lambda: self.maintainer.step(args)))  # fmt: skip
        for what, run in controllers:
            try:
                out = await run()
            except NotLeading as exc:
                log.warning("remediation: leadership lost before %s: round stopped", exc)
                self._stand_down()
                return []
            except Exception:  # one controller's failure never stops the others
                log.exception("remediation: %s failed this round; carrying on", what)
                continue
            if what == "thermal migration" and out:
                due = out
        try:
            await self.act.breaker.flush(args)
        except NotLeading:
            self._stand_down()
        return due

    def _stand_down(self) -> None:
        """Not acting: what was seen starts over (grace periods, unreachable times, ledger)."""
        self.faults.reset()
        self.budgets.reset()
        self.maintainer.reset()

    def view(self) -> list[dict[str, Any]]:
        """``GET /debug/remediation``: every node not healthy, its history and next step."""
        return self.faults.view()

    async def run(self) -> None:
        """``step`` every ``PERIOD_S``; no error ends the loop."""
        while True:
            await asyncio.sleep(PERIOD_S)
            try:
                await self.step()
            except Exception:
                log.exception("remediation round failed; carrying on")
