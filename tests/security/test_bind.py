"""Bind, tried by someone who reaches the extender's port: only the pod the scheduler means.

A bind names its pod by uid, the pod must belong to a scheduler the extender serves, and its
body must be sent as JSON (a browser on another site can send text/plain without asking).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from scheduler_extender.api.protocol import PeerCertificate
from scheduler_extender.cli.main import command_line
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.domain import Assignment, QosClass
from scheduler_extender.errors import BindError
from scheduler_extender.k8s.binder import KubeBinder
from scheduler_extender.k8s.client import KubeError
from scheduler_extender.telemetry.decode import report_from
from tests.builders import gpu, report
from tests.fakes.fake_kube import FakeKube
from tests.k8s.conftest import eventually, running_extender
from tests.security.test_extender_tls import with_peer

JSON = {"content-type": "application/json"}


def pending_pod(kube: FakeKube, name: str, uid: str, scheduler: str | None) -> None:
    """A pending pod asking for one GPU memory block, as the API server stores it."""
    spec: dict[str, Any] = {
        "containers": [{"name": "app", "image": "app:1",
                        "resources": {"limits": {"edgegpu.io/gpu-mem-block": "1"}}}],
    }  # fmt: skip
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    kube.put("pods", {"metadata": {"name": name, "namespace": "default", "uid": uid},
                      "spec": spec, "status": {"phase": "Pending"}})  # fmt: skip


def bind(name: str, uid: str, node: str = "n1") -> dict[str, str]:
    return {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": node}


def node_of(kube: FakeKube, name: str) -> str | None:
    pod = kube.get("pods", name)
    assert pod is not None
    node: str | None = pod["spec"].get("nodeName")
    return node


@asynccontextmanager
async def cluster(tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[FakeKube, Any, Any]]:
    """A fake API server with node n1, and an extender that has n1's GPU report."""
    with FakeKube(bookmark_interval_s=0.2) as kube:
        kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
        async with running_extender(kubeconfig, **settings) as (app, client):
            await eventually(lambda: app.state.ctx.ready)
            kube.add_node("n1")
            app.state.ctx.state.ingest(report_from(report("n1", [gpu(0)])))
            yield kube, app, client


async def test_a_bind_without_a_pod_uid_binds_nothing(tmp_path: Path) -> None:
    """An empty PodUID skipped the uid check: any pending pod could be bound by its name."""
    async with cluster(tmp_path) as (kube, app, client):
        pending_pod(kube, "victim", "uid-victim", "edgegpu-scheduler")
        await eventually(lambda: ("default", "victim") in app.state.ctx.sync.pods)
        resp = await client.post("/bind", json=bind("victim", ""))
        assert resp.status_code == 200
        assert "PodUID must not be empty" in resp.json()["Error"]
        assert node_of(kube, "victim") is None


async def test_a_bind_naming_another_uid_than_the_pods_binds_nothing(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (kube, _, client):
        pending_pod(kube, "victim", "uid-victim", "edgegpu-scheduler")
        resp = await client.post("/bind", json=bind("victim", "uid-guessed"))
        assert "is not in the cluster" in resp.json()["Error"]
        assert node_of(kube, "victim") is None


@pytest.mark.parametrize(
    "scheduler",
    [
        pytest.param("default-scheduler", id="the default scheduler"),
        pytest.param(None, id="no scheduler named (the API server's default)"),
        pytest.param("someone-elses-scheduler", id="another profile"),
    ],
)
async def test_a_pod_of_a_scheduler_the_extender_does_not_serve_is_not_bound(
    tmp_path: Path, scheduler: str | None
) -> None:
    """The right uid is not enough: the pod is not one our scheduler is placing."""
    async with cluster(tmp_path) as (kube, app, client):
        pending_pod(kube, "web", "uid-web", scheduler)
        resp = await client.post("/bind", json=bind("web", "uid-web"))
        error = resp.json()["Error"]
        assert "--scheduler-names" in error and "edgegpu-scheduler" in error
        assert node_of(kube, "web") is None
        registry = app.state.ctx.metrics.registry
        assert registry.get_sample_value(
            "edgegpu_extender_binds_total", {"result": "foreign_scheduler"}
        ) == 1.0  # fmt: skip


async def test_a_pod_of_a_served_scheduler_is_bound_with_its_gpu(tmp_path: Path) -> None:
    """Every name in ``scheduler_names`` is served; the pod is read from the cluster's copy."""
    served = ["edgegpu-scheduler", "batch"]
    async with cluster(tmp_path, scheduler_names=served) as (kube, _, client):
        for name, scheduler in (("a", "edgegpu-scheduler"), ("b", "batch")):
            pending_pod(kube, name, f"uid-{name}", scheduler)
            resp = await client.post("/bind", json=bind(name, f"uid-{name}"))
            assert resp.json() == {"Error": ""}
            assert node_of(kube, name) == "n1"
            pod = kube.get("pods", name)
            assert pod is not None and pod["metadata"]["annotations"]["edgegpu.io/gpu-index"] == "0"


@pytest.mark.parametrize(
    "content_type",
    [
        pytest.param("text/plain", id="text/plain"),
        pytest.param("application/x-www-form-urlencoded", id="a form"),
        pytest.param(None, id="no content type"),
    ],
)
async def test_a_bind_a_browser_could_send_cross_site_is_refused_415_and_binds_nothing(
    tmp_path: Path, content_type: str | None
) -> None:
    async with cluster(tmp_path) as (kube, _, client):
        pending_pod(kube, "victim", "uid-victim", "edgegpu-scheduler")
        headers = {"content-type": content_type} if content_type else {}
        body = b'{"PodName":"victim","PodNamespace":"default","PodUID":"uid-victim","Node":"n1"}'
        resp = await client.post("/bind", content=body, headers=headers)
        assert resp.status_code == 415
        assert node_of(kube, "victim") is None
        # The same bind as kube-scheduler sends it goes through.
        ok = await client.post("/bind", content=body, headers={"content-type": "application/json"})
        assert ok.json() == {"Error": ""} and node_of(kube, "victim") == "n1"


async def test_a_bind_with_another_certificate_of_the_schedulers_ca_binds_nothing(
    tmp_path: Path,
) -> None:
    """The extender's own serving certificate is of that CA too (made for client auth as well
    by Helm): whoever read its Secret could bind any pending pod."""
    async with cluster(tmp_path, client_ca_file=tmp_path / "ca.crt") as (kube, app, _):
        pending_pod(kube, "victim", "uid-victim", "edgegpu-scheduler")
        await eventually(lambda: ("default", "victim") in app.state.ctx.sync.pods)
        own = PeerCertificate("edgegpu-extender", ("edgegpu-extender.edgegpu-system.svc",))
        async with with_peer(app, own) as client:
            resp = await client.post("/bind", json=bind("victim", "uid-victim"))
            assert resp.status_code == 403 and "--client-cert-names" in resp.json()["error"]
        assert node_of(kube, "victim") is None
        async with with_peer(app, PeerCertificate("edgegpu-scheduler", ())) as client:
            resp = await client.post("/bind", json=bind("victim", "uid-victim"))
            assert resp.json() == {"Error": ""}
        assert node_of(kube, "victim") == "n1"


class ConflictingApi:
    """The API server's answers when a same-name pod of another uid is bound already."""

    def __init__(self, bound: dict[str, Any]) -> None:
        self.bound = bound

    def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        held = self.bound["metadata"]["uid"]
        raise KubeError(409, f"Precondition failed: UID in precondition: {uid}, UID in object "
                             f"meta: {held}")  # fmt: skip

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.bound


def test_a_conflict_is_success_only_when_the_pod_of_that_uid_is_bound_to_that_node() -> None:
    """A 409 was taken as "already bound here" by name alone: a pod deleted and created again
    under its name, bound to the same node, counted as the old pod's bind."""
    successor = {"metadata": {"name": "p", "namespace": "default", "uid": "uid-new"},
                 "spec": {"nodeName": "n1"}}  # fmt: skip
    binder = KubeBinder(ConflictingApi(successor))  # type: ignore[arg-type]
    old = Assignment(pod_uid="uid-old", namespace="default", name="p", node="n1",
                     gpu_indices=(0,), gpu_uuids=("GPU-0",), mem_blocks=1, whole=False,
                     qos=QosClass.INFERENCE, group=None, assigned_at=0.0)  # fmt: skip
    with pytest.raises(BindError, match="another pod"):
        binder.bind_blocking(old)
    # The pod of that uid, bound to that node already: a retried bind, which succeeds.
    binder.bind_blocking(dataclasses.replace(old, pod_uid="uid-new"))


def test_the_served_schedulers_come_from_a_flag_or_a_json_list_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cli = command_line()
    parsed = cli.parse_or_report(["--scheduler-names", "edgegpu-scheduler,default-scheduler"])
    assert parsed is not None
    assert parsed[0].scheduler_names == ["edgegpu-scheduler", "default-scheduler"]
    monkeypatch.setenv("EDGEGPU_SCHEDULER_NAMES", '["default-scheduler"]')
    assert ExtenderSettings().scheduler_names == ["default-scheduler"]
    monkeypatch.delenv("EDGEGPU_SCHEDULER_NAMES")
    assert ExtenderSettings().scheduler_names == ["edgegpu-scheduler"]
    assert command_line().parse_or_report(["--scheduler-names", ""]) is None
