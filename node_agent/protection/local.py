"""Local protection of every GPU: health and the power plan of each sample, applied at once.

It needs nothing from the cloud, so it keeps working with the link down; an extender's policy
may make it stricter than the agent's flags, never looser (``within_flags``). A setter that is
not supported or not permitted is not tried again; the planner's state advances only where its
changes took effect, so a change that failed is planned again next round. Imports the backend
protocol, ``model``, the pure ``health``, ``power`` and ``policy``, and the exporter's metrics.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from node_agent.backends.base import GpuBackend
from node_agent.errors import NotSupported, PermissionDenied
from node_agent.model import (
    ActionResult,
    Capabilities,
    GpuHealth,
    PowerAction,
    PowerLimits,
    Snapshot,
)
from node_agent.protection import health, power
from node_agent.protection.policy import within_flags
from node_agent.telemetry.exporter import AgentMetrics

log = logging.getLogger("node_agent")


@dataclass(slots=True)
class _GpuMemory:
    power: power.GpuPowerState = field(default_factory=lambda: power.IDLE)
    last_fatal_xid: tuple[int, float] | None = None
    last_xid: int | None = None
    disabled: set[str] = field(default_factory=set)
    """Action kinds that failed as not supported or not permitted: never retried."""


class LocalProtection:
    """Health and power plans of one node's GPUs, applied through its backend."""

    def __init__(
        self,
        backend: GpuBackend,
        metrics: AgentMetrics,
        *,
        health_args: health.HealthArgs,
        power_args: power.PowerArgs,
        dry_run: bool = False,
        power_control: bool = True,
        accept_looser_policy: bool = False,
    ) -> None:
        self.backend = backend
        self.metrics = metrics
        self.health_args = health_args
        self.power_args = power_args
        self.flags = power_args
        """Local protection as the agent was started with: an extender's policy may make it
        stricter, never looser (unless ``accept_looser_policy``)."""
        self.accept_looser_policy = accept_looser_policy
        self.dry_run = dry_run
        self.power_control = power_control
        self.boost: frozenset[int] = frozenset()
        """GPUs the extenders last said hold high-QoS pods: kept out of power saving."""
        self._gpus: dict[int, _GpuMemory] = {}
        self._said: set[str] = set()
        """What was logged already of the extenders' policy (a standing answer, every round)."""

    def decide(self, snap: Snapshot) -> tuple[dict[int, GpuHealth], list[ActionResult]]:
        """Health and power plan for every GPU of a snapshot; applies the plan."""
        now = snap.taken_at
        for event in snap.xids:
            mem = self._gpus.setdefault(event.index, _GpuMemory())
            mem.last_xid = event.xid
            if event.xid in self.health_args.fatal_xids:
                mem.last_fatal_xid = (event.xid, event.at)
                log.error("gpu %d: fatal xid %d", event.index, event.xid)
            else:
                log.info("gpu %d: xid %d (application error)", event.index, event.xid)
        healths: dict[int, GpuHealth] = {}
        results: list[ActionResult] = []
        for reading in snap.readings:
            mem = self._gpus.setdefault(reading.index, _GpuMemory())
            healths[reading.index] = health.assess(
                reading, snap.checks, mem.last_fatal_xid, now, self.health_args
            )
            caps, limits = self._caps_and_limits(reading.index, mem)
            state, actions = power.plan_thermal(
                mem.power, reading, limits, caps, now, self.power_args
            )
            if self._apply_all(actions, mem, results):
                mem.power = state
            else:  # kept as it was, planned again next round; what failed may be disabled now
                caps, limits = self._caps_and_limits(reading.index, mem)
            boost = reading.index in self.boost
            state, actions = power.plan_saving(
                mem.power, reading, boost=boost, limits=limits, caps=caps, now=now,
                args=self.power_args,
            )  # fmt: skip
            if self._apply_all(actions, mem, results):
                mem.power = state
        return healths, results

    def _caps_and_limits(
        self, index: int, mem: _GpuMemory
    ) -> tuple[Capabilities, PowerLimits | None]:
        caps = self._caps(index, mem)
        try:
            limits = self.backend.power_limits(index) if caps.power_limit else None
        except Exception:
            limits = None
        return caps, limits

    def _apply_all(
        self, actions: list[PowerAction], mem: _GpuMemory, results: list[ActionResult]
    ) -> bool:
        """Apply a part of the plan; whether all of it took effect (or was planned dry).

        The planner's state for that part advances only then: a change that failed, was not
        supported or not permitted leaves it as it was, so it is planned again next round.
        """
        taken = True
        for action in actions:
            result = self._apply(action, mem)
            results.append(result)
            taken = taken and result.outcome in ("applied", "dry-run")
            self.metrics.power_actions.labels(
                str(action.index), action.kind, action.reason, result.outcome
            ).inc()
            log.info(
                "gpu %d: %s (%s)%s%s → %s %s",
                action.index,
                action.kind,
                action.reason,
                f" {action.watts} W" if action.watts is not None else "",
                f" {action.clock_mhz} MHz" if action.clock_mhz is not None else "",
                result.outcome,
                result.detail,
            )
        return taken

    def last_xids(self) -> dict[int, int | None]:
        """By GPU index: the last XID seen (fatal or not), as reported."""
        return {index: mem.last_xid for index, mem in self._gpus.items()}

    def power_states(self) -> dict[int, power.GpuPowerState]:
        """By GPU index: what the planner has done to it."""
        return {index: mem.power for index, mem in self._gpus.items()}

    def verified(self, started: float) -> None:
        """The GPUs passed a self-test started at ``started``.

        A fatal XID seen before it no longer marks them.
        """
        for mem in self._gpus.values():
            if mem.last_fatal_xid is not None and mem.last_fatal_xid[1] <= started:
                mem.last_fatal_xid = None

    def follow_policy(self, policy: dict[str, float | bool]) -> dict[str, float | bool]:
        """Take the policy in force for local protection and power saving; the policy taken.

        The flags are what the agent starts with (and keeps while no extender answers); a
        policy changed in the cluster reaches every agent with its next push. It may make
        protection stricter than the flags, never looser (``within_flags``).
        """
        policy, looser = within_flags(policy, self.flags, accept_looser=self.accept_looser_policy)
        for key in looser:
            self.metrics.answer_fields_ignored.labels(f"policy.{key}", "looser").inc()
        if looser and f"looser:{looser}" not in self._said:
            self._said.add(f"looser:{looser}")
            log.warning(
                "the extender's policy is looser than this agent's settings in %s: held at the "
                "agent's (--accept-looser-policy takes it)", ", ".join(looser),
            )  # fmt: skip
        health_args = replace(
            self.health_args,
            max_temp_c=float(policy.get("max_temp_c", self.health_args.max_temp_c)),
        )
        p = self.power_args
        power_args = replace(
            p,
            max_temp_c=float(policy.get("max_temp_c", p.max_temp_c)),
            cool_down_s=float(policy.get("cool_down_s", p.cool_down_s)),
            saving_enabled=bool(policy.get("power_saving", p.saving_enabled)),
            threshold_pct=float(policy.get("power_saving_threshold_pct", p.threshold_pct)),
        )
        if power_args != p or health_args != self.health_args:
            log.info(
                "policy from the extender: maxTemp %g °C, cool-down %g s, power saving %s at "
                "%g %%", power_args.max_temp_c, power_args.cool_down_s,
                "on" if power_args.saving_enabled else "off", power_args.threshold_pct,
            )  # fmt: skip
            self.health_args, self.power_args = health_args, power_args
        return policy

    def undo_saving(self) -> None:
        """Undo power saving at shutdown (thermal caps stay: the GPU may still be hot)."""
        for index, mem in self._gpus.items():
            for action in power.undo_saving(mem.power, index):
                result = self._apply(action, mem)
                log.info("gpu %d: %s at shutdown → %s", index, action.kind, result.outcome)

    def _caps(self, index: int, mem: _GpuMemory) -> Capabilities:
        if not self.power_control:
            return Capabilities()
        try:
            caps = self.backend.capabilities(index)
        except Exception:
            return Capabilities()
        return Capabilities(
            power_limit=caps.power_limit and "set_power_limit" not in mem.disabled,
            locked_clocks=caps.locked_clocks and "lock_clocks" not in mem.disabled,
            xid_events=caps.xid_events,
            processes=caps.processes,
        )

    def _apply(self, action: PowerAction, mem: _GpuMemory) -> ActionResult:
        if self.dry_run:
            return ActionResult(action, "dry-run")
        b = self.backend
        try:
            if action.kind == "set_power_limit":
                assert action.watts is not None
                b.set_power_limit_w(action.index, action.watts)
            elif action.kind == "reset_power_limit":
                limits = b.power_limits(action.index)
                if limits is None:
                    raise NotSupported("no power limit range")
                b.set_power_limit_w(action.index, limits.default_w)
            elif action.kind == "lock_clocks":
                assert action.clock_mhz is not None
                b.lock_clocks_mhz(action.index, action.clock_mhz)
            else:
                b.reset_clocks(action.index)
        except NotSupported as exc:
            mem.disabled.add("lock_clocks" if "clocks" in action.kind else "set_power_limit")
            return ActionResult(action, "not-supported", str(exc))
        except PermissionDenied as exc:
            mem.disabled.add("lock_clocks" if "clocks" in action.kind else "set_power_limit")
            return ActionResult(action, "no-permission", str(exc))
        except Exception as exc:
            return ActionResult(action, "failed", f"{type(exc).__name__}: {exc}")
        return ActionResult(action, "applied")
