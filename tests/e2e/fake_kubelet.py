"""A fake kubelet for the e2e control plane: it does to the API only what kubelet does.

* Registers its Nodes (capacity, allocatable, a Ready condition) and keeps them alive with a
  Lease in ``kube-node-lease`` renewed every ``heartbeat_s`` (as kubelet does; the node
  lifecycle controller reads it). A node can be made silent, to go NotReady as a dead one does.
* A pod bound to one of its nodes becomes Running (with a pod IP and ready containers).
* A pod being deleted on one of its nodes is removed once its grace period has passed
  (kubelet's final delete with grace period 0).
* On a node given a device manager (``attach_device_manager``: kubelet's side of the device
  plugin API, built on kubelet's own Go package), plugins register there, their devices become
  the node's capacity and allocatable, and a pod asking for them is admitted only once the
  plugin has allocated them (the container's environment is kept in ``envs``); a failed
  allocation fails the pod with ``UnexpectedAdmissionError``, as kubelet does.

It runs no containers: nothing else happens on the node.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.controlplane import ControlPlane, _die_with_parent

log = logging.getLogger("e2e.kubelet")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class DeviceManager:
    """``controlplane kubelet-device-manager`` for one node: JSON lines in and out."""

    def __init__(
        self, cp: ControlPlane, folder: Path, on_devices: Any, pod_resources: Path | None = None
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._on_devices = on_devices
        self._log = (cp.folder / f"device-manager-{folder.name}.log").open("a")
        self.popen = subprocess.Popen(
            [cp.binary("controlplane"), "kubelet-device-manager", f"--dir={folder}",
             *([f"--pod-resources={pod_resources}"] if pod_resources else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True, name="device-manager")
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            event = json.loads(line)
            self._log.write(line)
            self._log.flush()
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
            if event.get("event") == "devices":
                self._on_devices(event)

    def _send(self, command: dict[str, Any]) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps(command) + "\n")
        self.popen.stdin.flush()

    def wait(self, check: Any, timeout_s: float = 30.0, since: int = 0) -> dict[str, Any]:
        """The first event from the ``since``-th on that ``check`` accepts (waiting for it)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for event in self.events[since:]:
                    if check(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no such device manager event; got {self.events[-5:]}")
                self._cond.wait(left)

    def _ask(self, command: dict[str, Any], answered: Any) -> dict[str, Any]:
        """Send a command; the first event after it that ``answered`` accepts."""
        with self._cond:
            since = len(self.events)
        try:
            self._send(command)
        except (OSError, ValueError) as exc:  # stopped: its node is gone
            return {"event": "error", "error": f"device manager stopped: {exc}"}
        return self.wait(answered, since=since)

    def resources(self) -> set[str]:
        """The resources plugins registered."""
        with self._cond:
            return {e["resource"] for e in self.events if e["event"] == "registered"}

    def allocate(self, resource: str, size: int, pod: str, container: str) -> dict[str, Any]:
        """kubelet's admission of a container asking ``size`` devices: its allocation, or an
        error."""
        return self._ask(
            {"allocate": {"resource": resource, "size": size, "pod": pod, "container": container}},
            lambda e: e.get("pod") == pod and e["event"] in ("allocated", "error"),
        )

    def release(self, pod: str) -> dict[str, Any]:
        """The pod is gone: its devices are free again."""
        return self._ask(
            {"release": {"pod": pod}},
            lambda e: e.get("pod") == pod and e["event"] in ("released", "error"),
        )

    def restart(self) -> None:
        """What a kubelet restart does to the device plugins' folder."""
        self._send({"restart": True})

    def stop(self) -> None:
        """End it."""
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.close()  # it ends at the end of its input
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        self._reader.join(timeout=5)
        self.popen.stdout.close()
        self._log.close()


class FakeKubelet:
    """Nodes' heartbeats and pod lifecycles, for every node it registered."""

    def __init__(self, cp: ControlPlane, heartbeat_s: float = 5.0) -> None:
        self.cp = cp
        self.heartbeat_s = heartbeat_s
        self.nodes: dict[str, bool] = {}
        """Node name → whether it still heartbeats."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._deleting: set[str] = set()
        self._admitted: set[str] = set()  # pod UIDs: a stale Pending event admits nothing twice
        self._ips = 0
        self.started_pods = 0
        self.device_managers: dict[str, DeviceManager] = {}
        self.envs: dict[tuple[str, str], dict[str, str]] = {}
        """(namespace, pod) → the environment device plugins gave its container."""

    # -- nodes ------------------------------------------------------------------------------------
    def add_node(
        self,
        name: str,
        *,
        gpus: int,
        labels: dict[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
        gpu_resource: str = "nvidia.com/gpu",
    ) -> None:
        """Register a Node, Ready, with ``gpus`` whole GPUs advertised (as its vendor's device
        plugin would: ``gpu_resource``)."""
        resources = {"cpu": "32", "memory": "128Gi", "pods": "110", gpu_resource: str(gpus)}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **(labels or {}),
                },
            },
            "spec": {"taints": taints or []},
        }
        with self._lock:  # before it exists: its first pod may be bound within milliseconds
            self.nodes[name] = True
        with self.cp.client() as c:
            resp = c.post("/api/v1/nodes", json=node)
            if resp.status_code not in (201, 409):
                raise RuntimeError(f"create node {name}: {resp.status_code} {resp.text[:300]}")
            status = {
                "status": {
                    "capacity": resources,
                    "allocatable": resources,
                    "conditions": [self._ready_condition(True)],
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                    "nodeInfo": {
                        "kubeletVersion": "e2e-fake",
                        "architecture": "amd64",
                        "operatingSystem": "linux",
                    },
                }
            }
            self._patch(c, f"/api/v1/nodes/{name}/status", status)
        self._renew_lease(name)

    def silence(self, name: str, silent: bool = True) -> None:
        """Stop (or resume) a node's heartbeats, as when its kubelet dies."""
        with self._lock:
            self.nodes[name] = not silent
        if not silent:
            with self.cp.client() as c:
                self._patch(
                    c,
                    f"/api/v1/nodes/{name}/status",
                    {"status": {"conditions": [self._ready_condition(True)]}},
                )
            self._renew_lease(name)

    @staticmethod
    def _ready_condition(ready: bool) -> dict[str, str]:
        return {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "fake kubelet is posting ready status",
            "lastHeartbeatTime": _stamp(),
            "lastTransitionTime": _stamp(),
        }

    @staticmethod
    def _patch(c: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
        return c.patch(
            path,
            content=json.dumps(body),
            headers={"content-type": "application/strategic-merge-patch+json"},
        )

    def _renew_lease(self, node: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"
        with self.cp.client() as c:
            resp = c.patch(
                path,
                content=json.dumps({"spec": {"renewTime": _now()}}),
                headers={"content-type": "application/merge-patch+json"},
            )
            if resp.status_code == 404:
                c.post(
                    "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                    json={
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": node, "namespace": "kube-node-lease"},
                        "spec": {
                            "holderIdentity": node,
                            "leaseDurationSeconds": 40,
                            "renewTime": _now(),
                        },
                    },
                )

    def _heartbeats(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with self._lock:
                alive = [n for n, beating in self.nodes.items() if beating]
            for node in alive:
                try:
                    self._renew_lease(node)
                except httpx.HTTPError as exc:
                    log.warning("lease of %s: %s", node, exc)

    def attach_device_manager(
        self, node: str, folder: Path, pod_resources: Path | None = None
    ) -> DeviceManager:
        """Give a node kubelet's device manager, on ``folder`` (its device-plugins folder), and
        with ``pod_resources`` kubelet's PodResources API on that socket."""

        def advertise(event: dict[str, Any]) -> None:
            devices = event.get("devices") or []
            healthy = sum(1 for d in devices if d["health"] == "Healthy")
            resource = event["resource"]
            with self.cp.client() as c:
                self._patch(c, f"/api/v1/nodes/{node}/status", {"status": {
                    "capacity": {resource: str(len(devices))},
                    "allocatable": {resource: str(healthy)}}})  # fmt: skip

        manager = DeviceManager(self.cp, folder, advertise, pod_resources)
        self.device_managers[node] = manager
        return manager

    def detach_device_manager(self, node: str) -> None:
        """The node is gone: stop its device manager."""
        manager = self.device_managers.pop(node, None)
        if manager is not None:
            manager.stop()

    def _admit(self, node: str, pod: dict[str, Any]) -> str | None:
        """Allocate the device-plugin resources a pod's containers ask for; the error if any."""
        manager = self.device_managers.get(node)
        if manager is None:
            return None
        meta = pod["metadata"]
        registered = manager.resources()
        for container in pod["spec"].get("containers") or []:
            limits = (container.get("resources") or {}).get("limits") or {}
            for resource, amount in limits.items():
                if resource not in registered:
                    continue  # not a device plugin's resource on this node
                result = manager.allocate(
                    resource, int(amount), f"{meta['namespace']}/{meta['name']}", container["name"]
                )
                if result["event"] == "error":
                    return str(result["error"])
                self.envs.setdefault((meta["namespace"], meta["name"]), {}).update(
                    result.get("envs") or {}
                )
        return None

    # -- pods -------------------------------------------------------------------------------------
    def _pods(self) -> None:
        rv = ""
        while not self._stop.is_set():
            try:
                with self.cp.client(timeout_s=90.0) as c:
                    if not rv:
                        doc = c.get("/api/v1/pods").json()
                        rv = doc["metadata"]["resourceVersion"]
                        for pod in doc.get("items") or []:
                            self._pod(c, pod)
                    params = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "60",
                              "allowWatchBookmarks": "true"}  # fmt: skip
                    with c.stream("GET", "/api/v1/pods", params=params) as resp:
                        for line in resp.iter_lines():
                            if self._stop.is_set():
                                return
                            if not line:
                                continue
                            event = json.loads(line)
                            obj = event.get("object") or {}
                            if event.get("type") == "ERROR":
                                rv = ""  # too old: list again
                                break
                            rv = obj.get("metadata", {}).get("resourceVersion", rv)
                            if event.get("type") in ("ADDED", "MODIFIED"):
                                self._pod(c, obj)
                        else:
                            rv = ""  # the watch ended: list again, as kubelet resyncs
            except (httpx.HTTPError, json.JSONDecodeError, KeyError) as exc:
                if not self._stop.is_set():
                    log.warning("pod watch: %s", exc)
                    time.sleep(0.5)

    def _pod(self, c: httpx.Client, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        node = (pod.get("spec") or {}).get("nodeName")
        with self._lock:
            if node not in self.nodes:
                return
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        if meta.get("deletionTimestamp"):
            if uid in self._deleting:
                return
            self._deleting.add(uid)
            grace = float(meta.get("deletionGracePeriodSeconds") or 0)
            timer = threading.Timer(grace, self._delete, (node, ns, name, uid))
            timer.daemon = True
            timer.start()
            return
        status = pod.get("status") or {}
        if status.get("phase") not in (None, "Pending") or uid in self._admitted:
            return
        self._admitted.add(uid)
        refused = self._admit(node, pod)
        if refused is not None:
            self._patch(c, f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": {
                "phase": "Failed", "reason": "UnexpectedAdmissionError",
                "message": f"Allocate failed: {refused}"}})  # fmt: skip
            return
        self._ips += 1
        ip = f"10.244.{self._ips // 250}.{self._ips % 250 + 1}"
        containers = [c_["name"] for c_ in pod["spec"].get("containers") or []]
        ready = {"lastProbeTime": None, "lastTransitionTime": _stamp(), "status": "True"}
        body = {
            "status": {
                "phase": "Running",
                "hostIP": "127.0.0.1",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "startTime": _stamp(),
                "conditions": [
                    {"type": t, **ready}
                    for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                ],
                "containerStatuses": [
                    {
                        "name": cname,
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "image": "fake",
                        "imageID": "fake",
                        "state": {"running": {"startedAt": _stamp()}},
                    }
                    for cname in containers
                ],
            }
        }
        resp = self._patch(c, f"/api/v1/namespaces/{ns}/pods/{name}/status", body)
        if resp.status_code == 200:
            self.started_pods += 1
        elif resp.status_code != 404:
            log.warning("pod %s/%s status: %s %s", ns, name, resp.status_code, resp.text[:200])

    def _delete(self, node: str, ns: str, name: str, uid: str) -> None:
        # The containers have ended: their devices are free before the pod object goes, so the
        # pod that preempted it finds them free at admission.
        manager = self.device_managers.get(node)
        if manager is not None:
            manager.release(f"{ns}/{name}")
        try:
            with self.cp.client() as c:
                c.request(
                    "DELETE",
                    f"/api/v1/namespaces/{ns}/pods/{name}",
                    json={"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
                )
        except httpx.HTTPError as exc:
            log.warning("delete pod %s/%s: %s", ns, name, exc)
        finally:
            self._deleting.discard(uid)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start heartbeats and the pod watch."""
        for target in (self._heartbeats, self._pods):
            t = threading.Thread(target=target, name=f"fake-kubelet-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop both loops and every device manager."""
        for manager in self.device_managers.values():
            manager.stop()
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2.0)
