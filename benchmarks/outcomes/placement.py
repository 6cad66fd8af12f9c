"""The arms' placement: kube-scheduler-like spreading, FGD and a PWR-like power-aware FGD on the
OpenB replay's cluster state, and edgegpu through its own app (filter, prioritize, bind).

A placer answers ``place(task, t)`` with (node, GPU slots) or None, and ``release`` frees what a
task held. Host CPU and memory fit is kube-scheduler's own filter in every arm.
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx
import numpy as np
import numpy.typing as npt

from benchmarks.openb import frag
from benchmarks.openb.policies import Fgd
from benchmarks.openb.replay import Cluster, pick
from benchmarks.openb.trace import MILLI, Nodes, Pods, Shape, typical_pods
from benchmarks.outcomes.physics import MODELS
from benchmarks.sharing import _Binder, _report
from scheduler_extender.api.app import create_app
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.policy.document import Policy
from scheduler_extender.telemetry.clock import FakeClock

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

PWR_WEIGHT = 0.5
"""PWR-like: the share of the power term beside FGD's (each min-max scaled over feasible nodes)."""


class Placer(Protocol):
    """One arm's scheduler."""

    async def place(self, pod: int, uid: str, qos: str) -> tuple[int, IntArray] | None:
        """Where pod row ``pod`` goes (node row, GPU slots), or None when it fits nowhere."""
        ...

    def release(self, pod: int, uid: str, node: int, slots: IntArray) -> None:
        """Free what the pod held."""
        ...

    def disable(self, node: int, slot: int, down: bool) -> None:
        """Take a faulty GPU out of (or back into) what may be allocated."""
        ...


class Spreading:
    """Default (LeastAllocated), FGD or PWR-like on the replay's ``Cluster`` state."""

    def __init__(self, nodes: Nodes, pods: Pods, kind: str, rng: np.random.Generator) -> None:
        if kind not in ("default", "fgd", "pwr"):
            raise ValueError(f"kind must be default, fgd or pwr, not {kind!r}")
        fm = frag.FragModel.build(typical_pods(pods), pods, nodes)
        self.cluster = Cluster(nodes, fm)
        self.pods = pods
        self.kind = kind
        self.fgd = Fgd(fm)
        self.priority: IntArray = rng.permutation(nodes.size).astype(np.int64)
        self.down: set[tuple[int, int]] = set()
        dyn = [MODELS[m].spec.tdp_w - MODELS[m].spec.idle_w for m in nodes.models]
        self.dynamic_w: FloatArray = np.array(dyn)[nodes.model]

    def _shape(self, pod: int) -> Shape:
        return self.pods.shape(pod)

    async def place(self, pod: int, uid: str, qos: str) -> tuple[int, IntArray] | None:
        shape = self._shape(pod)
        c = self.cluster
        allowed = np.ones(c.nodes.size, dtype=np.bool_)
        ok = c.feasible(shape.cpu, int(self.pods.memory[pod]), shape, allowed)
        rows = np.flatnonzero(ok).astype(np.int64)
        if rows.size == 0:
            return None
        view = c.view(rows)
        if self.kind == "default":
            # LeastAllocated: the mean free share of CPU, memory and GPU after placing; the GPU
            # within the node is the one with the most room (spreading there too).
            gpus = np.maximum(c.nodes.gpus[rows], 1) * MILLI
            score = (
                (view.cpu - shape.cpu) / c.nodes.cpu[rows]
                + (c.memory[rows] - self.pods.memory[pod]) / c.nodes.memory[rows]
                + (view.gpu.sum(axis=1) - shape.total) / gpus
            ) / 3
            key = np.where(view.gpu >= shape.milli, -view.gpu, 1)
            slots: IntArray = np.argsort(key, axis=1, kind="stable")[:, : max(shape.num, 1)]
        else:
            score, slots = self.fgd.score(view, shape)
            if self.kind == "pwr":
                score = (1 - PWR_WEIGHT) * _scaled(score) + PWR_WEIGHT * _scaled(
                    -self.dynamic_w[rows] * shape.total
                )
        node = pick(np.asarray(score, dtype=np.float64), rows, self.priority)
        chosen = slots[int(np.flatnonzero(rows == node)[0])]
        c.place(node, shape.cpu, int(self.pods.memory[pod]), shape, chosen)
        return node, chosen[: shape.num]

    def release(self, pod: int, uid: str, node: int, slots: IntArray) -> None:
        shape = self._shape(pod)
        c = self.cluster
        c.cpu[node] += shape.cpu
        c.memory[node] += int(self.pods.memory[pod])
        for slot in slots:
            if (node, int(slot)) not in self.down:
                c.gpu[node, slot] += shape.milli
        self._refresh(node)

    def disable(self, node: int, slot: int, down: bool) -> None:
        # The device plugin marks the GPU unhealthy: none of it may be allocated until repaired.
        if down:
            self.down.add((node, slot))
            self.cluster.gpu[node, slot] = 0
        else:
            self.down.discard((node, slot))
            self.cluster.gpu[node, slot] = MILLI
        self._refresh(node)

    def _refresh(self, node: int) -> None:
        c = self.cluster
        c.frag[node] = frag.amount(
            c.cpu[node : node + 1], c.gpu[node : node + 1], c.nodes.model[node : node + 1], c.fm
        )[0]
        c.version[node] += 1


def _scaled(x: FloatArray) -> FloatArray:
    lo, hi = float(x.min()), float(x.max())
    out: FloatArray = (x - lo) / (hi - lo) if hi > lo else np.full(x.shape, 0.5)
    return out


BLOCK_MIB = 256
"""The replay's policy maps a trace GPU's 1000 milli onto 1000 blocks of this size."""


class Extender:
    """edgegpu: its app answers filter, prioritize and bind; agents' reports reach it by push."""

    def __init__(
        self, nodes: Nodes, pods: Pods, policy: Policy, rng: np.random.Generator, tie_seed: int
    ) -> None:
        self.clock = FakeClock()
        settings = ExtenderSettings(tie_seed=tie_seed)  # its random ties, repeatable
        self.app = create_app(settings, clock=self.clock, binder=_Binder(), policy=policy)
        self.state = self.app.state.ctx.state
        self.nodes = nodes
        self.pods = pods
        self.host = Spreading(nodes, pods, "default", rng)
        """Host CPU and memory kept by kube-scheduler (its NodeResourcesFit filter)."""
        self.priority: IntArray = self.host.priority
        self.seq = 0
        transport = httpx.ASGITransport(app=self.app, client=("127.0.0.1", 1))
        self.client = httpx.AsyncClient(transport=transport, base_url="http://extender")

    async def push(self, gpus_by_node: list[list[dict[str, Any]]], interval_s: float) -> None:
        """One round of agent reports, then the clock moves on by their interval."""
        self.seq += 1
        for n, gpus in enumerate(gpus_by_node):
            doc = _report(self.nodes.names[n], gpus, self.seq)
            doc["interval_s"] = interval_s
            await self.client.post("/v1/telemetry", json=doc)
        self.clock.advance(interval_s)

    async def place(self, pod: int, uid: str, qos: str) -> tuple[int, IntArray] | None:
        shape = self.pods.shape(pod)
        memory = int(self.pods.memory[pod])
        c = self.host.cluster
        host_ok = (c.cpu >= shape.cpu) & (c.memory >= memory)
        names = [self.nodes.names[i] for i in np.flatnonzero(host_ok)]
        if not names:
            return None
        limits = (
            {"edgegpu.io/gpu-mem-block": str(shape.milli)}
            if shape.sharing
            else {"nvidia.com/gpu": str(shape.num)}
        )
        body = {"metadata": {"name": uid, "namespace": "fleet", "uid": uid,
                             "annotations": {"edgegpu.io/qos": qos}},
                "spec": {"containers": [{"name": "app", "resources": {"limits": limits}}]}}  # fmt: skip
        fit = (await self.client.post("/filter", json={"Pod": body, "NodeNames": names})).json()
        if not fit.get("NodeNames"):
            return None
        scores = (
            await self.client.post("/prioritize", json={"Pod": body, "NodeNames": fit["NodeNames"]})
        ).json()
        index = {name: i for i, name in enumerate(self.nodes.names)}
        rows = np.array([index[s["Host"]] for s in scores], dtype=np.int64)
        node = pick(np.array([float(s["Score"]) for s in scores]), rows, self.priority)
        await self.client.post("/bind", json={"PodName": uid, "PodNamespace": "fleet",
                                              "PodUID": uid, "Node": self.nodes.names[node]})  # fmt: skip
        a = self.state.allocations.get(uid)
        if a is None:
            return None
        slots = np.array(a.gpu_indices, dtype=np.int64)
        c.cpu[node] -= shape.cpu
        c.memory[node] -= memory
        return node, slots

    def release(self, pod: int, uid: str, node: int, slots: IntArray) -> None:
        self.state.release(uid)
        c = self.host.cluster
        c.cpu[node] += self.pods.shape(pod).cpu
        c.memory[node] += int(self.pods.memory[pod])

    def disable(self, node: int, slot: int, down: bool) -> None:
        """Nothing to do: the agent reports the GPU unhealthy and the filter keeps pods off it."""

    async def close(self) -> None:
        """Close the in-process client."""
        await self.client.aclose()
