"""The policy custom resource, live; agent tokens checked with TokenReview against the pod."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Cluster, until
from tests.e2e.edgegpu import NAMESPACE

POLICY = "/apis/kepler.io/v1/gpuschedulingpolicies/edge-gpu-policy"


def patch_policy(cluster: Cluster, spec: dict[str, Any]) -> None:
    resp = cluster.cp.request(
        "PATCH",
        POLICY,
        content=json.dumps({"spec": spec}),
        headers={"content-type": "application/merge-patch+json"},
    )
    assert resp.status_code == 200, resp.text


def accepted(cluster: Cluster) -> dict[str, Any]:
    doc = cluster.cp.get(POLICY) or {}
    conds = (doc.get("status") or {}).get("conditions") or []
    gen = doc["metadata"]["generation"]
    return next(
        (c for c in conds if c["type"] == "Accepted" and c.get("observedGeneration") == gen), {}
    )


def max_temp(cluster: Cluster) -> list[float]:
    out = []
    for ext in cluster.extenders:
        doc = ext.get("/debug/policy")
        out.append(doc["policy"]["spec"]["thermalThrottling"]["maxTemp"])
    return out


def test_a_policy_edit_reloads_and_an_invalid_one_is_refused(cluster: Cluster) -> None:
    try:
        patch_policy(cluster, {"thermalThrottling": {"maxTemp": 83}})
        until("maxTemp 83 on every replica", lambda: max_temp(cluster) == [83, 83])
        until("Accepted=True", lambda: accepted(cluster).get("status") == "True")
        patch_policy(cluster, {"thermalThrottling": {"coolDownPeriod": "five minutes"}})
        cond = until(
            "Accepted=False", lambda: (c := accepted(cluster)).get("status") == "False" and c
        )
        assert "coolDownPeriod" in cond["message"], cond
        time.sleep(1.0)
        assert max_temp(cluster) == [83, 83]  # the previous policy stays in force
        # A misspelt section reaches the extender (the CRD keeps unknown keys) and is refused.
        patch_policy(cluster, {"thermalThrottling": {"coolDownPeriod": "5m"},
                               "thermalThrotling": {"maxTemp": 70}})  # fmt: skip
        cond = until(
            "Accepted=False for a typo",
            lambda: (
                (c := accepted(cluster)).get("status") == "False"
                and "thermalThrotling" in c.get("message", "")
                and c
            ),
        )
        assert max_temp(cluster) == [83, 83]
    finally:
        patch_policy(cluster, {"thermalThrottling": {"maxTemp": 85, "coolDownPeriod": "5m"},
                               "thermalThrotling": None})  # fmt: skip
        until("policy restored", lambda: max_temp(cluster) == [85, 85])


_GPU_FIELDS = ("index", "uuid", "model", "temperature_c", "power_w", "power_limit_w",
               "utilization_pct", "memory_total_mib", "memory_used_mib", "health")  # fmt: skip


def report(cluster: Cluster, node: str) -> dict[str, Any]:
    """The node's report as the extender holds it, under a boot id of our own: accepted, it
    changes nothing, and the real agent's next push (its own boot id) is accepted after it."""
    held = cluster.extenders[0].get(f"/debug/nodes/{node}")
    return {
        "schema": "edgegpu.io/telemetry/v1",
        "node": node,
        "agent": {"version": "e2e", "backend": "simulated", "boot_id": "e2e-auth-check", "seq": 1},
        "sampled_at": "2026-12-05T00:00:00Z",
        "interval_s": 5,
        "gpus": [{k: g[k] for k in _GPU_FIELDS} for g in held["gpus"]],
    }


def test_agent_tokens_are_checked_against_the_node_their_pod_runs_on(cluster: Cluster) -> None:
    token = (cluster.cp.folder / "agent-gpu-a.token").read_text().strip()
    url = cluster.extenders[0].ingest_url + "/v1/telemetry"

    def push(node: str, bearer: str) -> httpx.Response:
        return httpx.post(url, json=report(cluster, node), verify=cluster.extenders[0].context(),
                          headers={"authorization": f"Bearer {bearer}"}, timeout=10.0)  # fmt: skip

    ok = push("gpu-a", token)
    assert ok.status_code == 200 and ok.json()["accepted"] is True, ok.text
    assert push("gpu-b", token).status_code == 403
    assert push("gpu-a", "garbage").status_code == 401
    # The real agents, with tokens bound to their DaemonSet pods, keep reporting.
    rows = {r["node"]: r for r in cluster.extenders[0].get("/debug/nodes")["nodes"]}
    assert rows["gpu-b"]["reported"] and not rows["gpu-b"]["stale"]


def test_a_token_not_issued_for_the_edgegpu_audience_is_refused(cluster: Cluster) -> None:
    """The agent pod's own ServiceAccount token, made for the API server, is not a push
    credential: the DaemonSet projects one for the audience edgegpu, and TokenReview checks it."""
    agent = cluster.agents["gpu-a"]
    assert agent.pod is not None
    for_the_api_server = cluster.cp.token(NAMESPACE, "edgegpu-node-agent", pod=agent.pod,
                                          expiration_s=600)  # fmt: skip
    ext = cluster.extenders[0]
    refused = httpx.post(f"{ext.ingest_url}/v1/telemetry", json=report(cluster, "gpu-a"),
                         headers={"authorization": f"Bearer {for_the_api_server}"},
                         verify=ext.context(), timeout=10.0)  # fmt: skip
    assert refused.status_code == 401, refused.text
    assert "audience" in refused.text


def test_only_the_scheduler_binds_a_caller_in_another_namespace_is_refused(
    cluster: Cluster, ns: str
) -> None:
    """What a pod of another tenant can send the extender's port: no client certificate (with
    its own ServiceAccount token), a certificate of another CA, a plain-text body. None binds
    the pending pod; the release keeps scheduling."""
    cluster.create({**cluster.pod("target", ns, blocks=1), "spec": {
        **cluster.pod("target", ns, blocks=1)["spec"], "schedulerName": "nobody-serves-this"}})  # fmt: skip
    target = cluster.get_pod(ns, "target")
    assert target is not None
    intruder = cluster.namespace(f"{ns}-intruder")
    token = cluster.cp.token(intruder, "default", expiration_s=600)
    ext = cluster.extenders[0]
    bind = {"PodName": "target", "PodNamespace": ns, "PodUID": target["metadata"]["uid"],
            "Node": "gpu-a"}  # fmt: skip

    no_cert = httpx.post(f"{ext.url}/bind", json=bind, verify=ext.context(), timeout=10.0,
                         headers={"authorization": f"Bearer {token}"})  # fmt: skip
    assert no_cert.status_code == 403, no_cert.text

    other = cluster.cp.folder / "intruder-pki"
    other.mkdir(exist_ok=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-keyout", str(other / "k.pem"), "-out", str(other / "c.pem"),
         "-subj", "/CN=edgegpu-scheduler"],
        check=True, capture_output=True,
    )  # fmt: skip
    forged = ext.context()
    forged.load_cert_chain(str(other / "c.pem"), str(other / "k.pem"))
    with pytest.raises(httpx.HTTPError):
        httpx.post(f"{ext.url}/bind", json=bind, verify=forged, timeout=10.0)

    scheduler = cluster.balancer.pki.scheduler_context()
    plain = httpx.post(f"{ext.url}/bind", content=json.dumps(bind), verify=scheduler, timeout=10.0,
                       headers={"content-type": "text/plain"})  # fmt: skip
    assert plain.status_code == 415, plain.text
    # Even with the scheduler's own certificate: not a pod of the scheduler the extender serves.
    served = httpx.post(f"{ext.url}/bind", json=bind, verify=scheduler, timeout=10.0)
    assert served.status_code == 200 and served.json()["Error"], served.text

    time.sleep(1.0)
    after = cluster.get_pod(ns, "target")
    assert after is not None and not after["spec"].get("nodeName")
    cluster.create(cluster.pod("normal", ns, blocks=1))
    bound = cluster.wait_bound(ns, "normal")
    cluster.delete_namespace(intruder)
    print(f"bind refused: no certificate 403, another CA's refused in the handshake, text/plain "
          f"415, unserved scheduler: {served.json()['Error'][:80]!r}; normal pod bound to "
          f"{bound['spec']['nodeName']}")  # fmt: skip
