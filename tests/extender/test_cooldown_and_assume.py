"""Time-dependent behaviour through the whole app, with an injected clock."""

from scheduler_extender.api.app import create_app
from tests.builders import args_names, gpu, pod, report
from tests.extender.test_api_scheduler import RecordingBinder


async def verdict(client, node="a", qos="inference"):
    body = (await client.post("/filter", json=args_names(pod(qos=qos), [node]))).json()
    if body["NodeNames"] == [node]:
        return "passed"
    return body["FailedNodes"].get(node) or body["FailedAndUnresolvableNodes"].get(node)


async def test_a_hot_gpu_is_excluded_until_it_has_been_below_max_temp_for_the_cool_down(
    client, clock
):
    await client.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=70.0)]))
    assert await verdict(client) == "passed"
    await client.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=85.0)]))
    assert await verdict(client) == "edgegpu: gpu too hot"
    clock.advance(10)
    await client.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=80.0)]))
    assert await verdict(client) == "edgegpu: gpu cooling down"
    node = (await client.get("/debug/nodes/a")).json()
    assert node["gpus"][0]["cool_down_until"] is not None
    clock.advance(299)
    await client.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=79.0)]))
    assert await verdict(client) == "edgegpu: gpu cooling down"
    clock.advance(1)
    assert await verdict(client) == "passed"


async def test_heating_up_during_the_cool_down_starts_it_again(client, clock):
    await client.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=90.0)]))
    await client.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=60.0)]))
    clock.advance(200)
    await client.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=86.0)]))
    await client.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=60.0)]))
    clock.advance(200)
    assert await verdict(client) == "edgegpu: gpu cooling down"


async def test_a_node_that_stops_reporting_turns_stale_for_training_only(client, clock):
    await client.post("/v1/telemetry", json=report("a", interval_s=5))
    clock.advance(15.1)
    assert await verdict(client, qos="training") == "edgegpu: gpu telemetry is stale"
    assert await verdict(client, qos="inference") == "passed"


async def test_a_burst_of_pods_cannot_pile_onto_one_cool_node(clock):
    import httpx

    binder = RecordingBinder()
    app = create_app(clock=clock, binder=binder)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        await client.post("/v1/telemetry", json=report("cool", [gpu(0, temperature_c=35.0)]))
        await client.post("/v1/telemetry", json=report("warm", [gpu(0, temperature_c=70.0)]))
        placed = []
        for i in range(8):
            p = pod(f"p{i}", blocks=1)
            names = ["cool", "warm"]
            filt = (await client.post("/filter", json=args_names(p, names))).json()
            if not filt["NodeNames"]:
                placed.append(None)
                continue
            scores = (
                await client.post("/prioritize", json=args_names(p, filt["NodeNames"]))
            ).json()
            best = max(scores, key=lambda h: (h["Score"], h["Host"] == "cool"))["Host"]
            bind = {
                "PodName": f"p{i}",
                "PodNamespace": "default",
                "PodUID": f"uid-p{i}",
                "Node": best,
            }
            assert (await client.post("/bind", json=bind)).json() == {"Error": ""}
            placed.append(best)
        # Each 16 GiB GPU holds 4 one-block pods: the burst spreads once the cool one is full.
        assert placed.count("cool") == 4
        assert placed.count("warm") == 4


async def test_assumed_blocks_expire_unless_telemetry_shows_the_pod(clock):
    import httpx

    app = create_app(clock=clock, binder=RecordingBinder())
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        await client.post("/v1/telemetry", json=report("a", [gpu(0, memory_total_mib=4096.0)]))
        for name in ("seen", "unseen"):
            await client.post("/filter", json=args_names(pod(name), ["a"]))
        await client.post(
            "/bind",
            json={"PodName": "seen", "PodNamespace": "default", "PodUID": "uid-seen", "Node": "a"},
        )
        assert await verdict(client) == "edgegpu: not enough free gpu-mem-blocks on one gpu"
        clock.advance(200)
        process = {"pid": 7, "pod_uid": "uid-seen", "used_mib": 3000}
        await client.post(
            "/v1/telemetry",
            json=report(
                "a", [gpu(0, memory_total_mib=4096.0, memory_used_mib=3000.0, processes=[process])]
            ),
        )
        clock.advance(200)  # past the first TTL, but telemetry renewed it
        assert await verdict(client) == "edgegpu: not enough free gpu-mem-blocks on one gpu"
        await client.post(
            "/v1/telemetry",
            json=report("a", [gpu(0, memory_total_mib=4096.0, memory_used_mib=0.0)]),
        )
        clock.advance(301)  # the pod is gone from telemetry: its reservation lapses
        assert await verdict(client) == "passed"
        await client.post(
            "/bind",
            json={
                "PodName": "unseen",
                "PodNamespace": "default",
                "PodUID": "uid-unseen",
                "Node": "a",
            },
        )
        clock.advance(301)
        assert await verdict(client) == "passed"


async def _one_block_pod_using(clock, total_mib: float, *used_mib: float) -> dict:
    """/debug/nodes/a after a one-block pod was bound there and reported using ``used_mib``
    (one process each)."""
    import httpx

    app = create_app(clock=clock, binder=RecordingBinder())
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        await client.post("/v1/telemetry", json=report("a", [gpu(0, memory_total_mib=total_mib)]))
        await client.post("/filter", json=args_names(pod("one"), ["a"]))
        await client.post(
            "/bind",
            json={"PodName": "one", "PodNamespace": "default", "PodUID": "uid-one", "Node": "a"},
        )
        procs = [
            {"pid": 7 + k, "pod_uid": "uid-one", "used_mib": u} for k, u in enumerate(used_mib)
        ]
        used = sum(used_mib)
        await client.post(
            "/v1/telemetry",
            json=report(
                "a", [gpu(0, memory_total_mib=total_mib, memory_used_mib=used, processes=procs)]
            ),
        )
        node: dict = (await client.get("/debug/nodes/a")).json()
        return node


async def test_memory_of_an_assigned_pod_is_not_counted_twice(clock):
    node = await _one_block_pod_using(clock, 8192.0, 4000.0)
    assert node["gpus"][0]["free_blocks"] == 1
    assert node["reservations"][0]["pod"] == "default/one"


async def test_a_new_uuid_or_a_report_without_the_gpu_does_not_end_its_cool_down(client, clock):
    """The same GPU reported under a new uuid, or left out of one report, passed
    the filter while it was still cooling down."""
    await client.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=92.0, uuid="GPU-x")]))
    await client.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=60.0, uuid="GPU-x")]))
    assert await verdict(client) == "edgegpu: gpu cooling down"
    await client.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=60.0, uuid="GPU-y")]))
    assert await verdict(client) == "edgegpu: gpu cooling down"
    await client.post("/v1/telemetry", json=report("a", [gpu(1, temperature_c=50.0, uuid="GPU-z")]))
    await client.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=60.0, uuid="GPU-y")]))
    assert await verdict(client) == "edgegpu: gpu cooling down"
    clock.advance(301)
    await client.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=60.0, uuid="GPU-y")]))
    assert await verdict(client) == "passed"


async def test_two_gpus_that_swap_indices_keep_their_own_states(client, clock):
    hot, cool = gpu(0, temperature_c=60.0, uuid="GPU-h"), gpu(1, temperature_c=50.0, uuid="GPU-c")
    await client.post(
        "/v1/telemetry", json=report("a", [gpu(0, temperature_c=95.0, uuid="GPU-h"), cool])
    )
    await client.post("/v1/telemetry", json=report("a", [hot, cool]))
    swapped = [gpu(0, temperature_c=50.0, uuid="GPU-c"), gpu(1, temperature_c=60.0, uuid="GPU-h")]
    await client.post("/v1/telemetry", json=report("a", swapped))
    node = (await client.get("/debug/nodes/a")).json()
    cooling = {g["uuid"]: g["cool_down_until"] is not None for g in node["gpus"]}
    assert cooling == {"GPU-c": False, "GPU-h": True}


async def test_a_pod_using_more_than_its_blocks_is_counted_at_its_real_use(clock):
    """A one-block pod using 12 GiB leaves the GPU with the blocks that are really
    free, not the three its reservation alone would leave."""
    node = await _one_block_pod_using(clock, 16384.0, 12288.0)
    assert node["gpus"][0]["free_blocks"] == 1  # 4 blocks − its 1 − 2 more it uses


async def test_a_pod_over_its_blocks_in_several_processes_is_counted_as_one(clock):
    node = await _one_block_pod_using(clock, 16384.0, 3000.0, 3000.0)
    assert node["gpus"][0]["free_blocks"] == 2  # 4 − its 1 − ceil(1904 / 4096) it uses beyond
