"""The agent loop: sample → health → power plan → apply (unless dry-run) → export → push.

It never dies from a bad reading, a lost GPU or a failed push: each round is contained, and
local protection runs before (and without) the push.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from node_agent import __version__
from node_agent.backends.base import GpuBackend
from node_agent.deviceplugin.plugin import BlockPlugin, GpuBlocks, device_nodes, gpu_holders
from node_agent.deviceplugin.podresources import Listing
from node_agent.deviceplugin.state import StateFile, starting_block_mib
from node_agent.errors import NotSupported, PermissionDenied
from node_agent.model import (
    ActionResult,
    Capabilities,
    GpuHealth,
    GpuHolder,
    GpuReading,
    PowerAction,
    Snapshot,
)
from node_agent.protection import health, power
from node_agent.protection.reboot import RebootSentinel
from node_agent.telemetry.exporter import AgentMetrics
from node_agent.uplink.answer import Ask
from node_agent.uplink.pusher import Pusher, PushOutcome
from scheduler_extender.domain import MAX_HOLDERS_PER_NODE
from scheduler_extender.telemetry.schema import GpuReport, PodHolder, TelemetryReport

DEFAULT_HOT_THRESHOLD_C = 85.0
"""The GPU temperature counted as hot until an extender says its maxTemp."""

log = logging.getLogger("node_agent")

_STRICTER: dict[str, tuple[Callable[[power.PowerArgs], float], Callable[[float, float], float]]] = {
    "max_temp_c": (lambda flags: flags.max_temp_c, min),
    "cool_down_s": (lambda flags: flags.cool_down_s, max),
    # Saving engages under the threshold, so a higher one saves on more GPUs; saving switched
    # off saves as little as a threshold of 0.
    "power_saving_threshold_pct": (
        lambda flags: flags.threshold_pct if flags.saving_enabled else 0.0,
        max,
    ),
}
"""Each number of the policy that bounds local protection: the flags' value it is held to, and
which of the two is stricter (a lower maxTemp, a longer cool-down, a higher saving threshold)."""


def within_flags(
    policy: Mapping[str, float | bool], flags: power.PowerArgs, *, accept_looser: bool = False
) -> tuple[dict[str, float | bool], tuple[str, ...]]:
    """The policy local protection follows, and the fields of ``policy`` looser than ``flags``.

    An extender may make the agent's protection stricter than its own settings, never looser:
    a looser field is held at the flag's value (power saving stays on where the flags turn it
    on) and named, unless ``accept_looser``. ``memory_block_mib`` is no protection: it passes.
    """
    out = dict(policy)
    if accept_looser:
        return out, ()
    looser = []
    for key, (flag_value, stricter) in _STRICTER.items():
        if key in policy:
            value, flag = float(policy[key]), float(flag_value(flags))
            out[key] = stricter(value, flag)
            if out[key] != value:
                looser.append(key)
    if policy.get("power_saving") is False and flags.saving_enabled:
        out["power_saving"] = True
        looser.append("power_saving")
    return out, tuple(looser)


def host_boot_id(path: Path = Path("/proc/sys/kernel/random/boot_id")) -> str | None:
    """The host's boot id (the same inside a container), or None where there is none."""
    try:
        return path.read_text(encoding="ascii").strip()[:64] or None
    except (OSError, UnicodeDecodeError):
        return None


def _within_contract(gpu: dict[str, Any]) -> dict[str, Any] | None:
    """One GPU's report with the readings the contract refuses made null.

    NaN, infinite and out-of-range values are reported as readings the backend could not
    take; None when even that is not valid (an index or UUID). A driver that returns one
    nonsense value must not cost the node every other GPU's report.
    """
    for _ in range(8):
        try:
            GpuReport.model_validate(gpu)
        except ValidationError as exc:
            for error in exc.errors(include_url=False, include_input=False):
                if not error["loc"]:
                    return None  # the GPU as a whole, not one reading
                *parents, leaf = error["loc"]
                target: Any = gpu
                for key in parents:
                    target = target[key]
                if isinstance(target, dict) and target.get(leaf) is not None:
                    where = ".".join(map(str, error["loc"]))
                    log.warning(
                        "gpu %s: %s %r is not a valid reading; reported as null",
                        gpu.get("index"),
                        where,
                        target[leaf],
                    )
                    target[leaf] = None
                else:
                    return None
        else:
            return gpu
    return None


def _holders_within_contract(holders: list[GpuHolder] | None) -> list[dict[str, Any]] | None:
    """The holders the contract takes, at most ``MAX_HOLDERS_PER_NODE`` of them.

    One holder the contract refuses (a name kubelet should never have) is left out with a
    warning rather than cost the node its report.
    """
    if holders is None:
        return None
    out = []
    for h in holders:
        doc = {"namespace": h.namespace, "name": h.name, "gpu_uuid": h.gpu_uuid, "blocks": h.blocks}
        try:
            PodHolder.model_validate(doc)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False)
            )
            log.warning("holder %r of gpu %r left out of the report: %s",
                        f"{h.namespace}/{h.name}"[:300], h.gpu_uuid[:128], problems)  # fmt: skip
            continue
        out.append(doc)
    if len(out) > MAX_HOLDERS_PER_NODE:
        log.warning("%d holders of GPU blocks: only the first %d are reported",
                    len(out), MAX_HOLDERS_PER_NODE)  # fmt: skip
        out = out[:MAX_HOLDERS_PER_NODE]
    return out


@dataclass(slots=True)
class _GpuMemory:
    power: power.GpuPowerState = field(default_factory=lambda: power.IDLE)
    last_fatal_xid: tuple[int, float] | None = None
    last_xid: int | None = None
    disabled: set[str] = field(default_factory=set)
    """Action kinds that failed as not supported or not permitted: never retried."""


@dataclass(frozen=True, slots=True)
class Round:
    """The result of one round."""

    report: TelemetryReport
    actions: list[ActionResult]
    push: PushOutcome | None


class Agent:
    """One node's agent around one backend."""

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
    ) -> None:
        self.backend = backend
        self.node = node
        self.interval_s = interval_s
        self.metrics = metrics
        self.health_args = health_args
        self.power_args = power_args
        self.flags = power_args
        """Local protection as the agent was started with: an extender's policy may make it
        stricter, never looser (unless ``accept_looser_policy``)."""
        self.accept_looser_policy = accept_looser_policy
        self._said: set[str] = set()
        """What was logged already of the extenders' answers (a standing answer, every round)."""
        self.pusher = pusher
        self.dry_run = dry_run
        self.power_control = power_control
        self.labels = dict(labels or {})
        self.clock = clock
        self.wall = wall
        self.boot_id = str(uuid.uuid4())
        self.seq = 0
        self._gpus: dict[int, _GpuMemory] = {}
        self._boost: frozenset[int] = frozenset()
        self.hot_threshold_c = DEFAULT_HOT_THRESHOLD_C
        """The extender's maxTemp, as its last answer said."""
        self._hot_at: dict[str, float] = {}
        """By GPU uuid: when it last read at or above ``hot_threshold_c`` (``clock``)."""
        self.reboot = RebootSentinel(reboot_sentinel)
        """The reboot sentinel, written and withdrawn as the extender's answers ask."""
        self.state = state
        """Where the block size an extender said is kept for the next start; None: nowhere."""
        self._kept_block_mib = state.block_mib() if state is not None else None
        # MiB per memory block, as kubelet is told: the policy's, once an extender said it.
        self.block_mib, source = starting_block_mib(self._kept_block_mib, block_mib)
        log.info("memory blocks of %d MiB (%s) until an extender answers", self.block_mib, source)
        self.host_boot_id = host_boot_id
        """The host's boot id, sent with every report (a new one: the node rebooted)."""
        self.device_plugin: BlockPlugin | None = None
        self.pod_devices: Listing | None = None
        """kubelet's PodResources lookup, asked once a round where the device plugin runs: which
        pods hold which GPU's blocks, reported as ``holders``."""
        self.holders: list[GpuHolder] | None = None
        """Which pods held which GPU's blocks at the last round; None when not known."""
        self._pod_resources_ok: bool | None = None
        """Whether kubelet's pod resources answered last time (None: not asked yet)."""
        self._blocks: dict[str, int] = {}
        """By GPU uuid: its block count when last read (kept while the GPU is lost)."""
        self._lend: dict[str, int] = {}
        """Idle blocks each GPU lends to best-effort pods, as the extenders last said."""
        self._nodes: dict[str, tuple[str, ...]] = {}
        """By GPU uuid: an AMD or Intel GPU's device nodes, when last found."""
        self.sys_root = Path("/sys")
        """Where sysfs is (the device plugin finds AMD and Intel GPUs' device nodes there)."""
        self._uuid_at: dict[int, str] = {}
        """By index: the uuid last read there (a lost GPU reads under a placeholder)."""
        self.self_test: dict[str, str] | None = None
        """The verdict of the last self-test the extender asked for: id, verdict, detail."""
        self._testing: asyncio.Task[None] | None = None
        self._asked_test: str | None = None
        """The last self-test request id acted on."""

    # -- one round --------------------------------------------------------------------------
    def sample(self) -> Snapshot:
        """Read every GPU; one GPU's failure becomes a lost reading, not an exception."""
        now = self.clock()
        snap = Snapshot(taken_at=now)
        started = time.perf_counter()
        for i in range(self.backend.device_count()):
            try:
                snap.readings.append(self.backend.read(i))
            except Exception as exc:
                log.warning("gpu %d: read failed: %s", i, exc)
                snap.readings.append(GpuReading(index=i, uuid=f"unknown-{i}", lost=True))
        try:
            snap.checks = self.backend.node_checks()
        except Exception as exc:
            log.warning("node checks failed: %s", exc)
        try:
            snap.xids = self.backend.poll_xids(now)
        except Exception as exc:
            log.warning("xid poll failed: %s", exc)
        self.metrics.sample_seconds.observe(time.perf_counter() - started)
        return snap

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
            caps = self._caps(reading.index, mem)
            try:
                limits = self.backend.power_limits(reading.index) if caps.power_limit else None
            except Exception:
                limits = None
            mem.power, actions = power.plan(
                mem.power, reading, limits, caps, reading.index in self._boost, now, self.power_args
            )
            for action in actions:
                result = self._apply(action, mem)
                results.append(result)
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
        return healths, results

    def build_report(self, snap: Snapshot, healths: dict[int, GpuHealth]) -> TelemetryReport:
        """The telemetry push for a snapshot (DESIGN.md §3)."""
        self.seq += 1
        gpus = []
        for r in snap.readings:
            if r.temperature_c is not None and r.temperature_c >= self.hot_threshold_c:
                self._hot_at[r.uuid] = snap.taken_at
            hot_at = self._hot_at.get(r.uuid)
            h = healths.get(r.index) or GpuHealth("healthy")
            mem = self._gpus.get(r.index)
            gpus.append(
                {
                    "index": r.index,
                    "uuid": r.uuid,
                    "model": r.model,
                    "vendor": r.vendor,
                    "temperature_c": r.temperature_c,
                    "power_w": r.power_w,
                    "power_limit_w": r.power_limit_w,
                    "utilization_pct": r.utilization_pct,
                    "memory_total_mib": r.memory_total_mib,
                    "memory_used_mib": r.memory_used_mib,
                    "sm_clock_mhz": r.sm_clock_mhz,
                    "sm_clock_max_mhz": r.sm_clock_max_mhz,
                    "throttle_reasons": list(r.throttle_reasons),
                    "ecc_uncorrected": r.ecc_uncorrected,
                    "xid_last": mem.last_xid if mem else None,
                    "health": h.level,
                    "health_reasons": list(h.reasons),
                    "processes": [
                        {
                            "pid": p.pid,
                            "pod_uid": p.pod_uid,
                            "container": p.container,
                            "used_mib": p.used_mib,
                        }
                        for p in r.processes
                    ],
                    "hot_s_ago": None if hot_at is None else max(snap.taken_at - hot_at, 0.0),
                }
            )
        gpus = [g for g in (_within_contract(g) for g in gpus) if g is not None]
        c = snap.checks
        return TelemetryReport.model_validate(
            {
                "schema": "edgegpu.io/telemetry/v1",
                "node": self.node,
                "agent": {
                    "version": __version__,
                    "backend": self.backend.name,
                    "boot_id": self.boot_id,
                    "seq": self.seq,
                },
                "sampled_at": datetime.fromtimestamp(self.wall(), UTC),
                "interval_s": self.interval_s,
                "labels": self.labels,
                "node_health": {
                    "driver_ok": c.driver_ok,
                    "device_nodes_ok": c.device_nodes_ok,
                    "device_plugin_ok": c.device_plugin_ok,
                    "cuda_ctx_success_ratio": c.cuda_ctx_success_ratio,
                },
                "gpus": gpus,
                "hot_threshold_c": self.hot_threshold_c,
                "self_test": self.self_test,
                "host_boot_id": self.host_boot_id,
                "holders": _holders_within_contract(self.holders),
            }
        )

    def _export(self, snap: Snapshot, healths: dict[int, GpuHealth]) -> None:
        view = self.metrics.view
        view.readings = list(snap.readings)
        view.energy.add(view.readings, snap.taken_at)
        view.health = healths
        view.checks = snap.checks
        view.saving = {i: m.power.saving is not None for i, m in self._gpus.items()}
        view.thermal_cap_w = {i: m.power.thermal_cap_w for i, m in self._gpus.items()}

    async def round(self) -> Round:
        """One full round. Protection is applied before the push is even tried."""
        # In a thread: a driver call that blocks must not stall the device plugin on this loop.
        snap = await asyncio.to_thread(self.sample)
        healths, actions = self.decide(snap)
        self._export(snap, healths)
        self.holders = await self._read_holders()
        report = self.build_report(snap, healths)
        if self.device_plugin is not None:
            await self.device_plugin.update(self._block_devices(snap, healths))
        outcome = None
        if self.pusher is None:
            self.reboot.follow(None, self.boot, every_replica_answered=False)
        else:
            outcome = await self.pusher.push(report.to_json_bytes())
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
            lend_changed, self._lend = outcome.lend != self._lend, outcome.lend
            if lend_changed and self.device_plugin is not None:
                await self.device_plugin.update(self._block_devices(snap, healths))
            answered = [r in ("ok", "ignored") for r in outcome.results.values()]
            if any(answered):
                self._boost = outcome.performance_gpus
                if outcome.max_temp_c is not None:
                    self.hot_threshold_c = outcome.max_temp_c
            self._follow(outcome.asks, every_replica_answered=bool(answered) and all(answered))
            if outcome.policy:
                self.follow_policy(outcome.policy)
            if "ignored" in outcome.results.values():
                # An extender holds a newer report under our boot id (a forged push, or a
                # copy of this agent): start a new boot id, which resets its ordering.
                log.warning("an extender ignored our report as not newer: new boot id")
                self.boot_id, self.seq = str(uuid.uuid4()), 0
        return Round(report, actions, outcome)

    async def _read_holders(self) -> list[GpuHolder] | None:
        """Which pods hold which GPU's blocks, from kubelet; None where it cannot be asked."""
        if self.pod_devices is None or self.device_plugin is None:
            return None
        try:
            pods = await self.pod_devices()
        except Exception as exc:  # kubelet's answer is not ours to trust blindly
            log.warning("kubelet's pod resources: %s", exc)
            pods = None
        readable = pods is not None
        if readable != self._pod_resources_ok:
            if not readable:
                log.warning("kubelet's pod resources cannot be read: holders not reported")
            elif self._pod_resources_ok is not None:
                log.info("kubelet's pod resources read again: holders reported")
            self._pod_resources_ok = readable
        return None if pods is None else gpu_holders(pods)

    def _block_devices(self, snap: Snapshot, healths: dict[int, GpuHealth]) -> list[GpuBlocks]:
        """Each GPU's memory blocks for kubelet; a lost GPU keeps its uuid and blocks.

        An NVIDIA GPU is given to the container by ``NVIDIA_VISIBLE_DEVICES``; an AMD or Intel
        GPU by its device nodes, and offers no blocks while they cannot be found.
        """
        out = []
        for r in snap.readings:
            uuid = self._uuid_at.get(r.index, r.uuid) if r.lost else r.uuid
            if not r.lost:
                self._uuid_at[r.index] = r.uuid
                if r.memory_total_mib is not None:
                    self._blocks[r.uuid] = int(r.memory_total_mib // self.block_mib)
                if r.vendor not in (None, "nvidia") and not self._nodes.get(r.uuid):
                    # Looked up in sysfs until found, then kept while the agent runs.
                    self._nodes[r.uuid] = device_nodes(r.vendor, r.pci_bus_id, self.sys_root)
            nodes = self._nodes.get(uuid)
            if nodes == ():  # an AMD or Intel GPU whose device nodes were not found
                continue
            h = healths.get(r.index)
            healthy = not r.lost and (h is None or h.level != "unhealthy")
            lent = self._lend.get(uuid, 0) if healthy else 0
            out.append(GpuBlocks(uuid, self._blocks.get(uuid, 0), healthy, lent, nodes or ()))
        return out

    # -- the extender's policy and requests ----------------------------------------------------
    def follow_policy(self, policy: dict[str, float | bool]) -> None:
        """Take the policy in force for local protection and power saving.

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
        block_mib = policy.get("memory_block_mib")
        if isinstance(block_mib, float) and block_mib >= 1:
            self._follow_block_mib(int(block_mib))
        if power_args != p or health_args != self.health_args:
            log.info(
                "policy from the extender: maxTemp %g °C, cool-down %g s, power saving %s at "
                "%g %%", power_args.max_temp_c, power_args.cool_down_s,
                "on" if power_args.saving_enabled else "off", power_args.threshold_pct,
            )  # fmt: skip
            self.health_args, self.power_args = health_args, power_args

    @property
    def boot(self) -> str:
        """The boot this agent reports: the host's, else its own (what a reboot ask names)."""
        return self.host_boot_id or self.boot_id

    def _follow_block_mib(self, block_mib: int) -> None:
        """The policy's block size; kept in the state file when it is not what is kept."""
        if block_mib != self.block_mib:
            log.warning("memory blocks of %d MiB from now on (the extender's policy; was %d)",
                        block_mib, self.block_mib)  # fmt: skip
            self.block_mib = block_mib
        if self.state is not None and block_mib != self._kept_block_mib:
            self.state.save_block_mib(block_mib)  # tried once per size: a failure is logged
            self._kept_block_mib = block_mib

    def _follow(self, asks: dict[str, Ask], *, every_replica_answered: bool) -> None:
        """Start a requested self-test once per id; write or withdraw the reboot sentinel."""
        test = asks.get("self_test")
        if test and test.id != self._asked_test and self._testing is None:
            self._asked_test = test.id
            self._testing = asyncio.create_task(self._run_self_test(test.id))
        refused = self.reboot.follow(asks.get("reboot"), self.boot, every_replica_answered)
        if refused is not None:
            self.metrics.answer_fields_ignored.labels("reboot", refused).inc()

    async def _run_self_test(self, request: str) -> None:
        started = self.clock()
        try:
            log.warning("the extender asked for a self-test (%s): running it", request)
            try:
                doc = await asyncio.to_thread(self.backend.self_test)
            except Exception as exc:
                doc = {"verdict": "fail", "reason": f"{type(exc).__name__}: {exc}", "checks": []}
            verdict = "pass" if doc.get("verdict") == "pass" else "fail"
            failed = [
                f"{c.get('name')}: {c.get('detail', '')}".strip(": ")
                for c in doc.get("checks") or []
                if c.get("outcome") == "fail"
            ]
            detail = "; ".join([doc.get("reason") or "", *failed]).strip("; ")[:1024]
            if verdict == "pass":
                # The GPUs were verified: a fatal XID seen before the test no longer marks them.
                for mem in self._gpus.values():
                    if mem.last_fatal_xid is not None and mem.last_fatal_xid[1] <= started:
                        mem.last_fatal_xid = None
            self.self_test = {"id": request, "verdict": verdict, "detail": detail}
            log.warning("self-test %s: %s %s", request, verdict, detail)
        finally:
            self._testing = None

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
        """Undo power saving (thermal caps stay: the GPU may still be hot), close the backend."""
        for index, mem in self._gpus.items():
            for action in power.undo_saving(mem.power, index):
                result = self._apply(action, mem)
                log.info("gpu %d: %s at shutdown → %s", index, action.kind, result.outcome)
        try:
            self.backend.close()
        except Exception as exc:
            log.warning("backend close failed: %s", exc)
