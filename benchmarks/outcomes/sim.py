"""One arm through the fleet, step by step: arrivals, placements, GPU power, clocks and heat, the
agent's local protection (edgegpu arms), XIDs and the tasks they interrupt, and the tallies.

Faults alternate between the two ways a task gets back: with the fault loop, its pod is evicted
after the measured ``eviction_delay_s`` and placed again at once where there is room; without,
it stays on the dead GPU until an operator drains it (OPERATOR_S). Either way the container then
takes RESTART_S to start.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.openb.trace import MILLI, Pods
from benchmarks.outcomes import physics
from benchmarks.outcomes.placement import BLOCK_MIB, Placer
from benchmarks.outcomes.workload import Fleet, Task
from node_agent.model import Capabilities, GpuReading, PowerLimits
from node_agent.protection.power import IDLE, GpuPowerState, PowerArgs, plan
from scheduler_extender.domain import QosClass

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

STEP_S = 30.0
MAX_TEMP_C = 85.0
"""The seed policy's maxTemp: the line every arm is measured against."""
FAULT_EVERY_S = 900.0
"""An XID on one busy GPU this often: for a sample of faults, not a failure rate."""
REPAIR_S = 1800.0
"""A faulty GPU takes no work for this long (self-test, reset or reboot)."""
OPERATOR_S = 900.0
"""Without the fault loop: an alert, a person, a drain (the guide's own "15 min" status quo)."""
RESTART_S = 30.0
"""From bind to the container running again (image cached, CUDA context)."""
MISSES = 20
"""A scheduling round stops after this many waiting tasks in a row fit nowhere."""
R_SPREAD = 0.1
"""Each GPU's thermal resistance varies ±10 % around its model's (slot, paste, fans)."""
SAVING_CLOCK_MHZ = PowerArgs().saving_clock_mhz


@dataclass
class Running:
    """A placed task."""

    task: Task
    node: int
    slots: IntArray
    left_s: float


@dataclass
class Waiting:
    """A task in the queue; ``fault_at`` set for one a fault interrupted."""

    task: Task
    ready_s: float
    fault_at: float | None = None
    loop: bool = False
    """Whether the fault loop took it off the faulty GPU."""


@dataclass
class Tally:
    """What one arm measured after the warm-up."""

    hot_min: float = 0.0
    throttled_min: float = 0.0
    throttled_by: dict[str, float] = field(
        default_factory=lambda: {"hw_slowdown": 0.0, "power_cap": 0.0, "clock_lock": 0.0}
    )
    """Throttled GPU-minutes by what held the clock down (one minute may count under two)."""
    clock_lost_min: float = 0.0
    """GPU-minutes of full clock the throttling took: Σ (unthrottled − clock) over throttled
    GPU-minutes (a minute at half clock counts ½; one 5 % under, 0.05)."""
    slowed_min: float = 0.0
    energy_j: float = 0.0
    completed: int = 0
    unallocated: list[float] = field(default_factory=list)
    """Per step: the share of healthy GPU capacity no task holds."""
    waiting: list[int] = field(default_factory=list)
    """Per step: tasks ready and waiting for room."""
    gpu_util: list[float] = field(default_factory=list)
    mem_util: list[float] = field(default_factory=list)
    interruptions: dict[str, list[float]] = field(
        default_factory=lambda: {"with_fault_loop": [], "without_fault_loop": []}
    )
    heat: list[FloatArray] = field(default_factory=list)
    """GPU temperatures each sampled minute (the heat map)."""


class Fleet_:
    """Per-GPU arrays of the fleet, flattened node-major."""

    def __init__(self, fleet: Fleet, rng: np.random.Generator) -> None:
        n = fleet.nodes
        self.node = np.repeat(np.arange(n.size), n.gpus)
        self.slot = np.concatenate([np.arange(g) for g in n.gpus])
        kinds = [physics.MODELS[n.models[m]] for m in n.model[self.node]]
        models = [k.spec for k in kinds]
        self.models = models
        self.idle_w = np.array([m.idle_w for m in models])
        self.tdp_w = np.array([m.tdp_w for m in models])
        self.mem_mib = np.array([m.memory_mib for m in models])
        self.slowdown_c = np.array([k.slowdown_c for k in kinds])
        self.max_mhz = np.array([m.max_clock_mhz for m in models])
        spread = rng.uniform(1 - R_SPREAD, 1 + R_SPREAD, size=self.node.size)
        self.r = np.array([m.thermal_resistance_c_per_w for m in models]) * spread
        self.inlet_c = fleet.inlet_c[self.node]
        self.index = {
            (int(a), int(b)): i for i, (a, b) in enumerate(zip(self.node, self.slot, strict=True))
        }

    @property
    def size(self) -> int:
        """GPUs in the fleet."""
        return int(self.node.size)


async def run(
    fleet: Fleet, pods: Pods, tasks: list[Task], placer: Placer, agent: bool, horizon_s: float,
    warmup_s: float, delay_with_loop_s: float, rng: np.random.Generator,
    push: Any = None,
) -> Tally:  # fmt: skip
    """Simulate one arm. ``agent``: edgegpu's agent protects its GPUs; ``push``: an async
    callable taking each node's GPU reports (the extender arms)."""
    g = Fleet_(fleet, rng)
    temp = g.inlet_c + g.r * g.idle_w
    cap_w = g.tdp_w.copy()
    lock = np.ones(g.size)
    agent_state: list[GpuPowerState] = [IDLE] * g.size
    thermal_lock = np.zeros(g.size, dtype=np.bool_)
    down_until = np.full(g.size, -np.inf)
    fault_order = rng.permutation(g.size)
    args = PowerArgs()
    caps = Capabilities(power_limit=True, locked_clocks=True)
    limits = [PowerLimits(m.min_limit_w, m.tdp_w, m.tdp_w) for m in g.models]
    tally = Tally()
    running: dict[str, Running] = {}
    queue: list[Waiting] = []
    arrivals = iter(tasks)
    upcoming = next(arrivals, None)
    faults = 0
    t = 0.0
    while t < horizon_s:
        measuring = t >= warmup_s
        while upcoming is not None and upcoming.arrival_s < t + STEP_S:
            queue.append(Waiting(upcoming, upcoming.arrival_s))
            upcoming = next(arrivals, None)
        # Faults: one busy GPU (the first in a fixed random order) gets an XID.
        if t > 0 and t % FAULT_EVERY_S < STEP_S:
            busy = {i for r in running.values() for i in _gpus(g, r)}
            hit = next((int(i) for i in fault_order if int(i) in busy), None)
            if hit is not None:
                with_loop = faults % 2 == 0
                faults += 1
                down_until[hit] = t + REPAIR_S
                placer.disable(int(g.node[hit]), int(g.slot[hit]), True)
                delay = delay_with_loop_s if with_loop else OPERATOR_S
                for name in [n for n, r in running.items() if hit in _gpus(g, r)]:
                    r = running.pop(name)
                    placer.release(r.task.pod, name, r.node, r.slots)
                    # The work done is kept (a checkpoint or a stateless server): the
                    # outage is what is measured, not lost work.
                    queue.insert(0, Waiting(_resumed(r), t + delay, t, with_loop))
        for fixed in np.flatnonzero((down_until < t) & np.isfinite(down_until)):
            down_until[fixed] = -np.inf
            placer.disable(int(g.node[fixed]), int(g.slot[fixed]), False)
        # A scheduling round over the tasks ready by the end of the step, in order.
        misses = 0
        still: list[Waiting] = []
        for w in queue:
            if w.ready_s >= t + STEP_S or (misses >= MISSES and w.fault_at is None):
                still.append(w)
                continue
            got = await placer.place(w.task.pod, w.task.name, w.task.qos.wire)
            if got is None:
                misses += 1
                still.append(w)
                continue
            misses = 0
            running[w.task.name] = Running(w.task, got[0], got[1], w.task.work_s)
            if w.fault_at is not None:
                back = max(w.ready_s, t) - w.fault_at + RESTART_S
                key = "with_fault_loop" if w.loop else "without_fault_loop"
                tally.interruptions[key].append(back)
        queue = still
        # Demand per GPU (share of the GPU at full clock) and memory in use.
        demand = np.zeros(g.size)
        mem = np.zeros(g.size)
        for r in running.values():
            share = pods.gpu_milli[r.task.pod] / MILLI * r.task.active(t)
            for i in _gpus(g, r):
                demand[i] += share
                mem[i] += share * g.mem_mib[i]
        demand = np.minimum(demand, 1.0)
        hw = temp >= g.slowdown_c
        limit_clock = physics.clock_under_limit(g.idle_w, g.tdp_w, demand, cap_w)
        clock = np.minimum(
            np.minimum(limit_clock, lock), np.where(hw, physics.HW_SLOWDOWN_CLOCK, 1.0)
        )
        power = physics.power_w(g.idle_w, g.tdp_w, demand, clock)
        # Throttled: the clock is below what it would be with no thermal measure at all (HW
        # slowdown, the agent's thermal cap or clock lock); power saving is not one.
        saving = np.array([s.saving == "clocks" for s in agent_state]) & ~thermal_lock
        unthrottled = np.minimum(
            physics.clock_under_limit(g.idle_w, g.tdp_w, demand, g.tdp_w),
            np.where(saving, lock, 1.0),
        )
        thermal = clock < unthrottled - 1e-6
        capped = limit_clock < unthrottled - 1e-6
        locked = thermal_lock & (lock < 1)
        done = physics.progress(demand, clock)
        temp = physics.temperature_step(temp, g.inlet_c + g.r * power, STEP_S)
        for name in list(running):
            r = running[name]
            r.left_s -= STEP_S * min(float(done[i]) for i in _gpus(g, r))
            if r.left_s <= 0:
                del running[name]
                placer.release(r.task.pod, name, r.node, r.slots)
                tally.completed += measuring
        if agent:
            boost = np.zeros(g.size, dtype=np.bool_)
            for r in running.values():
                if r.task.qos in (QosClass.TRAINING, QosClass.REALTIME):
                    boost[_gpus(g, r)] = True
            busy_pct = np.minimum(1.0, demand / clock) * 100
            for i in range(g.size):
                reading = GpuReading(
                    index=int(g.slot[i]), uuid=f"GPU-{i}", temperature_c=float(temp[i]),
                    power_w=float(power[i]), power_limit_w=float(cap_w[i]),
                    utilization_pct=float(busy_pct[i]),
                )  # fmt: skip
                agent_state[i], actions = plan(
                    agent_state[i], reading, limits[i], caps, bool(boost[i]), t, args
                )
                for a in actions:
                    if a.kind == "set_power_limit" and a.watts is not None:
                        cap_w[i] = a.watts
                    elif a.kind == "reset_power_limit":
                        cap_w[i] = g.tdp_w[i]
                    elif a.kind == "lock_clocks" and a.clock_mhz is not None:
                        lock[i] = min(1.0, a.clock_mhz / g.max_mhz[i])
                    elif a.kind == "reset_clocks":
                        lock[i] = 1.0
                thermal_lock[i] = agent_state[i].thermal_clocks
        if measuring:
            minutes = STEP_S / 60
            working = demand > 0
            tally.hot_min += float((temp >= MAX_TEMP_C).sum()) * minutes
            throttled = working & thermal
            tally.throttled_min += float(throttled.sum()) * minutes
            tally.clock_lost_min += float((unthrottled - clock)[throttled].sum()) * minutes
            by = tally.throttled_by
            by["hw_slowdown"] += float((throttled & hw).sum()) * minutes
            by["power_cap"] += float((throttled & capped).sum()) * minutes
            by["clock_lock"] += float((throttled & locked).sum()) * minutes
            tally.slowed_min += float((done < 1).sum()) * minutes
            tally.energy_j += float(power.sum()) * STEP_S
            tally.gpu_util.append(float(np.mean(np.minimum(1.0, demand / clock))))
            tally.mem_util.append(float(mem.sum() / g.mem_mib.sum()))
            down = np.isfinite(down_until)
            # A task still on a GPU that went down holds nothing usable: count it out too.
            allocated = sum(
                pods.gpu_milli[r.task.pod] * sum(not down[i] for i in _gpus(g, r))
                for r in running.values()
            )
            usable = MILLI * (g.size - int(down.sum()))
            tally.unallocated.append(100.0 * (1 - allocated / usable))
            tally.waiting.append(sum(w.ready_s <= t for w in queue))
            if int(t) % 60 == 0:
                tally.heat.append(temp.copy())
        if push is not None:
            reports = _reports(
                g, fleet, running, pods, t, temp, power, cap_w, clock, demand, hw, down_until
            )
            await push(reports, STEP_S)
        t += STEP_S
    return tally


def _gpus(g: Fleet_, r: Running) -> list[int]:
    return [g.index[(r.node, int(s))] for s in r.slots]


def _resumed(r: Running) -> Task:
    """The task's replacement pod: a new name and uid (as its controller would create), the
    work it had left."""
    return replace(r.task, name=f"{r.task.name}r", work_s=max(r.left_s, STEP_S))


def _reports(
    g: Fleet_, fleet: Fleet, running: dict[str, Running], pods: Pods, t: float,
    temp: FloatArray, power: FloatArray, cap_w: FloatArray, clock: FloatArray,
    demand: FloatArray, hw: npt.NDArray[np.bool_], down_until: FloatArray,
) -> list[list[dict[str, Any]]]:  # fmt: skip
    """What each node's agent reports: the GPUs as the model has them, on the replay's scale of
    1000 blocks of BLOCK_MIB per GPU, with each pod's process."""
    procs: dict[int, list[dict[str, Any]]] = {}
    for k, (name, r) in enumerate(running.items()):
        used = pods.gpu_milli[r.task.pod] * BLOCK_MIB * r.task.active(t)
        for i in _gpus(g, r):
            procs.setdefault(i, []).append(
                {"pid": 1000 + k, "pod_uid": name, "used_mib": float(used)}
            )
    out: list[list[dict[str, Any]]] = [[] for _ in range(fleet.nodes.size)]
    for i in range(g.size):
        faulty = np.isfinite(down_until[i])
        mine = procs.get(i, [])
        reasons = ["hw_slowdown"] if hw[i] else (["sw_power_cap"] if cap_w[i] < g.tdp_w[i] else [])
        out[int(g.node[i])].append({
            "index": int(g.slot[i]), "uuid": f"GPU-{i}", "model": g.models[i].name,
            "vendor": "nvidia", "temperature_c": round(float(temp[i]), 1),
            "power_w": round(float(power[i]), 1), "power_limit_w": float(cap_w[i]),
            "utilization_pct": round(float(min(1.0, demand[i] / clock[i]) * 100), 1),
            "memory_total_mib": float(MILLI * BLOCK_MIB),
            "memory_used_mib": float(sum(p["used_mib"] for p in mine)),
            "sm_clock_mhz": round(float(clock[i] * g.max_mhz[i])),
            "sm_clock_max_mhz": float(g.max_mhz[i]), "throttle_reasons": reasons,
            "health": "unhealthy" if faulty else "healthy",
            "health_reasons": ["xid:79"] if faulty else [], "processes": mine,
        })  # fmt: skip
    return out
