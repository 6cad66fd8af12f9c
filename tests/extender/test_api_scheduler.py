import orjson
import pytest

from scheduler_extender.api.app import create_app
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.domain import Assignment
from scheduler_extender.errors import BindError
from tests.builders import args_names, args_nodes, gpu, node_object, pod, report

JSON = {"content-type": "application/json"}


async def push(client, *reports):
    for r in reports:
        resp = await client.post("/v1/telemetry", json=r)
        assert resp.status_code == 200, resp.text
        assert resp.json()["accepted"] is True


async def test_filter_in_names_mode_answers_with_names_only(all_client):
    client = all_client
    await push(client, report("a"), report("b", [gpu(0, temperature_c=95.0)]))
    resp = await client.post("/filter", json=args_names(pod(qos="training"), ["a", "b", "ghost"]))
    assert resp.status_code == 200
    body = resp.json()
    assert body["NodeNames"] == ["a"]
    assert body["Nodes"] is None
    assert body["FailedNodes"] == {"b": "edgegpu: gpu too hot"}
    assert body["FailedAndUnresolvableNodes"] == {"ghost": "edgegpu: no gpu telemetry from node"}
    assert body["Error"] == ""


async def test_filter_in_nodes_mode_returns_the_same_node_objects_unchanged(all_client):
    client = all_client
    await push(client, report("a"), report("b", [gpu(0, health="unhealthy")]))
    nodes = [node_object("a", {"x": "1"}), node_object("b")]
    resp = await client.post("/filter", json=args_nodes(pod(), nodes))
    body = resp.json()
    assert body["NodeNames"] is None
    assert body["Nodes"]["items"] == [nodes[0]]
    assert body["FailedAndUnresolvableNodes"] == {"b": "edgegpu: every gpu is unhealthy"}


async def test_training_fails_closed_on_an_unknown_node_and_inference_fails_open(client):
    resp = await client.post("/filter", json=args_names(pod(qos="training"), ["ghost"]))
    assert resp.json()["FailedAndUnresolvableNodes"] == {
        "ghost": "edgegpu: no gpu telemetry from node"
    }
    resp = await client.post("/filter", json=args_names(pod(qos="inference"), ["ghost"]))
    assert resp.json()["NodeNames"] == ["ghost"]


async def test_prioritize_scores_only_the_names_sent_in_zero_to_ten(client):
    await push(
        client,
        report("cool", [gpu(0, temperature_c=35.0)]),
        report("warm", [gpu(0, temperature_c=80.0)]),
    )
    resp = await client.post("/prioritize", json=args_names(pod(qos="training"), ["warm", "cool"]))
    assert resp.status_code == 200
    scores = {h["Host"]: h["Score"] for h in resp.json()}
    assert set(scores) == {"warm", "cool"}
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores.values())
    assert scores["cool"] > scores["warm"]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"{not json", id="broken json"),
        pytest.param(b"", id="empty body"),
        pytest.param(b'{"Pod": 7, "NodeNames": ["a"]}', id="pod is a number"),
        pytest.param(b'{"Pod": {}, "NodeNames": {"a": 1}}', id="names is an object"),
        pytest.param(
            b'{"Pod": {"spec": {"containers": [{"resources": {"limits": {"edgegpu.io/gpu-mem-block": "x"}}}]}}, "NodeNames": ["a"]}',
            id="bad quantity",
        ),
        pytest.param(
            b'{"Pod": {"spec": {"containers": "oops"}}, "NodeNames": ["a"]}',
            id="containers not a list",
        ),
        pytest.param(b"\xff\xfe\x00", id="not utf-8"),
    ],
)
async def test_malformed_bodies_get_200_with_an_error_never_a_500(client, body):
    resp = await client.post("/filter", content=body, headers=JSON)
    assert resp.status_code == 200
    assert resp.json()["Error"]
    assert "Traceback" not in resp.text
    resp = await client.post("/prioritize", content=body, headers=JSON)
    assert resp.status_code == 200 and resp.json() == []
    resp = await client.post("/bind", content=body, headers=JSON)
    assert resp.status_code == 200 and resp.json()["Error"]
    resp = await client.post("/preempt", content=body, headers=JSON)
    assert resp.status_code == 200 and resp.json() == {"NodeNameToMetaVictims": {}}


async def test_a_body_over_the_cap_is_refused_without_a_500(clock):
    app = create_app(ExtenderSettings(max_request_bytes=1000), clock=clock)
    import httpx

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        resp = await c.post("/filter", json=args_names(pod(), [f"n{i}" for i in range(500)]))
        assert resp.status_code == 200
        assert "over the limit" in resp.json()["Error"]


async def test_ten_thousand_unknown_nodes_are_answered(client):
    names = [f"node-{i:05d}" for i in range(10_000)]
    resp = await client.post("/filter", json=args_names(pod(qos="training"), names))
    body = resp.json()
    assert body["NodeNames"] == []
    assert len(body["FailedAndUnresolvableNodes"]) == 10_000
    resp = await client.post("/prioritize", json=args_names(pod(qos="inference"), names))
    assert [h["Host"] for h in resp.json()] == names


async def test_a_pod_asking_for_no_gpu_passes_every_node_for_kube_scheduler_to_score(client):
    # Without fragmentation scoring the policy prefers no node for it: every one is answered.
    resp = await client.post("/filter", json=args_names(pod(blocks=None), ["x", "y"]))
    assert resp.json()["NodeNames"] == ["x", "y"]


async def test_filter_answers_only_the_best_node_and_reserves_the_pods_gpus_there(clock):
    binder = RecordingBinder()
    app, client = await make_client(clock, binder)
    state = app.state.ctx.state
    async with client:
        await push(
            client,
            report("warm", [gpu(0, temperature_c=80.0)]),
            report("cool", [gpu(0, temperature_c=35.0)]),
            report("hot", [gpu(0, temperature_c=95.0)]),
        )
        body = args_names(pod("p", qos="training"), ["warm", "cool", "hot"])
        answer = (await client.post("/filter", json=body)).json()
        # The others are left out, not failed: kube-scheduler has nothing left to score.
        assert answer["NodeNames"] == ["cool"]
        assert answer["FailedNodes"] == {} and answer["FailedAndUnresolvableNodes"] == {}
        held = state.allocations.get("uid-p")
        assert state.reserved("uid-p") and held is not None and held.node == "cool"
        bind = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "cool"}
        assert (await client.post("/bind", json=bind)).json() == {"Error": ""}
        assert binder.calls[-1].node == "cool" and not state.reserved("uid-p")


async def test_a_node_that_has_not_reported_is_chosen_only_when_no_reported_node_fits(clock):
    binder = RecordingBinder()
    _, client = await make_client(clock, binder)
    async with client:
        await push(client, report("real", [gpu(0, memory_total_mib=8192.0)]))  # two blocks
        for k in range(3):
            body = args_names(pod(f"p{k}", qos="inference", blocks=1), ["ghost", "real"])
            # Inference fails open on a node without telemetry, but bind has no GPU to give
            # there: the node that reported is answered while it has room.
            expected = ["real"] if k < 2 else ["ghost"]
            assert (await client.post("/filter", json=body)).json()["NodeNames"] == expected


async def test_with_every_fitting_node_answered_prioritize_reserves_the_best_scored(clock):
    settings = ExtenderSettings(filter_answer="all")
    app, client = await make_client(clock, RecordingBinder(), settings)
    state = app.state.ctx.state
    async with client:
        await push(client, report("warm", [gpu(0, temperature_c=80.0)]), report("cool"))
        body = args_names(pod("p", qos="training"), ["warm", "cool"])
        assert (await client.post("/filter", json=body)).json()["NodeNames"] == ["warm", "cool"]
        assert not state.reserved("uid-p")
        await client.post("/prioritize", json=body)
        held = state.allocations.get("uid-p")
        assert state.reserved("uid-p") and held is not None and held.node == "cool"


async def test_equally_good_nodes_are_chosen_at_random_and_a_seed_repeats_the_choices(clock):
    names = [f"twin-{i}" for i in range(8)]
    runs = []
    for seed in (7, 7, 8):
        _, client = await make_client(clock, None, ExtenderSettings(tie_seed=seed))
        async with client:
            await push(client, *(report(n) for n in names))
            chosen = []
            for k in range(12):
                body = args_names(pod(f"p{k}", blocks=1), names)
                (node,) = (await client.post("/filter", json=body)).json()["NodeNames"]
                chosen.append(node)
        runs.append(chosen)
    assert runs[0] == runs[1]  # the same seed: the same choices
    assert len(set(runs[0])) > 1  # ties are spread, not the first name every time
    assert runs[2] != runs[0]


async def test_the_verbs_also_answer_under_a_path_prefix(clock):
    import httpx

    app = create_app(ExtenderSettings(path_prefix="/scheduler"), clock=clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        resp = await c.post("/scheduler/filter", json=args_names(pod(blocks=None), ["x"]))
        assert resp.status_code == 200 and resp.json()["NodeNames"] == ["x"]


async def test_bind_without_a_binder_reports_the_gpu_it_would_choose(client):
    await push(client, report("a", [gpu(0, memory_used_mib=15000.0), gpu(1, uuid="GPU-free")]))
    await client.post("/filter", json=args_names(pod("p1", uid="u1"), ["a"]))
    resp = await client.post(
        "/bind", json={"PodName": "p1", "PodNamespace": "default", "PodUID": "u1", "Node": "a"}
    )
    assert resp.status_code == 200
    error = resp.json()["Error"]
    assert "no binder configured" in error and "gpu 1 (GPU-free)" in error


async def test_bind_of_a_pod_never_filtered_is_a_clear_error(client):
    resp = await client.post(
        "/bind", json={"PodName": "p", "PodNamespace": "d", "PodUID": "nope", "Node": "a"}
    )
    assert "never filtered" in resp.json()["Error"]


class RecordingBinder:
    """A Binder that records what it was asked and can be told to fail."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[Assignment] = []
        self.fail = fail

    async def bind(self, assignment: Assignment) -> None:
        self.calls.append(assignment)
        if self.fail:
            raise BindError("the API server said no")


async def make_client(clock, binder, settings=None):
    import httpx

    app = create_app(settings, clock=clock, binder=binder)
    return app, httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 1)), base_url="http://x"
    )


async def test_bind_records_the_assignment_so_the_next_pod_sees_the_blocks_taken(clock):
    binder = RecordingBinder()
    _, client = await make_client(clock, binder)
    async with client:
        await push(client, report("a", [gpu(0, memory_total_mib=8192.0)]))
        for name in ("p1", "p2"):
            await client.post("/filter", json=args_names(pod(name, blocks=1), ["a"]))
            resp = await client.post(
                "/bind",
                json={
                    "PodName": name,
                    "PodNamespace": "default",
                    "PodUID": f"uid-{name}",
                    "Node": "a",
                },
            )
            assert resp.json() == {"Error": ""}
        resp = await client.post("/filter", json=args_names(pod("p3", blocks=1), ["a"]))
        assert resp.json()["FailedAndUnresolvableNodes"] == {
            "a": "edgegpu: not enough free gpu-mem-blocks on one gpu"
        }
        assert [a.gpu_indices for a in binder.calls] == [(0,), (0,)]
        assert binder.calls[0].gpu_uuids == ("GPU-0000",)


async def test_bind_is_idempotent_for_the_same_pod_and_node(clock):
    binder = RecordingBinder()
    app, client = await make_client(clock, binder)
    async with client:
        await push(client, report("a", [gpu(0, memory_total_mib=4096.0)]))
        await client.post("/filter", json=args_names(pod("p1"), ["a"]))
        bind = {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "a"}
        assert (await client.post("/bind", json=bind)).json() == {"Error": ""}
        assert (await client.post("/bind", json=bind)).json() == {"Error": ""}
        assert len(app.state.ctx.state.allocations) == 1


async def test_a_failed_bind_releases_the_reservation(clock):
    binder = RecordingBinder(fail=True)
    app, client = await make_client(clock, binder)
    async with client:
        await push(client, report("a"))
        await client.post("/filter", json=args_names(pod("p1"), ["a"]))
        resp = await client.post(
            "/bind",
            json={"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "a"},
        )
        assert "bind failed: the API server said no" in resp.json()["Error"]
        assert len(app.state.ctx.state.allocations) == 0


async def test_preempt_drops_hot_and_unhealthy_nodes_and_keeps_the_victim_order(client):
    await push(
        client,
        report("busy", [gpu(0, memory_used_mib=16000.0)]),
        report("hot", [gpu(0, temperature_c=99.0, memory_used_mib=16000.0)]),
        report("sick", [gpu(0, health="unhealthy")]),
    )
    victims = {
        n: {"Pods": [{"UID": f"{n}-1"}, {"UID": f"{n}-2"}], "NumPDBViolations": 0}
        for n in ("busy", "hot", "sick")
    }
    resp = await client.post(
        "/preempt",
        json={
            "Pod": pod(qos="training"),
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": victims,
        },
    )
    assert resp.json() == {"NodeNameToMetaVictims": {"busy": victims["busy"]}}


async def test_preempt_drops_a_node_where_our_known_victims_would_not_free_enough(clock):
    binder = RecordingBinder()
    _, client = await make_client(clock, binder)
    async with client:
        await push(
            client, report("a", [gpu(0, memory_total_mib=8192.0), gpu(1, memory_total_mib=8192.0)])
        )
        for name in ("v1", "v2"):
            await client.post(
                "/filter", json=args_names(pod(name, blocks=1, qos="inference"), ["a"])
            )
            await client.post(
                "/bind",
                json={
                    "PodName": name,
                    "PodNamespace": "default",
                    "PodUID": f"uid-{name}",
                    "Node": "a",
                },
            )
        placed = {a.pod_uid: a.gpu_indices for a in binder.calls}
        assert placed == {"uid-v1": (0,), "uid-v2": (0,)}
        # Block both gpus: a whole-gpu pod needs a GPU freed of *all* its pods.
        await client.post(
            "/filter", json=args_names(pod("w", blocks=None, whole=1, qos="training"), ["a"])
        )
        await client.post(
            "/bind",
            json={"PodName": "w", "PodNamespace": "default", "PodUID": "uid-w", "Node": "a"},
        )
        big = pod("big", blocks=2, qos="training")
        one_victim = {"a": {"Pods": [{"UID": "uid-v1"}], "NumPDBViolations": 0}}
        resp = await client.post("/preempt", json={"Pod": big, "NodeNameToMetaVictims": one_victim})
        assert resp.json() == {"NodeNameToMetaVictims": {}}
        both = {"a": {"Pods": [{"UID": "uid-v1"}, {"UID": "uid-v2"}], "NumPDBViolations": 0}}
        resp = await client.post("/preempt", json={"Pod": big, "NodeNameToMetaVictims": both})
        assert resp.json() == {"NodeNameToMetaVictims": both}


async def test_preempt_passes_placeholder_nodes_without_victims_through(client):
    await push(client, report("a"))
    body = {"Pod": pod(), "NodeNameToMetaVictims": {"a": {"Pods": [], "NumPDBViolations": 0}}}
    resp = await client.post("/preempt", content=orjson.dumps(body), headers=JSON)
    assert resp.json() == {"NodeNameToMetaVictims": {"a": {"Pods": [], "NumPDBViolations": 0}}}


async def test_cpu_only_pods_score_by_the_gpus_they_would_strand_and_bind_without_gpus(clock):
    from scheduler_extender.policy.document import parse_policy

    binder = RecordingBinder()
    app, client = await make_client(clock, binder)
    state = app.state.ctx.state
    state.set_policy(parse_policy({"spec": {"fragmentation": {"enabled": True}}}))
    async with client:
        big = [gpu(i, memory_total_mib=4096.0) for i in range(4)]
        await push(client, report("roomy", big), report("tight", big), report("cpu-node", []))
        state.set_host_allocatable("roomy", 64_000.0, 262_144.0)
        state.set_host_allocatable("tight", 16_000.0, 262_144.0)
        # GPU pods asking 4 cores and 16 GiB per GPU teach the demand per GPU (filtered where
        # they fit nowhere, so that no GPU is reserved for them).
        for i in range(3):
            gpu_pod = pod(f"g{i}", blocks=1, requests={"cpu": "4", "memory": "16Gi"})
            await client.post("/filter", json=args_names(gpu_pod, ["cpu-node"]))
        cpu_pod = pod("c", blocks=None, requests={"cpu": "12", "memory": "8Gi"})
        names = ["roomy", "tight", "cpu-node"]
        answer = (await client.post("/filter", json=args_names(cpu_pod, names))).json()
        resp = await client.post("/prioritize", json=args_names(cpu_pod, names))
        scores = {h["Host"]: h["Score"] for h in resp.json()}
        # 12 cores on "tight" would leave 4 for its 4 idle GPUs: it strands GPUs there.
        assert scores["tight"] < scores["roomy"] and scores["tight"] < scores["cpu-node"]
        # Every node that scores highest, for kube-scheduler to choose from (nothing to reserve).
        assert answer["NodeNames"] and "tight" not in answer["NodeNames"]
        assert all(scores[n] == max(scores.values()) for n in answer["NodeNames"])
        bind = {"PodName": "c", "PodNamespace": "default", "PodUID": "uid-c", "Node": "roomy"}
        assert (await client.post("/bind", json=bind)).json() == {"Error": ""}
        assert binder.calls[-1].gpu_indices == ()  # bound, with no GPU annotation to write
        assert state.allocations.get("uid-c") is None
        assert state.host.free("roomy") == (52_000, 262_144 - 8_192)


async def test_two_spellings_of_nodenames_cannot_poison_the_candidate_cache(client):
    await push(client, report("cool-1"), report("hot-1", [gpu(0, temperature_c=95.0)]))
    spec = orjson.dumps(pod("p", qos="training")).decode()
    poisoned = f'{{"Pod":{spec},"nodenames":["cool-1"],"NodeNames":["hot-1"]}}'
    resp = await client.post("/filter", content=poisoned, headers=JSON)
    assert resp.status_code == 200 and "given twice" in resp.json()["Error"]
    genuine = f'{{"Pod":{spec},"Nodes":null,"NodeNames":["hot-1"]}}'
    body = (await client.post("/filter", content=genuine, headers=JSON)).json()
    assert body["NodeNames"] == [] and body["FailedNodes"] == {"hot-1": "edgegpu: gpu too hot"}
    assert (await client.post("/prioritize", content=genuine, headers=JSON)).json() == [
        {"Host": "hot-1", "Score": 0}
    ]


@pytest.mark.parametrize("blocks", [2**63, "100000000000000000000"])
async def test_an_absurd_request_is_a_clear_error_not_an_internal_one(client, blocks):
    await push(client, report("a"))
    resp = await client.post("/filter", json=args_names(pod("p", blocks=blocks), ["a"]))
    assert resp.status_code == 200
    assert "more than any node has" in resp.json()["Error"]


async def test_a_verb_asked_with_get_is_405_with_allow_post(client):
    for path in ("/filter", "/prioritize", "/preempt", "/bind", "/v1/telemetry"):
        resp = await client.get(path)
        assert resp.status_code == 405 and resp.headers["allow"] == "POST", path


async def test_pods_that_ask_for_no_cpu_or_memory_come_and_go_without_an_internal_error(clock):
    binder = RecordingBinder()
    app, client = await make_client(clock, binder)
    state = app.state.ctx.state
    async with client:
        await push(client, report("n1"))
        state.set_host_allocatable("n1", 8_000.0, 32_768.0)
        for name in ("idle-a", "idle-b"):
            await client.post("/filter", json=args_names(pod(name, blocks=None), ["n1"]))
            bind = {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}",
                    "Node": "n1"}  # fmt: skip
            assert (await client.post("/bind", json=bind)).json() == {"Error": ""}
        state.host_pod("uid-heavy", "n1", 2_000, 1_024)
        for uid in ("uid-heavy", "uid-idle-a", "uid-idle-b"):
            state.host_pod_gone(uid)
        assert state.host.free("n1") == (8_000.0, 32_768.0)
