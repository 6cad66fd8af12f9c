from scheduler_extender.policy.rules import TERMS
from tests.builders import args_names, gpu, pod, report


async def test_explain_lists_every_term_before_and_after_weighting(client):
    await client.post("/v1/telemetry", json=report("a", [gpu(0, temperature_c=57.5)]))
    await client.post("/v1/telemetry", json=report("b", [gpu(0, temperature_c=95.0)]))
    resp = await client.post(
        "/debug/explain", json=args_names(pod(qos="training"), ["a", "b", "c"])
    )
    assert resp.status_code == 200
    body = resp.json()
    assert body["pod"]["qos"] == "training"
    by_node = {n["node"]: n for n in body["nodes"]}
    assert by_node["a"]["verdict"] == "passed"
    assert by_node["b"] == by_node["b"] | {"verdict": "failed", "reason": "edgegpu: gpu too hot"}
    assert by_node["c"]["verdict"] == "unresolvable"
    terms = by_node["a"]["terms"]
    assert set(terms) == set(TERMS)
    assert terms["thermal"]["value"] == 0.5
    total = sum(t["weight"] for t in terms.values())
    assert round(sum(t["weighted"] for t in terms.values()), 3) == round(
        by_node["a"]["score_exact"], 3
    )
    assert terms["thermal"]["weighted"] == round(0.5 * terms["thermal"]["weight"] / total, 4)


async def test_explain_gives_each_gpu_its_own_reason(client):
    full = 16384.0 - 1024.0  # less than one block free
    gpus = [
        gpu(0, memory_used_mib=full),
        gpu(1, health="unhealthy", health_reasons=["xid:79"]),
        gpu(2, temperature_c=95.0),
        gpu(3),
    ]
    await client.post("/v1/telemetry", json=report("a", gpus))
    await client.post("/v1/telemetry", json=report("b", gpus[:3]))
    body = (await client.post("/debug/explain", json=args_names(pod(blocks=2), ["a", "b"]))).json()
    by_node = {n["node"]: n for n in body["nodes"]}
    reasons = [g["reason"] for g in by_node["a"]["gpu_reasons"]]
    assert reasons[0] == "0 free blocks, 2 asked", reasons
    assert reasons[1] == "unhealthy: xid:79"
    assert reasons[2] == "too hot (95 °C)"
    assert reasons[3] == "chosen: bind gives this one"
    # b's only GPU with room is the XID one: the node's reason says so, and so does the GPU's.
    assert by_node["b"]["reason"] == "edgegpu: the gpu with room is unhealthy"
    assert [g["reason"] for g in by_node["b"]["gpu_reasons"]][1] == "unhealthy: xid:79"


async def test_explain_refuses_a_malformed_body_with_400(client):
    resp = await client.post(
        "/debug/explain", content=b"{", headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400
    assert "not valid JSON" in resp.json()["error"]


async def test_one_node_in_full_and_an_unknown_node_is_404(client):
    await client.post(
        "/v1/telemetry",
        json=report("a", [gpu(0, processes=[{"pid": 1, "pod_uid": "p", "used_mib": 10}])]),
    )
    full = (await client.get("/debug/nodes/a")).json()
    assert full["gpus"][0]["processes"] == [
        {"pid": 1, "pod": None, "container": None, "used_mib": 10.0}
    ]
    assert (await client.get("/debug/nodes/zzz")).status_code == 404


async def test_policy_health_readiness_metrics_and_docs_answer(client):
    policy = (await client.get("/debug/policy")).json()
    assert policy["source"] == "defaults"
    assert policy["policy"]["spec"]["thermalThrottling"]["maxTemp"] == 85
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).status_code == 200
    await client.post("/filter", json=args_names(pod(qos="training"), ["nobody"]))
    text = (await client.get("/metrics")).text
    assert 'edgegpu_extender_request_duration_seconds_count{verb="filter"} 1.0' in text
    assert (
        'edgegpu_extender_decisions_total{reason="telemetry_missing",result="unresolvable",verb="filter"} 1.0'
        in text
    )
    assert (await client.get("/docs")).status_code == 200
    spec = (await client.get("/openapi.json")).json()
    assert {
        "/filter",
        "/prioritize",
        "/preempt",
        "/bind",
        "/v1/telemetry",
        "/debug/explain",
    } <= set(spec["paths"])


async def test_every_ref_of_the_openapi_document_resolves(client):
    """The telemetry schema's ``#/$defs/...`` references resolved nowhere."""
    spec = (await client.get("/openapi.json")).json()
    refs: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "$ref":
                    refs.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(spec)
    assert "#/components/schemas/TelemetryReport" in refs
    for ref in refs:
        target = spec
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        assert isinstance(target, dict), ref


async def test_telemetry_age_is_exported_per_node(client, clock):
    await client.post("/v1/telemetry", json=report("a"))
    clock.advance(7.5)
    text = (await client.get("/metrics")).text
    assert 'edgegpu_extender_telemetry_age_seconds{node="a"} 7.5' in text


async def test_debug_endpoints_are_loopback_only_unless_opened_or_turned_off():
    """``--debug-endpoints loopback|on|off`` restricts / and /debug/*; ops routes stay."""
    import httpx

    from scheduler_extender.api.app import create_app
    from scheduler_extender.config import ExtenderSettings

    assert ExtenderSettings().debug_endpoints == "loopback"
    for mode, peer, shown in [("loopback", "10.0.0.7", False), ("loopback", "127.0.0.1", True),
                              ("off", "127.0.0.1", False), ("on", "10.0.0.7", True)]:  # fmt: skip
        app = create_app(ExtenderSettings(debug_endpoints=mode))
        transport = httpx.ASGITransport(app=app, client=(peer, 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            for path in ("/", "/debug/nodes", "/debug/policy"):
                assert ((await c.get(path)).status_code == 200) is shown, (mode, peer, path)
            assert (await c.get("/healthz")).status_code == 200
            assert (await c.get("/metrics")).status_code == 200


async def test_the_docs_page_loads_swagger_ui_from_the_extender_not_a_cdn(client):
    page = (await client.get("/docs")).text
    assert "docs/static/swagger-ui-bundle.js" in page and "cdn" not in page.lower()
    script = await client.get("/docs/static/swagger-ui-bundle.js")
    css = await client.get("/docs/static/swagger-ui.css")
    assert script.status_code == 200 and len(script.content) > 100_000
    assert css.status_code == 200 and "swagger-ui" in css.text
    assert (await client.get("/redoc")).status_code == 404


async def test_the_status_page_is_self_contained_and_polls_the_debug_endpoints(client):
    resp = await client.get("/")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    page = resp.text
    assert 'fetch("debug/nodes")' in page and 'fetch("debug/remediation")' in page
    page = page.replace('"http://www.w3.org/2000/svg"', "")  # a namespace name, never fetched
    assert "http://" not in page and "https://" not in page and "<link" not in page
