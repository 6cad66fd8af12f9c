"""``make bench-e2e``: the real kube-scheduler's pace, with the extender and without it.

For each node count, one control plane (etcd + kube-apiserver, built by the e2e suite) holds
that many GPU Nodes as API objects, a lean pusher sends their telemetry at the agents' default
interval, and two schedulers take turns on the same burst of pods: the project's (its
KubeSchedulerConfiguration, the extender on filter, prioritize and bind) and a plain
kube-scheduler that fits the same extended resources itself. The control plane, the pusher and
the pod creator share CPU 0; the extender has CPU 1 to itself, as it would in production.
Writes ``benchmarks/results/e2e.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from benchmarks.latency import rss_mib
from benchmarks.workload import node_name
from tests.e2e.controlplane import ROOT, ControlPlane, Process, free_port, wait_until
from tests.e2e.edgegpu import EdgegpuScheduler, Extender, install

GPUS_PER_NODE = 8
BLOCKS_PER_GPU = 6
GPU_MEMORY_MIB = 6 * 4096
"""Eight 24 GiB GPUs per node: six 4 GiB blocks each under the default policy."""
INTERVAL_S = 5.0
"""The agents' default report interval."""
CLIENT_QPS = 1000
"""Both schedulers' API client limit, raised from 50 so that the plain scheduler's own binding
calls do not hold it back (the extender's bind does not go through that limit)."""


def log(line: str) -> None:
    """One line of progress on stderr."""
    print(line, file=sys.stderr, flush=True)


# -- the cluster's objects ---------------------------------------------------------------------
def node_object(i: int) -> dict[str, Any]:
    """Node i as kubelet registers it, with the GPUs advertised for the plain scheduler."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node_name(i),
            "labels": {
                "kubernetes.io/hostname": node_name(i),
                "kubernetes.io/os": "linux",
                "edgegpu.io/rack": f"rack-{i // 40:03d}",
            },
        },
    }


def node_status() -> dict[str, Any]:
    """Ready, with host room for far more pods than a burst brings."""
    resources = {
        "cpu": "64",
        "memory": "512Gi",
        "pods": "110",
        "nvidia.com/gpu": str(GPUS_PER_NODE),
        "edgegpu.io/gpu-mem-block": str(GPUS_PER_NODE * BLOCKS_PER_GPU),
    }
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
    return {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}}


def report_template(
    i: int, interval_s: float = INTERVAL_S, dra: bool = False
) -> tuple[bytes, bytes]:
    """Node i's telemetry as the bytes before and after its ``seq`` (idle, cool, healthy GPUs
    with a little memory in use, as an edge node between bursts)."""
    rng = random.Random(i)
    gpus = [
        {
            "index": g,
            "uuid": f"GPU-{i:05d}-{g:02d}-0000-0000-000000000000",
            "model": "NVIDIA L4",
            "temperature_c": round(rng.uniform(38, 60), 1),
            "power_w": round(rng.uniform(15, 30), 1),
            "power_limit_w": 72.0,
            "utilization_pct": round(rng.uniform(0, 10), 1),
            "memory_total_mib": GPU_MEMORY_MIB,
            "memory_used_mib": 300,
            "health": "healthy",
            "processes": [],
        }
        for g in range(GPUS_PER_NODE)
    ]
    doc = {
        "schema": "edgegpu.io/telemetry/v1",
        "node": node_name(i),
        "agent": {"version": "bench", "backend": "simulated", "boot_id": f"b-{i}", "seq": 7},
        "sampled_at": "2026-12-05T00:00:00Z",
        "interval_s": interval_s,
        "labels": {},
        "node_health": {
            "driver_ok": True,
            "device_nodes_ok": True,
            **({"dra_plugin_registered": True} if dra else {}),
        },
        "gpus": gpus,
    }
    head, tail = orjson.dumps(doc).split(b'"seq":7', 1)
    return head + b'"seq":', tail


def claim_object(name: str, k: int) -> dict[str, Any]:
    """Pod k's ResourceClaim: one block's memory of a GPU of ours, or a whole GPU (every tenth),
    as the device-plugin arms' pods ask."""
    exactly: dict[str, Any] = {"deviceClassName": "gpu.edgegpu.io"}
    if k % 10 != 9:
        exactly["capacity"] = {"requests": {"memory": "4Gi"}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}  # fmt: skip


def pod_object(name: str, k: int, scheduler: str, claim: bool = False) -> dict[str, Any]:
    """Pod k of a burst: 90 % one block (inference, or best-effort every fifth), 10 % one whole
    GPU (training); with ``claim``, the same through its ResourceClaim of the same name."""
    whole = k % 10 == 9
    limits = {"nvidia.com/gpu": "1"} if whole else {"edgegpu.io/gpu-mem-block": "1"}
    qos = "training" if whole else ("best-effort" if k % 5 == 4 else "inference")
    if claim:
        pod = pod_object(name, k, scheduler)
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
        resources = pod["spec"]["containers"][0]["resources"]
        resources.pop("limits")
        resources["claims"] = [{"name": "gpu"}]
        return pod
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"edgegpu.io/qos": qos}},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "app", "image": "example/app",
                 "resources": {"limits": limits, "requests": {"cpu": "100m"}}}
            ],
        },
    }  # fmt: skip


# -- the lean pusher ---------------------------------------------------------------------------
@dataclass
class PushStats:
    """Pushes of one window."""

    due: int = 0
    answered: int = 0
    accepted: int = 0
    failed: int = 0
    late: int = 0
    """Answered more than one interval after they were due."""


@dataclass
class Pusher:
    """Every node's telemetry every ``interval_s``, spread evenly, over kept-alive connections."""

    port: int
    token: str
    nodes: int
    connections: int = 8
    interval_s: float = INTERVAL_S
    seq_from: int = 100
    """The first round's sequence number (a later pusher for the same nodes starts above)."""
    stats: PushStats = field(default_factory=PushStats)
    tls: ssl.SSLContext | None = None
    """The extender's CA, as the agents verify it (its Service's name in the certificate)."""
    dra: bool = False
    """Each report says kubelet took the node's DRA plugin (the leader publishes its slice)."""
    _templates: list[tuple[bytes, bytes]] = field(default_factory=list)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.tls is None:
            return await asyncio.open_connection("127.0.0.1", self.port)
        return await asyncio.open_connection(
            "127.0.0.1", self.port, ssl=self.tls,
            server_hostname="edgegpu-extender.edgegpu-system.svc",
        )  # fmt: skip

    async def run(self, stop: asyncio.Event, drain_s: float = 0.0) -> None:
        """Push until ``stop`` is set; then wait up to ``drain_s`` for the pushes due to go."""
        self._templates = [report_template(i, self.interval_s, self.dra)
                           for i in range(self.nodes)]  # fmt: skip
        queue: asyncio.Queue[tuple[int, int, float]] = asyncio.Queue()
        workers = [asyncio.create_task(self._worker(queue)) for _ in range(self.connections)]
        loop = asyncio.get_running_loop()
        start = loop.time()
        sent = 0
        try:
            while not stop.is_set():
                due = int((loop.time() - start) / self.interval_s * self.nodes)
                while sent < due:
                    queue.put_nowait(
                        (sent % self.nodes, self.seq_from + sent // self.nodes, loop.time())
                    )
                    self.stats.due += 1
                    sent += 1
                await asyncio.sleep(0.01)
            if drain_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(queue.join(), drain_s)
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _worker(self, queue: asyncio.Queue[tuple[int, int, float]]) -> None:
        reader, writer = await self._connect()
        head = (
            f"POST /v1/telemetry HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            f"\r\nAuthorization: Bearer {self.token}\r\nContent-Length: "
        ).encode()
        loop = asyncio.get_running_loop()
        try:
            while True:
                i, seq, due_at = await queue.get()
                before, after = self._templates[i]
                body = before + str(seq).encode() + after
                writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
                try:
                    status = await reader.readline()
                    length = 0
                    while (line := await reader.readline()) not in (b"\r\n", b""):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":", 1)[1])
                    answer = await reader.readexactly(length)
                except (ConnectionError, asyncio.IncompleteReadError):
                    self.stats.failed += 1
                    writer.close()
                    reader, writer = await self._connect()
                    queue.task_done()
                    continue
                self.stats.answered += 1
                if status.split(b" ")[1:2] == [b"200"] and b'"accepted":true' in answer:
                    self.stats.accepted += 1
                if loop.time() - due_at > self.interval_s:
                    self.stats.late += 1
                queue.task_done()
        finally:
            writer.close()


# -- one burst ---------------------------------------------------------------------------------
@dataclass
class Burst:
    """Times of one burst of pods: created (POST sent) and bound (seen by a watch)."""

    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, tuple[float, str]] = field(default_factory=dict)
    annotations: dict[str, dict[str, str]] = field(default_factory=dict)


async def watch_binds(client: httpx.AsyncClient, ns: str, burst: Burst, rv: str) -> None:
    """Record when each pod of ``ns`` is first seen with a node."""
    params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "false"}
    while True:
        async with client.stream("GET", f"/api/v1/namespaces/{ns}/pods", params=params,
                                 timeout=httpx.Timeout(None, connect=10)) as resp:  # fmt: skip
            async for line in resp.aiter_lines():
                if not line:
                    continue
                event = orjson.loads(line)
                pod = event["object"]
                meta = pod.get("metadata") or {}
                params["resourceVersion"] = meta.get("resourceVersion", params["resourceVersion"])
                node = (pod.get("spec") or {}).get("nodeName")
                if node and meta.get("name") not in burst.bound:
                    burst.bound[meta["name"]] = (time.monotonic(), node)
                    burst.annotations[meta["name"]] = meta.get("annotations") or {}


async def run_burst(
    cp: ControlPlane, ns: str, pods: int, scheduler: str, claims: bool = False
) -> Burst:
    """Create ``pods`` pods in ``ns`` as fast as the API server takes them; wait for binds.

    With ``claims``, each pod's ResourceClaim is created right before it (counted in its time).
    """
    burst = Burst()
    ctx = ssl.create_default_context(cafile=str(cp.ca))
    headers = {"authorization": f"Bearer {cp.admin_token}"}
    limits = httpx.Limits(max_connections=40, max_keepalive_connections=40)
    async with httpx.AsyncClient(base_url=cp.server, verify=ctx, headers=headers,
                                 limits=limits, timeout=60) as client:  # fmt: skip
        listed = (await client.get(f"/api/v1/namespaces/{ns}/pods")).json()
        watcher = asyncio.create_task(
            watch_binds(client, ns, burst, listed["metadata"]["resourceVersion"])
        )
        await asyncio.sleep(0.5)
        names = iter(range(pods))

        async def creator() -> None:
            for k in names:
                name = f"p-{k:05d}"
                burst.created[name] = time.monotonic()  # from when the client asks
                if claims:
                    resp = await client.post(
                        f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
                        json=claim_object(name, k),
                    )
                    if resp.status_code != 201:
                        raise RuntimeError(f"claim {name}: {resp.status_code} {resp.text[:200]}")
                resp = await client.post(
                    f"/api/v1/namespaces/{ns}/pods", json=pod_object(name, k, scheduler, claims)
                )
                if resp.status_code != 201:
                    raise RuntimeError(f"create {name}: {resp.status_code} {resp.text[:200]}")

        await asyncio.gather(*(creator() for _ in range(16)))
        deadline = time.monotonic() + 60 + pods * 0.2
        while len(burst.bound) < pods and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        if len(burst.bound) < pods:
            listed = (await client.get(f"/api/v1/namespaces/{ns}/pods")).json()["items"]
            on_nodes = sum(1 for pod in listed if (pod.get("spec") or {}).get("nodeName"))
            log(f"  {ns}: {len(burst.bound)} binds seen, {on_nodes} of {len(listed)} pods bound")
            if listed:
                log(f"  first pod: {json.dumps(listed[0].get('status'))[:600]}")
    return burst


def summary(burst: Burst, pods: int) -> dict[str, Any]:
    """Pods per second and create→bound percentiles of a burst."""
    waits = sorted(
        (t - burst.created[name]) * 1000 for name, (t, _) in burst.bound.items()
        if name in burst.created
    )  # fmt: skip
    first = min(burst.created.values()) if burst.created else 0.0
    last = max((t for t, _ in burst.bound.values()), default=first)
    q = statistics.quantiles(waits, n=100, method="inclusive") if len(waits) >= 2 else [0.0] * 99
    return {
        "bound": len(burst.bound),
        "unbound": pods - len(burst.bound),
        "pods_per_s": round(len(burst.bound) / max(last - first, 1e-9), 1),
        "bind_p50_ms": round(q[49], 1),
        "bind_p99_ms": round(q[98], 1),
    }


def placement(burst: Burst) -> dict[str, Any]:
    """Nodes used and GPUs left without any pod, where the GPUs are known.

    With the extender each pod's GPU is in its annotations. Without it kube-scheduler only
    counts resources, so GPUs left whole are counted as a device plugin packing each node's
    blocks tightly would leave them (the best case for that arm).
    """
    per_node: dict[str, dict[str, Any]] = {}
    for name, (_, node) in burst.bound.items():
        entry = per_node.setdefault(node, {"gpus": set(), "blocks": 0, "whole": 0})
        index = burst.annotations.get(name, {}).get("edgegpu.io/gpu-index")
        if index is not None:
            entry["gpus"].update(int(x) for x in index.split(",") if x)
        elif int(name.split("-")[1]) % 10 == 9:
            entry["whole"] += 1
        else:
            entry["blocks"] += 1
    used = 0
    for entry in per_node.values():
        blocks_gpus = -(-entry["blocks"] // BLOCKS_PER_GPU)
        used += len(entry["gpus"]) + entry["whole"] + blocks_gpus
    return {"nodes_used": len(per_node), "gpus_touched": used}


@contextmanager
def namespace(cp: ControlPlane, name: str) -> Iterator[str]:
    """A namespace with its "default" ServiceAccount (no controller makes it here)."""
    cp.request("POST", "/api/v1/namespaces", json={"metadata": {"name": name}})
    cp.request("POST", f"/api/v1/namespaces/{name}/serviceaccounts",
               json={"metadata": {"name": "default"}})  # fmt: skip
    try:
        yield name
    finally:
        cp.request("DELETE", f"/api/v1/namespaces/{name}/pods", params={"gracePeriodSeconds": "0"})


def extender_counts(ext: Extender) -> dict[str, float]:
    """Errors and bind results from the extender's /metrics."""
    out: dict[str, float] = {"errors": 0.0, "bind_refusals": 0.0}
    text = ext.fetch("/metrics", timeout_s=10).text
    for line in text.splitlines():
        if line.startswith("edgegpu_extender_request_duration_seconds_sum{"):
            verb = line.split('verb="', 1)[1].split('"', 1)[0]
            out[f"time_{verb}"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("edgegpu_extender_request_duration_seconds_count{"):
            verb = line.split('verb="', 1)[1].split('"', 1)[0]
            out[f"calls_{verb}"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("edgegpu_extender_request_errors_total{"):
            out["errors"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("edgegpu_extender_binds_total{") and 'result="bound"' not in line:
            out["bind_refusals"] += float(line.rsplit(" ", 1)[1])
            result = line.split('result="', 1)[1].split('"', 1)[0]
            out[f"bind_{result}"] = float(line.rsplit(" ", 1)[1])
    return out


# -- one node count ----------------------------------------------------------------------------
async def create_nodes(
    cp: ControlPlane, nodes: Sequence[tuple[dict[str, Any], dict[str, Any]]]
) -> None:
    """Register Ready Nodes: each a Node object and the status patch kubelet would write."""
    ctx = ssl.create_default_context(cafile=str(cp.ca))
    headers = {"authorization": f"Bearer {cp.admin_token}"}
    async with httpx.AsyncClient(base_url=cp.server, verify=ctx, headers=headers,
                                 timeout=60) as client:  # fmt: skip
        todo = iter(nodes)

        async def one() -> None:
            for node, status in todo:
                name = node["metadata"]["name"]
                resp = await client.post("/api/v1/nodes", json=node)
                if resp.status_code not in (201, 409):
                    raise RuntimeError(f"node {name}: {resp.status_code} {resp.text[:200]}")
                resp = await client.patch(
                    f"/api/v1/nodes/{name}/status", json=status,
                    headers={"content-type": "application/strategic-merge-patch+json"},
                )  # fmt: skip
                if resp.status_code != 200:
                    raise RuntimeError(f"node {name} status: {resp.status_code} {resp.text[:200]}")
                # The not-ready taint admission puts on a new Node: no controller lifts it here.
                resp = await client.patch(
                    f"/api/v1/nodes/{name}", json={"spec": {"taints": None}},
                    headers={"content-type": "application/merge-patch+json"},
                )  # fmt: skip
                if resp.status_code != 200:
                    raise RuntimeError(f"node {name} taints: {resp.status_code} {resp.text[:200]}")

        await asyncio.gather(*(one() for _ in range(16)))


def answers(port: int) -> bool:
    """Whether a server on this port answers ``GET /healthz`` with 200."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def plain_scheduler(cp: ControlPlane) -> Process:
    """kube-scheduler with the default profile and the same client limit as ours."""
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {
            "kubeconfig": str(cp.admin_kubeconfig), "qps": CLIENT_QPS, "burst": 2 * CLIENT_QPS,
        },
    }  # fmt: skip
    path = cp.folder / "plain-scheduler.yaml"
    path.write_text(yaml.safe_dump(config))
    return cp.spawn("kube-scheduler", [cp.binary("kube-scheduler"), f"--config={path}",
                                       "--secure-port=0", "--v=1"])  # fmt: skip


class PinnedExtender(Extender):
    """An extender replica on CPU 1, with a static token for the pusher."""

    token_file: Path | None = None

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The manifest's command on CPU 1."""
        argv, env = super().command()
        if self.token_file is not None:
            env["EDGEGPU_STATIC_TOKEN_FILE"] = str(self.token_file)
        return ["taskset", "-c", "1", *argv], env


def schedule_with(
    cp: ControlPlane, url: str, name: str, *, every_node: bool = False, **overrides: Any
) -> EdgegpuScheduler:
    """A kube-scheduler with the project's configuration, calling ``url``, client qps raised;
    ``every_node``: every feasible node found and sent (``percentageOfNodesToScore: 100``)."""
    sched = EdgegpuScheduler(cp, url, name=name, overrides=overrides)
    original = sched.config

    def config() -> dict[str, Any]:
        doc = original()
        doc["clientConnection"].update(qps=CLIENT_QPS, burst=2 * CLIENT_QPS)
        if every_node:
            doc["percentageOfNodesToScore"] = 100
        return doc

    sched.config = config  # type: ignore[method-assign]
    sched.start()
    return sched


async def bench_nodes(
    count: int,
    pods: int,
    rounds: int,
    folder: Path,
    floor: bool = False,
    every_node: bool = False,
    dra: bool = False,
) -> dict[str, Any]:
    """The arms, interleaved, on one control plane with ``count`` Nodes.

    With ``dra``, two more: the same pods through ResourceClaims of the DRA driver, allocated
    from the slices the extender publishes (one per node), by the plain kube-scheduler and by
    the project's (the extender weighing each claim pod).

    With ``floor``, another: the project's scheduler configuration calling the least any
    extender must do (``benchmarks.floor``: every node passes, every score 0) for filter and
    prioritize, kube-scheduler binding itself: the cost of the extender protocol alone. With
    ``every_node``, another: the project's, with every feasible node found and sent to the
    extender (``percentageOfNodesToScore: 100``) instead of kube-scheduler's default share.
    """
    cp = ControlPlane(folder)
    try:
        cp.start(controllers=False)
        log(f"[{count}] control plane up; creating {count} Nodes")
        started = time.monotonic()
        status = node_status()
        await create_nodes(cp, [(node_object(i), status) for i in range(count)])
        log(f"[{count}] Nodes created in {time.monotonic() - started:.0f} s; installing edgegpu")
        install(cp, rollouts=False)
        if dra:
            cp.kubectl("apply", "-f", "overlays/dra/deviceclass.yaml",
                       "-f", "overlays/dra/rbac.yaml")  # fmt: skip
        token = secrets.token_hex(16)
        token_file = folder / "agent-tokens"
        token_file.write_text(f"{token} *\n")
        ext = PinnedExtender(cp, "edgegpu-extender-0")
        ext.token_file = token_file
        if every_node:
            served = ["edgegpu-scheduler", "edgegpu-every-node-scheduler"]
            ext.extra_env["EDGEGPU_SCHEDULER_NAMES"] = json.dumps(served)
        if dra:
            ext.extra_env["EDGEGPU_DRA"] = "true"
        ext.start()
        pusher = Pusher(ext.port, token, count, tls=ext.context(), dra=dra)
        stop = asyncio.Event()
        pushing = asyncio.create_task(pusher.run(stop))
        sched = schedule_with(cp, ext.url, "edgegpu-scheduler")
        plain = plain_scheduler(cp)
        arm_names = ["alone", "ours"]
        floor_sched = None
        if floor:
            port = free_port()
            cp.spawn("floor", ["taskset", "-c", "1", sys.executable, "-m", "benchmarks.floor",
                               "--port", str(port)])  # fmt: skip
            await asyncio.to_thread(wait_until, "the floor", lambda: answers(port), 30.0, 0.2)
            floor_sched = schedule_with(cp, f"http://127.0.0.1:{port}", "floor-scheduler",
                                        bindVerb="", preemptVerb="")  # fmt: skip
            arm_names.append("floor")
        every_sched = None
        if every_node:
            every_sched = schedule_with(
                cp, ext.url, "edgegpu-every-node-scheduler", every_node=True
            )
            arm_names.append("every_node")

        def all_reported() -> bool:
            return bool(ext.get("/readyz") is not None) and pusher.stats.answered >= count

        await asyncio.to_thread(wait_until, "every node's first push", all_reported,
                                INTERVAL_S * 4 + 60, 1.0)  # fmt: skip
        if dra:
            arm_names += ["claims", "claims_ours"]
            started = time.monotonic()

            def published() -> bool:
                doc = cp.get("/apis/resource.k8s.io/v1/resourceslices?limit=1") or {}
                left = (doc.get("metadata") or {}).get("remainingItemCount") or 0
                return len(doc.get("items") or []) + int(left) >= count

            await asyncio.to_thread(wait_until, "every node's ResourceSlice", published,
                                    300.0, 1.0)  # fmt: skip
            log(f"[{count}] {count} ResourceSlices published in "
                f"{time.monotonic() - started:.0f} s")  # fmt: skip
        log(f"[{count}] {pusher.stats.answered} pushes answered; bursts of {pods} pods")
        arms: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arm_names}
        assert ext.process is not None
        pid = ext.process.popen.pid
        rss_peak = round(rss_mib(pid), 1)
        for r in range(rounds):
            for arm in arm_names:
                scheduler = {"alone": "default-scheduler", "ours": "edgegpu-scheduler",
                             "floor": "floor-scheduler", "claims": "default-scheduler",
                             "claims_ours": "edgegpu-scheduler",
                             "every_node": "edgegpu-every-node-scheduler"}[arm]  # fmt: skip
                before = dict(vars(pusher.stats))
                counts_before = extender_counts(ext)
                with namespace(cp, f"bench-{arm.replace('_', '-')}-{r}") as ns:
                    burst = await run_burst(cp, ns, pods, scheduler,
                                            claims=arm.startswith("claims"))  # fmt: skip
                    result = summary(burst, pods) | placement(burst)
                    rss_peak = max(rss_peak, round(rss_mib(pid), 1))
                counts = extender_counts(ext)
                after = vars(pusher.stats)
                result["pushes"] = {k: after[k] - before[k] for k in after}
                if arm in ("ours", "every_node", "claims_ours"):
                    result["extender_errors"] = counts["errors"] - counts_before["errors"]
                    result["verbs_ms"] = {
                        verb: round(
                            (counts[f"time_{verb}"] - counts_before.get(f"time_{verb}", 0.0))
                            / calls * 1000, 2,
                        )
                        for verb in ("filter", "prioritize", "bind", "telemetry")
                        if (calls := counts.get(f"calls_{verb}", 0.0)
                            - counts_before.get(f"calls_{verb}", 0.0)) > 0
                    }  # fmt: skip
                    result["bind_refusals"] = {
                        k: v - counts_before.get(k, 0.0)
                        for k, v in counts.items()
                        if k.startswith("bind_") and v - counts_before.get(k, 0.0)
                    }
                arms[arm].append(result)
                log(f"[{count}] round {r + 1} {arm}: {json.dumps(result)}")
                await asyncio.sleep(3)  # the namespace's pods go; the extender releases them
        stop.set()
        await pushing
        plain.stop()
        sched.stop()
        for extra in (floor_sched, every_sched):
            if extra is not None:
                extra.stop()
        return {"arms": arms, "extender_rss_mib": rss_peak, "versions": cp.versions()}
    finally:
        cp.stop()


def combine(result: dict[str, Any]) -> dict[str, Any]:
    """Medians of the rounds, as {"ours", "alone", "ratio"} per figure."""
    arms = result["arms"]
    out: dict[str, Any] = {}
    for key in ("pods_per_s", "bind_p50_ms", "bind_p99_ms"):
        ours = round(statistics.median(r[key] for r in arms["ours"]), 1)
        alone = round(statistics.median(r[key] for r in arms["alone"]), 1)
        out[key] = {
            "ours": ours,
            "alone": alone,
            "ratio": round(ours / alone, 2) if alone else None,
        }
    ours_runs = arms["ours"]
    out["bind_refusals"] = sum(r["bind_refusals"].get("bind_refusals", 0) for r in ours_runs)
    out["extender_errors"] = sum(r["extender_errors"] for r in ours_runs)
    out["unbound"] = {"ours": sum(r["unbound"] for r in ours_runs),
                      "alone": sum(r["unbound"] for r in arms["alone"])}  # fmt: skip
    out["pushes_during_bursts"] = {
        k: sum(r["pushes"][k] for r in ours_runs) for k in ours_runs[0]["pushes"]
    }
    for extra in ("floor", "every_node", "claims", "claims_ours"):
        if extra in arms:
            out[extra] = {
                key: round(statistics.median(r[key] for r in arms[extra]), 1)
                for key in ("pods_per_s", "bind_p50_ms", "bind_p99_ms")
            }
    out["placement"] = {
        arm: {k: statistics.median(r[k] for r in runs) for k in ("nodes_used", "gpus_touched")}
        for arm, runs in arms.items()
    }
    out["extender_rss_mib"] = result["extender_rss_mib"]
    out["rounds"] = arms
    return out


def main(argv: list[str] | None = None) -> int:
    """Run every node count, print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="1000,5000", help="node counts, comma-separated")
    p.add_argument("--pods", type=int, default=1000, help="pods per burst")
    p.add_argument("--rounds", type=int, default=2, help="bursts per arm, interleaved")
    p.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "e2e.json")
    p.add_argument("--floor", action="store_true",
                   help="another arm: the extender protocol's own cost (benchmarks.floor)")  # fmt: skip
    p.add_argument("--dra", action="store_true",
                   help="another arm: the same pods through ResourceClaims (the DRA driver)")  # fmt: skip
    p.add_argument("--every-node", action="store_true",
                   help="another arm: every feasible node sent (percentageOfNodesToScore 100)")  # fmt: skip
    args = p.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        log("bench-e2e: needs two CPUs (the extender gets one to itself)")
        return 2
    os.sched_setaffinity(0, {0})  # this process and the control plane; the extender: CPU 1
    doc: dict[str, Any] = {
        "method": (
            f"{args.pods} pods per burst (90 % one block, 10 % one whole GPU), "
            f"{args.rounds} bursts per arm interleaved; {GPUS_PER_NODE} GPUs x "
            f"{BLOCKS_PER_GPU} blocks per node; telemetry every {INTERVAL_S:g} s per node; "
            f"control plane, pusher and pod creator on CPU 0, the extender on CPU 1; both "
            f"schedulers with client qps {CLIENT_QPS}; figures are medians of the bursts"
        ),
    }
    for count in (int(c) for c in args.nodes.split(",")):
        with tempfile.TemporaryDirectory(prefix=f"edgegpu-bench-{count}-") as tmp:
            result = asyncio.run(
                bench_nodes(
                    count,
                    args.pods,
                    args.rounds,
                    Path(tmp),
                    floor=args.floor,
                    every_node=args.every_node,
                    dra=args.dra,
                )
            )
        doc["versions"] = result.pop("versions")
        doc[str(count)] = combine(result)
        c = doc[str(count)]
        print(
            f"{count:>5} nodes: pods/s {c['pods_per_s']['ours']} vs {c['pods_per_s']['alone']} "
            f"(x{c['pods_per_s']['ratio']}); create->bound p50 {c['bind_p50_ms']['ours']} vs "
            f"{c['bind_p50_ms']['alone']} ms, p99 {c['bind_p99_ms']['ours']} vs "
            f"{c['bind_p99_ms']['alone']} ms (x{c['bind_p99_ms']['ratio']}); bind refusals "
            f"{c['bind_refusals']}, extender errors {c['extender_errors']}, RSS "
            f"{c['extender_rss_mib']} MiB; pushes in bursts {c['pushes_during_bursts']}; "
            f"placement {c['placement']}",
            flush=True,
        )
        if "claims" in c:
            print(f"{count:>5} nodes, claims (DRA, the plain kube-scheduler allocating): pods/s "
                  f"{c['claims']['pods_per_s']}, create->bound p50 {c['claims']['bind_p50_ms']} "
                  f"p99 {c['claims']['bind_p99_ms']} ms, unbound "
                  f"{sum(r['unbound'] for r in c['rounds']['claims'])}", flush=True)  # fmt: skip
            o = c["claims_ours"]
            print(f"{count:>5} nodes, claims through the extender (edgegpu-scheduler): pods/s "
                  f"{o['pods_per_s']}, create->bound p50 {o['bind_p50_ms']} p99 "
                  f"{o['bind_p99_ms']} ms, unbound "
                  f"{sum(r['unbound'] for r in c['rounds']['claims_ours'])}", flush=True)  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
