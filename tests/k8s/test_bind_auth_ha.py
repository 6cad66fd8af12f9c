"""Bind through the API server, agent authentication with TokenReview, replicas, the Lease."""

import asyncio

import orjson

from scheduler_extender.k8s.leader import LeaseElector
from scheduler_extender.telemetry.decode import report_from
from tests.builders import args_names, gpu, pod, report
from tests.k8s.conftest import eventually, make_api, running_extender


def bind_body(name, node, uid=None):
    return {
        "PodName": name,
        "PodNamespace": "default",
        "PodUID": uid or f"uid-{name}",
        "Node": node,
    }


async def ready(app):
    await eventually(lambda: app.state.ctx.ready)


async def test_bind_writes_the_assignment_with_the_binding_and_is_idempotent(kube, kubeconfig):
    async with running_extender(kubeconfig) as (app, client):
        await ready(app)
        app.state.ctx.state.ingest(
            report_from(report("n1", [gpu(0, memory_used_mib=15000.0), gpu(1, uuid="GPU-free")]))
        )
        kube.add_node("n1")
        spec = pod("p1", blocks=2, qos="training")
        kube.add_pod("p1", uid="uid-p1", limits={"edgegpu.io/gpu-mem-block": "2"},
                     annotations={"edgegpu.io/qos": "training"})  # fmt: skip
        await eventually(lambda: ("default", "p1") in app.state.ctx.sync.pods)
        await client.post("/filter", json=args_names(spec, ["n1"]))
        resp = await client.post("/bind", json=bind_body("p1", "n1"))
        assert resp.json() == {"Error": ""}
        stored = kube.get("pods", "p1")
        assert stored["spec"]["nodeName"] == "n1"
        annotations = stored["metadata"]["annotations"]
        assert annotations["edgegpu.io/gpu-index"] == "1"
        assert annotations["edgegpu.io/gpu-uuid"] == "GPU-free"
        assert annotations["edgegpu.io/assigned-at"].endswith("Z")
        # One call: the API server writes the Binding's annotations on the pod as it binds it,
        # so the device plugin finds the choice before the pod can start.
        assert [r[0] for r in kube.requests if "/pods/p1" in r[1]] == ["POST"]
        # A retried bind (its first answer lost) is a success, and holds the same GPU.
        assert (await client.post("/bind", json=bind_body("p1", "n1"))).json() == {"Error": ""}
        state = app.state.ctx.state
        await eventually(
            lambda: state.allocations.expires_at("uid-p1") is None
        )  # read back from the pod
        assert state.allocations.get("uid-p1").gpu_indices == (1,)


async def test_a_pod_without_gpus_is_bound_without_annotations_and_holds_host_room(
    kube, kubeconfig
):
    async with running_extender(kubeconfig) as (app, client):
        await ready(app)
        kube.add_node("n1", allocatable={"cpu": "16", "memory": "64Gi"})
        kube.add_pod("web", uid="uid-web", requests={"cpu": "2", "memory": "1Gi"})
        spec = pod("web", blocks=None, requests={"cpu": "2", "memory": "1Gi"})
        assert (await client.post("/filter", json=args_names(spec, ["n1"]))).json()[
            "NodeNames"
        ] == ["n1"]
        assert (await client.post("/bind", json=bind_body("web", "n1"))).json() == {"Error": ""}
        stored = kube.get("pods", "web")
        assert stored["spec"]["nodeName"] == "n1"
        assert not any(k.startswith("edgegpu.io/") for k in stored["metadata"]["annotations"])
        assert not any(r[0] == "PATCH" and "/pods/web" in r[1] for r in kube.requests)
        state = app.state.ctx.state
        await eventually(lambda: state.host.free("n1") == (14_000, 64_512))


async def test_a_bind_refused_by_the_api_server_releases_the_reservation(kube, kubeconfig):
    async with running_extender(kubeconfig) as (app, client):
        await ready(app)
        app.state.ctx.state.ingest(report_from(report("n1")))
        kube.add_pod("p2", uid="uid-p2", node="elsewhere")
        await client.post("/filter", json=args_names(pod("p2"), ["n1"]))
        resp = await client.post("/bind", json=bind_body("p2", "n1"))
        assert "already bound to 'elsewhere'" in resp.json()["Error"]
        assert app.state.ctx.state.allocations.get("uid-p2") is None
        resp = await client.post("/bind", json=bind_body("ghost", "n1"))
        assert resp.json()["Error"]  # never filtered


async def test_tokenreview_lets_an_agent_report_for_its_own_node_only(kube, kubeconfig):
    kube.add_node("n1")
    kube.add_node("n2")
    kube.add_pod(
        "agent-n1",
        "edgegpu-system",
        node="n1",
        uid="uid-agent-n1",
        service_account="edgegpu-node-agent",
    )
    kube.add_token("good", "edgegpu-system", "edgegpu-node-agent", "agent-n1", "uid-agent-n1")
    kube.add_token("other-sa", "default", "default", "agent-n1", "uid-agent-n1")
    async with running_extender(kubeconfig) as (app, client):
        await ready(app)

        async def push(node, token):
            headers = {"Content-Type": "application/json"}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            return await client.post(
                "/v1/telemetry", content=orjson.dumps(report(node)), headers=headers
            )

        assert (await push("n1", "good")).status_code == 200
        wrong = await push("n2", "good")
        assert wrong.status_code == 403 and "runs on 'n1'" in wrong.json()["error"]
        assert (await push("n1", "forged")).status_code == 401
        assert (await push("n1", None)).status_code == 401
        assert (await push("n1", "other-sa")).status_code == 403
        reviews = len(kube.requests_to("tokenreviews"))
        assert (await push("n1", "good")).status_code == 200
        assert len(kube.requests_to("tokenreviews")) == reviews  # cached
        registry = app.state.ctx.metrics.registry
        sample = registry.get_sample_value
        assert sample("edgegpu_extender_telemetry_reports_total", {"result": "unauthorized"}) == 2
        assert sample("edgegpu_extender_telemetry_reports_total", {"result": "forbidden"}) == 2


async def test_two_replicas_against_one_api_server_answer_identically(kube, kubeconfig):
    for i in range(6):
        kube.add_node(f"n{i}", {"edgegpu.io/rack": f"rack-{i % 2}"})
    reports = [
        report(f"n{i}", [gpu(0, temperature_c=40.0 + 9 * i), gpu(1, memory_used_mib=2000.0 * i)])
        for i in range(6)
    ]
    async with (
        running_extender(kubeconfig, identity="a") as (app_a, a),
        running_extender(kubeconfig, identity="b") as (app_b, b),
    ):
        await ready(app_a)
        await ready(app_b)
        for r in reports:  # agents push to every replica
            for app in (app_a, app_b):
                app.state.ctx.state.ingest(report_from(r))
        names = [f"n{i}" for i in range(6)]
        for spec in (
            pod("x", qos="training", group="job"),
            pod("y", blocks=3),
            pod("z", whole=1, blocks=None),
        ):
            body = args_names(spec, names)
            for verb in ("/filter", "/prioritize"):
                assert (await a.post(verb, json=body)).json() == (
                    await b.post(verb, json=body)
                ).json()
        leaders = [app.state.ctx.leader for app in (app_a, app_b)]
        await eventually(
            lambda: sorted([app_a.state.ctx.leader, app_b.state.ctx.leader]) == [False, True]
        )
        assert leaders.count(True) <= 1


async def test_the_lease_moves_to_the_other_replica_when_the_holder_stops(kube, kubeconfig):
    api = make_api(kubeconfig)
    a = LeaseElector(
        api,
        namespace="edgegpu-system",
        name="lease",
        identity="a",
        lease_duration_s=1.0,
        retry_s=0.1,
    )
    b = LeaseElector(
        api,
        namespace="edgegpu-system",
        name="lease",
        identity="b",
        lease_duration_s=1.0,
        retry_s=0.1,
    )
    a.start()
    await eventually(lambda: a.is_leader)
    b.start()
    await asyncio.sleep(0.5)
    assert not b.is_leader  # a keeps renewing
    await asyncio.to_thread(a.stop)
    await eventually(lambda: b.is_leader, timeout_s=5)
    lease = kube.get("leases", "lease", "edgegpu-system")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] >= 1
    await asyncio.to_thread(b.stop)


def test_a_silent_holder_loses_the_lease_after_its_duration(kubeconfig):
    api = make_api(kubeconfig)
    now = [0.0]
    a = LeaseElector(
        api, namespace="ns", name="l", identity="a", lease_duration_s=10, clock=lambda: now[0]
    )
    b = LeaseElector(
        api, namespace="ns", name="l", identity="b", lease_duration_s=10, clock=lambda: now[0]
    )
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False
    now[0] = 9.0
    assert b.try_acquire_or_renew() is False
    now[0] = 10.5  # b has seen the same renewTime for longer than the lease duration
    assert b.try_acquire_or_renew() is True
    assert a.try_acquire_or_renew() is False


def test_eviction_honours_pod_disruption_budgets(kube, kubeconfig):
    import pytest

    from scheduler_extender.k8s.client import KubeError

    api = make_api(kubeconfig)
    kube.add_pod("web-0", labels={"app": "web"})
    kube.add_pod("batch-0", labels={"app": "batch"})
    kube.put("poddisruptionbudgets", {"metadata": {"name": "web", "namespace": "default"},
                                      "spec": {"selector": {"matchLabels": {"app": "web"}}},
                                      "status": {"disruptionsAllowed": 0}})  # fmt: skip
    with pytest.raises(KubeError) as info:
        api.evict_pod("default", "web-0")
    assert info.value.status == 429 and "disruption budget" in str(info.value)
    assert kube.get("pods", "web-0") is not None
    api.evict_pod("default", "batch-0")
    assert kube.get("pods", "batch-0") is None
    with pytest.raises(KubeError) as gone:
        api.evict_pod("default", "batch-0")
    assert gone.value.status == 404


async def test_bind_without_a_filter_on_this_process_reads_the_pod_from_the_cluster(
    kube, kubeconfig
):
    async with running_extender(kubeconfig) as (app, client):
        await ready(app)
        app.state.ctx.state.ingest(report_from(report("n1", [gpu(0, uuid="GPU-only")])))
        kube.add_node("n1")
        kube.add_pod("p1", uid="uid-p1", limits={"edgegpu.io/gpu-mem-block": "1"})
        # Never filtered here (another replica did, or this process restarted since).
        assert (await client.post("/bind", json=bind_body("p1", "n1"))).json() == {"Error": ""}
        stored = kube.get("pods", "p1")
        assert stored["spec"]["nodeName"] == "n1"
        assert stored["metadata"]["annotations"]["edgegpu.io/gpu-uuid"] == "GPU-only"
        # A uid that is not the pod's (deleted and created again) is refused, not bound.
        kube.add_pod("p2", uid="uid-p2-new", limits={"edgegpu.io/gpu-mem-block": "1"})
        resp = await client.post("/bind", json=bind_body("p2", "n1", uid="uid-p2-old"))
        assert "is not in the cluster" in resp.json()["Error"]
        assert not kube.get("pods", "p2")["spec"].get("nodeName")


async def test_the_node_filter_chooses_is_reserved_until_bind_so_the_next_filter_sees_it(
    kube, kubeconfig
):
    async with running_extender(kubeconfig) as (app, client):
        await ready(app)
        # One GPU with room for exactly one 2-block pod (8192 MiB / 4096).
        app.state.ctx.state.ingest(report_from(report("n1", [gpu(0, memory_total_mib=8192.0)])))
        kube.add_node("n1")
        state = app.state.ctx.state
        for name in ("a", "b"):
            kube.add_pod(name, uid=f"uid-{name}", limits={"edgegpu.io/gpu-mem-block": "2"})
        first = args_names(pod("a", blocks=2), ["n1"])
        assert (await client.post("/filter", json=first)).json()["NodeNames"] == ["n1"]
        assert state.reserved("uid-a")
        # The scheduler filters the next pod before it has bound the first: the GPU is held.
        second = args_names(pod("b", blocks=2), ["n1"])
        body = (await client.post("/filter", json=second)).json()
        assert body["FailedAndUnresolvableNodes"] == {
            "n1": "edgegpu: not enough free gpu-mem-blocks on one gpu"
        }
        # The bind takes the reservation over: an assumed assignment, no longer a reservation.
        assert (await client.post("/bind", json=bind_body("a", "n1"))).json() == {"Error": ""}
        assert not state.reserved("uid-a")
        assert state.allocations.get("uid-a").node == "n1"
        # A pod filtered again (its cycle did not bind) gives its reservation up and holds
        # the one of its new choice only.
        kube.delete("pods", "a")
        await eventually(lambda: state.allocations.get("uid-a") is None)
        for _ in range(2):
            assert (await client.post("/filter", json=second)).json()["NodeNames"] == ["n1"]
            assert state.reserved("uid-b")
        state.release("uid-b")
        assert (await client.post("/filter", json=first)).json()["NodeNames"] == ["n1"]


def test_api_calls_give_their_connection_back_so_binds_reuse_it(kube, kubeconfig):
    api = make_api(kubeconfig)
    kube.add_node("n1")
    for i in range(20):
        kube.add_pod(f"p{i}", uid=f"uid-p{i}")
    before = kube.connections
    for i in range(20):
        api.bind_pod("default", f"p{i}", f"uid-p{i}", "n1", {"edgegpu.io/gpu-index": "0"})
        api.get_node("n1")
    assert kube.get("pods", "p19")["spec"]["nodeName"] == "n1"
    assert kube.connections - before <= 2  # one kept-alive connection, not one per call
