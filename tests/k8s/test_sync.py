"""Node, Pod and policy watches feed the decisions; watch drops and 410s are survived."""

import pytest

from scheduler_extender.telemetry.decode import report_from
from tests.builders import args_names, gpu, pod, report
from tests.k8s.conftest import eventually, running_extender

SEED = {
    "apiVersion": "kepler.io/v1",
    "kind": "GPUSchedulingPolicy",
    "metadata": {"name": "edge-gpu-policy"},
    "spec": {
        "powerSaving": {"enabled": True, "threshold": 70},
        "thermalThrottling": {"maxTemp": 85, "coolDownPeriod": "5m"},
    },
}


def push(app, *reports):
    for r in reports:
        assert app.state.ctx.state.ingest(report_from(r)).accepted


async def rack_of(client, node):
    return (await client.get(f"/debug/nodes/{node}")).json().get("rack")


async def test_ready_only_once_every_cache_is_synced_and_node_labels_set_the_rack(kube, kubeconfig):
    kube.add_node("n1", {"edgegpu.io/rack": "rack-a"})
    async with running_extender(kubeconfig) as (app, client):
        await eventually(lambda: app.state.ctx.ready)
        body = (await client.get("/readyz")).json()
        assert body["caches"] == {"nodes": True, "pods": True, "gpuschedulingpolicies": True}
        push(app, report("n1", labels={"edgegpu.io/rack": "agent-says"}))
        assert await rack_of(client, "n1") == "rack-a"  # the Node object wins over the agent
        kube.add_node("n1", {"edgegpu.io/rack": "rack-b"})

        async def moved():
            return await rack_of(client, "n1") == "rack-b"

        await eventually(moved)


async def test_a_new_policy_resource_changes_max_temp_live_and_a_bad_one_is_refused(
    kube, kubeconfig
):
    async with running_extender(kubeconfig) as (app, client):
        await eventually(lambda: app.state.ctx.ready)
        push(app, report("n1", [gpu(0, temperature_c=80.0)]))
        filt = args_names(pod(qos="training"), ["n1"])
        assert (await client.post("/filter", json=filt)).json()["NodeNames"] == ["n1"]
        cooler = {
            **SEED,
            "spec": {**SEED["spec"], "thermalThrottling": {"maxTemp": 75, "coolDownPeriod": "5m"}},
        }
        kube.put("gpuschedulingpolicies", cooler)
        await eventually(
            lambda: app.state.ctx.state.policy.spec.thermal_throttling.max_temp_c == 75
        )
        push(app, report("n1", [gpu(0, temperature_c=80.0)]))
        assert (await client.post("/filter", json=filt)).json()["FailedNodes"] == {
            "n1": "edgegpu: gpu too hot"
        }
        status = await eventually(
            lambda: (kube.get("gpuschedulingpolicies", "edge-gpu-policy") or {}).get("status")
        )
        assert status["conditions"][0]["status"] == "True"

        broken = {
            **SEED,
            "spec": {"thermalThrottling": {"maxTemp": "very", "coolDownPeriod": "soon"}, "typo": 1},
        }
        kube.put("gpuschedulingpolicies", broken)

        def refused():
            cond = (
                (kube.get("gpuschedulingpolicies", "edge-gpu-policy") or {}).get("status") or {}
            ).get("conditions") or [{}]
            return cond[0] if cond[0].get("status") == "False" else None

        cond = await eventually(refused)
        for key in ("maxTemp", "coolDownPeriod", "typo"):
            assert key in cond["message"]
        assert (
            app.state.ctx.state.policy.spec.thermal_throttling.max_temp_c == 75
        )  # the previous stays
        assert (await client.get("/readyz")).json()["policy_errors"]

        kube.delete("gpuschedulingpolicies", "edge-gpu-policy")
        await eventually(
            lambda: app.state.ctx.state.policy.spec.thermal_throttling.max_temp_c == 85
        )
        assert "deleted" in app.state.ctx.policy_source


async def test_a_dropped_watch_resumes_and_an_expired_one_relists(kube, kubeconfig):
    kube.add_node("n1", {"edgegpu.io/rack": "r1"})
    async with running_extender(kubeconfig) as (app, client):
        await eventually(lambda: app.state.ctx.ready)
        push(app, report("n1"))

        def gone():
            value = app.state.ctx.metrics.registry.get_sample_value(
                "edgegpu_extender_watch_restarts_total", {"resource": "nodes", "why": "gone"}
            )
            return value or 0.0

        kube.drop_watches()
        kube.add_node("n1", {"edgegpu.io/rack": "r2"})

        async def is_r(rack):
            return await rack_of(client, "n1") == rack

        nodes = next(r for r in app.state.ctx.sync.reflectors if r.name == "nodes")
        await eventually(lambda: is_r("r2"))
        assert gone() == 0  # resumed from its resourceVersion: no 410
        lists = nodes.relists
        kube.compact()  # history gone, open watches end: resuming gets 410, so it lists again
        kube.add_node("n1", {"edgegpu.io/rack": "r3"})
        await eventually(lambda: is_r("r3"))
        await eventually(lambda: nodes.relists > lists)
        text = (await client.get("/metrics")).text
        assert "edgegpu_extender_watch_restarts_total" in text


def test_a_410_during_the_watch_makes_the_reflector_list_again():
    import threading

    from scheduler_extender.k8s.client import Gone
    from scheduler_extender.k8s.watchers import Reflector

    lists, events, whys = [], [], []
    done = threading.Event()

    def lister():
        lists.append(1)
        return [{"metadata": {"name": f"n{len(lists)}"}}], str(len(lists))

    def watcher(rv, timeout):
        if rv == "1":
            yield {"type": "ADDED", "object": {"metadata": {"name": "x", "resourceVersion": "2"}}}
            raise Gone(410, "too old")
        done.set()
        yield from ()

    r = Reflector("nodes", lister, watcher, lambda items: events.append(("replace", len(items))),
                  lambda kind, obj: events.append((kind, obj["metadata"]["name"])), on_restart=whys.append)  # fmt: skip
    r.start()
    assert done.wait(5)
    r.stop()
    assert len(lists) >= 2 and whys[0] == "gone"
    assert events[:3] == [("replace", 1), ("ADDED", "x"), ("replace", 1)]


async def test_a_deleted_node_is_forgotten(kube, kubeconfig):
    kube.add_node("n1")
    async with running_extender(kubeconfig) as (app, client):
        await eventually(lambda: app.state.ctx.ready)
        push(app, report("n1"))
        kube.delete("nodes", "n1")
        await eventually(lambda: app.state.ctx.state.store.get("n1") is None)
        assert (await client.get("/debug/nodes/n1")).status_code == 404


@pytest.mark.parametrize("phase", ["Running", "Pending"])
async def test_pods_bound_with_annotations_hold_their_gpus_until_deleted(kube, kubeconfig, phase):
    async with running_extender(kubeconfig) as (app, client):
        await eventually(lambda: app.state.ctx.ready)
        push(app, report("n1", [gpu(0, memory_total_mib=8192.0)]))
        kube.add_pod("holder", node="n1", uid="uid-holder", phase=phase,
                     annotations={"edgegpu.io/gpu-index": "0", "edgegpu.io/gpu-uuid": "GPU-0000",
                                  "edgegpu.io/assigned-at": "2026-12-02T10:00:00Z"},
                     limits={"edgegpu.io/gpu-mem-block": "2"})  # fmt: skip
        state = app.state.ctx.state
        await eventually(lambda: state.allocations.get("uid-holder") is not None)
        filt = args_names(pod("new", blocks=1), ["n1"])
        assert (await client.post("/filter", json=filt)).json()["FailedAndUnresolvableNodes"] == {
            "n1": "edgegpu: not enough free gpu-mem-blocks on one gpu"
        }
        assert state.allocations.expires_at("uid-holder") is None  # authoritative, no TTL
        kube.delete("pods", "holder")
        await eventually(lambda: state.allocations.get("uid-holder") is None)
        assert (await client.post("/filter", json=filt)).json()["NodeNames"] == ["n1"]


async def test_host_room_is_allocatable_less_the_requests_of_bound_unfinished_pods(
    kube, kubeconfig
):
    kube.add_node("n1", allocatable={"cpu": "16", "memory": "64Gi"})
    async with running_extender(kubeconfig) as (app, client):
        await eventually(lambda: app.state.ctx.ready)
        state = app.state.ctx.state
        assert state.host.free("n1") == (16_000, 65_536)
        kube.add_pod("a", node="n1", uid="uid-a", phase="Running",
                     requests={"cpu": "1500m", "memory": "8Gi"})  # fmt: skip
        kube.add_pod("b", node="n1", uid="uid-b", phase="Running", limits={"cpu": "2"})
        kube.add_pod("pending", uid="uid-p", requests={"cpu": "4"})  # not bound: holds nothing
        await eventually(lambda: state.host.free("n1") == (12_500, 57_344))
        row = state.table.row("n1")
        assert state.table.column("host_cpu_free")[row] == 12_500
        kube.add_pod("b", node="n1", uid="uid-b", phase="Succeeded", limits={"cpu": "2"})
        await eventually(lambda: state.host.free("n1") == (14_500, 57_344))
        view = (await client.get("/debug/nodes/n1")).json()
        assert view["host_free"] == {"cpu_milli": 14_500, "memory_mib": 57_344}
        kube.delete("pods", "a")
        await eventually(lambda: state.host.free("n1") == (16_000, 65_536))
        kube.add_node("n1", allocatable={"cpu": "8", "memory": "oops"})
        await eventually(lambda: state.host.free("n1")[0] == 8_000)
        assert state.host.free("n1")[1] != state.host.free("n1")[1]  # unreadable: NaN


async def test_a_replica_that_starts_while_the_policy_is_refused_is_not_ready_until_it_is_fixed(
    kube, kubeconfig
):
    """It would serve its start-up policy (another block size, other limits) beside replicas
    that run the cluster's: not ready, so its rollout stops where everyone can see it."""
    kube.put("gpuschedulingpolicies", {**SEED, "spec": {**SEED["spec"], "memory": {"blockMiB": 1}}})
    async with running_extender(kubeconfig) as (app, client):
        await eventually(lambda: app.state.ctx.sync is not None and app.state.ctx.sync.synced)
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert any("blockMiB" in e for e in ready.json()["policy_errors"])
        kube.put("gpuschedulingpolicies", SEED)
        await eventually(lambda: app.state.ctx.ready)
        assert (await client.get("/readyz")).status_code == 200


async def test_deleting_a_refused_policy_leaves_every_replica_ready_on_its_start_up_policy(
    kube, kubeconfig
):
    kube.put("gpuschedulingpolicies", SEED)
    async with running_extender(kubeconfig) as (app, client):
        await eventually(lambda: app.state.ctx.ready)
        kube.put(
            "gpuschedulingpolicies", {**SEED, "spec": {**SEED["spec"], "memory": {"blockMiB": 1}}}
        )
        await eventually(lambda: app.state.ctx.sync.policy_errors)
        assert (await client.get("/readyz")).status_code == 200  # the accepted one stays
        assert "edgegpu_extender_policy_refused 1.0" in (await client.get("/metrics")).text
        kube.delete("gpuschedulingpolicies", "edge-gpu-policy")
        await eventually(lambda: "deleted" in app.state.ctx.policy_source)
        assert (await client.get("/readyz")).status_code == 200
        assert "edgegpu_extender_policy_refused 0.0" in (await client.get("/metrics")).text
