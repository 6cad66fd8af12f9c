"""Agent tokens: only a projected token made for the extender's audience may push."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.builders import report
from tests.fakes.fake_kube import FakeKube
from tests.k8s.conftest import eventually, running_extender


async def test_a_token_made_for_the_api_server_or_another_audience_cannot_push(
    tmp_path: Path,
) -> None:
    """A pod's ordinary ServiceAccount token (audience: the API server) or one projected for some
    other service is refused 401, though it names the agent's ServiceAccount and pod."""
    with FakeKube(bookmark_interval_s=0.2) as kube:
        kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
        kube.add_node("n1")
        kube.add_pod("agent-n1", "edgegpu-system", node="n1", uid="uid-agent-n1",
                     service_account="edgegpu-node-agent")  # fmt: skip
        sa = ("edgegpu-system", "edgegpu-node-agent", "agent-n1", "uid-agent-n1")
        kube.add_token("edgegpu", *sa)
        kube.add_token("api", *sa, audiences=("https://kubernetes.default.svc.cluster.local",))
        kube.add_token("vault", *sa, audiences=("vault",))
        async with running_extender(kubeconfig) as (app, client):
            await eventually(lambda: app.state.ctx.ready)

            async def push(token: str) -> int:
                resp = await client.post("/v1/telemetry", content=orjson.dumps(report("n1")),
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})  # fmt: skip
                return resp.status_code

            assert await push("edgegpu") == 200
            assert await push("api") == 401
            assert await push("vault") == 401


async def test_a_flood_of_made_up_tokens_leaves_the_threads_binds_use_free(tmp_path: Path) -> None:
    """Each new token costs a TokenReview; they run on a pool of their own, so while the API
    server is slow to answer them, bind's pod reads (the default executor) are not held up."""
    import asyncio
    import threading

    import httpx

    from scheduler_extender.api.app import create_app
    from scheduler_extender.config import ExtenderSettings

    release = threading.Event()

    class SlowReviews:
        def token_review(self, token: str, audiences: object = ()) -> dict[str, object]:
            release.wait(20.0)
            return {"authenticated": False, "error": "invalid bearer token"}

    (tmp_path / "kubeconfig").write_text("")
    app = create_app(ExtenderSettings(kubeconfig=tmp_path / "kubeconfig"), kube=SlowReviews())  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://extender") as client:
        pushes = [
            asyncio.create_task(
                client.post(
                    "/v1/telemetry",
                    content=orjson.dumps(report("n1")),
                    headers={
                        "Authorization": f"Bearer made-up-{i}",
                        "Content-Type": "application/json",
                    },
                )
            )
            for i in range(40)
        ]
        await asyncio.sleep(0.5)  # every push is waiting on its review by now
        try:
            assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 10.0) == "free"
        finally:
            release.set()
        assert {(await p).status_code for p in pushes} == {401}
