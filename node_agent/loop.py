"""The agent loop: sample → protect → export → report → device plugin → push → follow answers.

``Agent`` runs one round by calling each job in turn: sampling (``telemetry.sampler``), local
protection (``protection.local``), the report (``telemetry.report``), the device plugin's
inventory (``deviceplugin.inventory``), the push (``uplink``), and the extenders' asks
(``protection.remediation``). It never dies from a bad reading, a lost GPU or a failed push:
each round is contained, and local protection runs before (and without) the push.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from node_agent.backends.base import GpuBackend
from node_agent.deviceplugin.inventory import BlockInventory
from node_agent.deviceplugin.state import StateFile
from node_agent.model import ActionResult, GpuHealth, Snapshot
from node_agent.protection import health, power
from node_agent.protection.baseline import Baseline
from node_agent.protection.local import LocalProtection
from node_agent.protection.maintenance import StepRunner
from node_agent.protection.remediation import Remediation
from node_agent.telemetry.exporter import AgentMetrics
from node_agent.telemetry.report import Reporter
from node_agent.telemetry.sampler import sample
from node_agent.uplink.pusher import Pusher, PushOutcome
from scheduler_extender.telemetry.schema import TelemetryReport

log = logging.getLogger("node_agent")


@dataclass(frozen=True, slots=True)
class Round:
    """The result of one round."""

    report: TelemetryReport
    actions: list[ActionResult]
    push: PushOutcome | None


class Agent:
    """One node's agent around one backend: the coordinator of its jobs."""

    def __init__(
        self,
        backend: GpuBackend,
        *,
        node: str,
        interval_s: float,
        metrics: AgentMetrics,
        health_args: health.HealthArgs,
        power_args: power.PowerArgs,
        pusher: Pusher | None = None,
        dry_run: bool = False,
        power_control: bool = True,
        labels: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        reboot_sentinel: Path | None = None,
        block_mib: int | None = None,
        host_boot_id: str | None = None,
        state: StateFile | None = None,
        accept_looser_policy: bool = False,
        steps: StepRunner | None = None,
        baseline: Baseline | None = None,
    ) -> None:
        """The agent of one node.

        ``steps``: the maintenance steps this node may be asked for (none: every ask fails);
        ``baseline``: the self-test's figures at this node's last pass (none: not compared).
        """
        self.backend = backend
        self.steps = steps or StepRunner(None, None)
        self.interval_s = interval_s
        self.metrics = metrics
        self.pusher = pusher
        self.clock = clock
        self.protection = LocalProtection(
            backend,
            metrics,
            health_args=health_args,
            power_args=power_args,
            dry_run=dry_run,
            power_control=power_control,
            accept_looser_policy=accept_looser_policy,
        )
        self.reporter = Reporter(
            node=node,
            backend=backend.name,
            interval_s=interval_s,
            labels=dict(labels or {}),
            wall=wall,
            host_boot_id=host_boot_id,
        )
        self.blocks = BlockInventory(block_mib=block_mib, state=state)
        """What the device plugin tells kubelet; its ``plugin`` is set where it runs."""
        self.remediation = Remediation(
            backend,
            metrics,
            clock=clock,
            reboot_sentinel=reboot_sentinel,
            verified=self.protection.verified,
            baseline=baseline,
        )
        self._said: set[str] = set()
        """What was logged already of the extenders' answers (a standing answer, every round)."""

    # -- one round --------------------------------------------------------------------------
    def sample(self) -> Snapshot:
        """Read every GPU; one GPU's failure becomes a lost reading, not an exception."""
        return sample(self.backend, self.clock, self.metrics)

    def build_report(self, snap: Snapshot, healths: Mapping[int, GpuHealth]) -> TelemetryReport:
        """The telemetry push for a snapshot (DESIGN.md §3)."""
        return self.reporter.build(
            snap,
            healths,
            xid_last=self.protection.last_xids(),
            self_test=self.remediation.self_test,
            holders=self.blocks.holders,
            maintenance=self.steps.result,
        )

    async def round(self) -> Round:
        """One full round. Protection is applied before the push is even tried."""
        # In a thread: a driver call that blocks must not stall the device plugin on this loop.
        snap = await asyncio.to_thread(self.sample)
        healths, actions = self.protection.decide(snap)
        self._export(snap, healths)
        await self.blocks.read_holders()
        report = self.build_report(snap, healths)
        await self.blocks.advertise(snap, healths)
        outcome = None
        if self.pusher is None:
            self.remediation.follow({}, self.reporter.boot, every_replica_answered=False)
        else:
            outcome = await self.pusher.push(report.to_json_bytes())
            await self._follow(outcome, snap, healths)
        return Round(report, actions, outcome)

    def _export(self, snap: Snapshot, healths: dict[int, GpuHealth]) -> None:
        view = self.metrics.view
        view.readings = list(snap.readings)
        self.remediation.gpus = [r.uuid for r in snap.readings]
        view.energy.add(view.readings, snap.taken_at)
        view.health = healths
        view.checks = snap.checks
        states = self.protection.power_states()
        view.saving = {i: state.saving is not None for i, state in states.items()}
        view.thermal_cap_w = {i: state.thermal_cap_w for i, state in states.items()}
        view.xid_last = self.protection.last_xids()

    async def _follow(
        self, outcome: PushOutcome, snap: Snapshot, healths: Mapping[int, GpuHealth]
    ) -> None:
        """What the extenders answered, each part to the job it concerns."""
        for url, result in outcome.results.items():
            self.metrics.pushes.labels(url, result).inc()
        for name in outcome.ignored:
            self.metrics.answer_fields_ignored.labels(name, "invalid").inc()
        fields = ", ".join(sorted(set(outcome.ignored)))
        if fields and f"invalid:{fields}" not in self._said:
            self._said.add(f"invalid:{fields}")
            log.warning("an extender's answer had invalid fields, ignored: %s", fields)
        # Lent blocks only while an extender answers (it alone can take them back); kubelet
        # hears of a change at once, not a round later.
        await self.blocks.lend_blocks(outcome.lend, snap, healths)
        answered = [r in ("ok", "ignored") for r in outcome.results.values()]
        if any(answered):
            self.protection.boost = outcome.performance_gpus
            if outcome.max_temp_c is not None:
                self.reporter.hot_threshold_c = outcome.max_temp_c
        self.remediation.follow(
            outcome.asks,
            self.reporter.boot,
            every_replica_answered=bool(answered) and all(answered),
        )
        self.steps.follow(outcome.step)
        if outcome.policy:
            self.follow_policy(outcome.policy)
        if "ignored" in outcome.results.values():
            # An extender holds a newer report under our boot id (a forged push, or a
            # copy of this agent): start a new boot id, which resets its ordering.
            log.warning("an extender ignored our report as not newer: new boot id")
            self.reporter.new_boot()

    def follow_policy(self, policy: dict[str, float | bool]) -> None:
        """Take the policy in force: local protection within the flags, and the block size."""
        policy = self.protection.follow_policy(policy)
        block_mib = policy.get("memory_block_mib")
        if isinstance(block_mib, float) and block_mib >= 1:
            self.blocks.follow_block_mib(int(block_mib))

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds every ``interval_s`` until ``stop`` is set; no error ends the loop."""
        while not stop.is_set():
            started = self.clock()
            try:
                await self.round()
            except Exception:
                self.metrics.cycle_errors.inc()
                log.exception("round failed; carrying on")
            delay = max(self.interval_s - (self.clock() - started), 0.0)
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
            except TimeoutError:
                pass

    def shutdown(self) -> None:
        """Undo power saving (thermal caps stay: the GPU may still be hot), close the backend.

        Closing the backend stops a self-test running: its program killed, none started after.
        """
        self.protection.undo_saving()
        try:
            self.backend.close()
        except Exception as exc:
            log.warning("backend close failed: %s", exc)
