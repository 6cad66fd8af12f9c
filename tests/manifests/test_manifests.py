"""Every manifest is valid Kubernetes (kubernetes-validate's OpenAPI schemas, strict) and agrees
with the code: routes, ports, resource names, policy fields, environment variables."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from node_agent.cli import command_line as agent_command_line
from node_agent.config import AgentSettings
from scheduler_extender.api.app import create_app
from scheduler_extender.cli.main import command_line as extender_command_line
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.policy import crd
from scheduler_extender.policy.document import parse_policy
from scheduler_extender.remediation import crd as maintenance_crd
from scheduler_extender.remediation.maintenance import MaintenanceSpec

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
K8S_VERSION = "1.34.0"
CUSTOM_KINDS = {
    "Certificate",
    "Issuer",
    "GPUSchedulingPolicy",
    "PrometheusRule",
    "PodMonitor",
    "KubeSchedulerConfiguration",
    "Kustomization",
}


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((str(path.relative_to(MANIFESTS)), doc))
    return out


DOCS = documents()


def by_kind(kind: str, name: str | None = None) -> dict[str, Any]:
    return next(
        d for _, d in DOCS if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    )


@pytest.mark.parametrize(("path", "doc"), [p for p in DOCS if p[1]["kind"] not in CUSTOM_KINDS],
                         ids=[f"{p}:{d['kind']}/{d['metadata']['name']}" for p, d in DOCS if d["kind"] not in CUSTOM_KINDS])  # fmt: skip
def test_every_manifest_validates_against_the_kubernetes_schemas(path, doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_kustomization_lists_files_that_exist():
    for path in MANIFESTS.rglob("kustomization.yaml"):
        doc = yaml.safe_load(path.read_text())
        for res in doc.get("resources", []):
            assert (path.parent / res).exists(), f"{path}: {res}"
        for gen in doc.get("configMapGenerator", []):
            for f in gen["files"]:
                assert (path.parent / f).exists()
    listed = {
        r for r in yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    }
    for path, doc in DOCS:
        if not path.startswith(("monitoring/", "crd/", "cert-manager/")) and doc["kind"] not in (
            "Kustomization",
            "KubeSchedulerConfiguration",
        ):
            assert path in listed, f"{path} is not in manifests/kustomization.yaml"


def test_the_default_policy_is_the_seed_and_validates_against_the_crd_and_the_code():
    crd = by_kind("CustomResourceDefinition", "gpuschedulingpolicies.kepler.io")
    assert (
        crd["spec"]["group"],
        crd["spec"]["names"]["kind"],
        crd["spec"]["versions"][0]["name"],
    ) == ("kepler.io", "GPUSchedulingPolicy", "v1")
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    policy = by_kind("GPUSchedulingPolicy")
    # The CRD is OpenAPI v3.0, whose keywords (boolean exclusiveMinimum) are JSON Schema draft 4's.
    jsonschema.Draft4Validator(schema).validate(policy)
    parsed = parse_policy(policy)
    assert (
        parsed.spec.thermal_throttling.max_temp_c == 85
        and parsed.spec.thermal_throttling.cool_down_s == 300
    )
    # Every field the code accepts is in the CRD schema, and no other (the CRD would prune it).
    spec_schema = schema["properties"]["spec"]["properties"]
    described = parsed.describe()["spec"]
    for section, fields in described.items():
        assert section in spec_schema, section
        if "properties" in spec_schema[section] and isinstance(fields, dict):
            assert set(fields) <= set(spec_schema[section]["properties"]), section


def test_the_scheduler_config_matches_the_extender_routes_and_resources():
    config = yaml.safe_load((MANIFESTS / "scheduler/kube-scheduler-config.yaml").read_text())
    cm = by_kind("ConfigMap", "edgegpu-scheduler-config")
    assert yaml.safe_load(cm["data"]["config.yaml"]) == config
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    (ext,) = config["extenders"]
    app = create_app()
    paths = set(app.openapi()["paths"])
    for verb in ("filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb"):
        assert f"/{ext[verb]}" in paths
    assert ext["weight"] > 0 and ext["nodeCacheCapable"] is True
    assert ext["httpTimeout"].endswith("s")
    # Every pod of the profile reaches the extender.
    assert "managedResources" not in ext
    service = by_kind("Service", "edgegpu-extender")
    host, port = ext["urlPrefix"].removeprefix("https://").split(":")
    assert ext["enableHTTPS"] is True and set(ext["tlsConfig"]) == {"certFile", "keyFile", "caFile"}
    assert host == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert int(port) == service["spec"]["ports"][0]["port"]
    assert config["profiles"][0]["schedulerName"] == "edgegpu-scheduler"


def _env_names(container: dict[str, Any]) -> set[str]:
    return {e["name"] for e in container.get("env", [])}


def test_the_extender_deployment_agrees_with_its_settings_and_routes():
    dep = by_kind("Deployment", "edgegpu-extender")
    assert dep["spec"]["replicas"] >= 2
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    fields = set(ExtenderSettings.model_fields)
    for name in _env_names(c):
        assert name.startswith("EDGEGPU_") and name.removeprefix("EDGEGPU_").lower() in fields, name
    port = c["ports"][0]["containerPort"]
    assert c["args"][c["args"].index("--port") + 1] == str(port)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    paths = set(create_app().openapi()["paths"])
    assert {c["readinessProbe"]["httpGet"]["path"], c["livenessProbe"]["httpGet"]["path"]} <= paths
    for svc in ("edgegpu-extender", "edgegpu-extender-headless"):
        s = by_kind("Service", svc)
        assert s["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
        assert s["spec"]["ports"][0]["targetPort"] == c["ports"][0]["name"]
    assert by_kind("Service", "edgegpu-extender-headless")["spec"]["clusterIP"] == "None"
    assert (
        pod["serviceAccountName"]
        == by_kind("ServiceAccount", "edgegpu-extender")["metadata"]["name"]
    )


def test_the_extender_role_allows_what_the_code_calls_and_nothing_broader():
    rules = by_kind("ClusterRole", "edgegpu-extender")["rules"]
    granted = {(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]}
    needed = {("nodes", "watch"), ("pods", "watch"), ("pods/binding", "create"),
              ("pods/eviction", "create"), ("tokenreviews", "create"), ("gpuschedulingpolicies", "watch"),
              ("gpuschedulingpolicies/status", "patch")}  # fmt: skip
    assert needed <= granted
    assert all("*" not in rule["verbs"] and "*" not in rule["resources"] for rule in rules)
    assert not any(v in ("delete", "deletecollection") for _, v in granted)
    assert ("pods", "patch") not in granted  # bind writes the annotations through the Binding
    lease = by_kind("Role", "edgegpu-extender-leader")["rules"][0]
    assert lease["resources"] == ["leases"]


def test_the_node_agent_daemonset_is_the_seed_shape_and_agrees_with_the_agent():
    ds = by_kind("DaemonSet", "edgegpu-node-agent")
    pod = ds["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    wanted = [
        (e["key"], e["values"]) for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]
    ]
    # Any one of them: NFD's and the GPU Operator's labels, the seed's, our own.
    assert wanted == [("feature.node.kubernetes.io/pci-10de.present", ["true"]),
                      ("nvidia.com/gpu.present", ["true"]), ("accelerator", ["nvidia-tesla"]),
                      ("edgegpu.io/gpu", ["true"])]  # fmt: skip
    assert "nodeSelector" not in pod
    assert {"operator": "Exists"} in pod["tolerations"]
    (c,) = pod["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    fields = set(AgentSettings.model_fields)
    for name in env:
        if name != "NODE_NAME":
            assert name.removeprefix("EDGEGPU_AGENT_").lower() in fields, name
    args = dict(
        a.removeprefix("--").split("=", 1) if "=" in a else (a.removeprefix("--"), "true")
        for a in c["args"]
    )
    for flag in args:
        assert flag.replace("-", "_") in fields, flag
    assert args["metrics-port"] == str(c["ports"][0]["containerPort"]) == "9400"
    assert "edgegpu-extender-headless" in args["extender-urls"]
    token_mount = next(m for m in c["volumeMounts"] if m["name"] == "token")
    assert args["token-file"].startswith(token_mount["mountPath"])
    projected = next(v for v in pod["volumes"] if v["name"] == "token")["projected"]["sources"][0]
    assert "serviceAccountToken" in projected
    assert pod["serviceAccountName"] == "edgegpu-node-agent"
    extender = by_kind("Deployment", "edgegpu-extender")["spec"]["template"]["spec"]["containers"][
        0
    ]
    ext_env = {e["name"]: e.get("value") for e in extender["env"]}
    assert ext_env["EDGEGPU_AGENT_SERVICE_ACCOUNT"] == pod["serviceAccountName"]
    assert ext_env["EDGEGPU_AGENT_NAMESPACE"] == ds["metadata"]["namespace"]


def test_the_alerts_use_metrics_the_agent_and_extender_export():
    rule = by_kind("PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    guide = {"alert": "GPUHighTemperature", "expr": 'node_gpu_temperature_celsius{device="0"} > 80',
             "for": "2m", "labels": {"severity": "critical"},
             "annotations": {"summary": "GPU 0 temperature exceeds 80C"}}  # fmt: skip
    assert alerts["GPUHighTemperature"] == guide  # the deployment guide's, exactly
    assert alerts["GPUAboveMaxTemp"]["expr"] == "node_gpu_temperature_celsius > 85"
    from node_agent.telemetry import exporter

    agent_names = {name for name, *_ in exporter._GAUGES} | {
        "node_gpu_health", "node_gpu_cuda_context_success_ratio", "node_gpu_thermal_cap_watts", "node_gpu_power_saving_active",
    }  # fmt: skip
    extender_names = {"edgegpu_extender_telemetry_stale", "edgegpu_extender_request_errors_total",
                      "edgegpu_extender_certificate_expiry_timestamp_seconds",
                      "edgegpu_extender_policy_refused"}  # fmt: skip
    for r in alerts.values():
        metrics = re.findall(r"\b(?:node_gpu|edgegpu)_[a-z_]+", r["expr"])
        assert metrics and set(metrics) <= agent_names | extender_names, (r["alert"], metrics)
    dashboard = json.loads((MANIFESTS / "monitoring/grafana-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for name in ("node_gpu_temperature_celsius", "node_gpu_power_watts", "node_gpu_power_limit_watts", "node_gpu_sm_clock_hertz",
                 "node_gpu_utilization_ratio", "node_gpu_memory_used_bytes", "node_gpu_health"):  # fmt: skip
        assert name in exprs


def test_the_extenders_arguments_are_flags_it_takes_and_valid_settings():
    (c,) = by_kind("Deployment", "edgegpu-extender")["spec"]["template"]["spec"]["containers"]
    settings, _ = extender_command_line().parse(c["args"])
    assert settings.has_cluster and settings.host == "0.0.0.0"


def test_the_agents_arguments_are_flags_it_takes_and_valid_settings(monkeypatch):
    (c,) = by_kind("DaemonSet", "edgegpu-node-agent")["spec"]["template"]["spec"]["containers"]
    monkeypatch.setenv("NODE_NAME", "gpu-1")  # the downward API's
    settings, own = agent_command_line().parse(c["args"])
    assert settings.extender_urls and settings.device_plugin and settings.resolve_all
    assert not own.once


def test_the_agent_writes_on_the_host_only_in_folders_of_its_own(monkeypatch):
    """The reboot sentinel and the kept block size sit in folders mounted for them alone: not
    the host's /var/run, whose /var/run/reboot-required is unattended-upgrades' too."""
    pod = by_kind("DaemonSet", "edgegpu-node-agent")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    monkeypatch.setenv("NODE_NAME", "gpu-1")
    settings, _ = agent_command_line().parse(c["args"])
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert settings.reboot_sentinel is not None and settings.state_dir is not None
    for folder in (settings.reboot_sentinel.parent, settings.state_dir):
        assert host[mounts[str(folder)]] == str(folder)
    assert "/var/run" not in host.values() and "/run" not in host.values()


def test_agents_push_to_every_extender_on_its_port():
    (c,) = by_kind("Deployment", "edgegpu-extender")["spec"]["template"]["spec"]["containers"]
    http = next(p for p in c["ports"] if p["name"] == "http")
    assert c["args"][c["args"].index("--port") + 1] == str(http["containerPort"])
    headless = by_kind("Service", "edgegpu-extender-headless")["spec"]
    assert headless["clusterIP"] == "None"
    service_port = next(p for p in headless["ports"] if p["targetPort"] == "http")["port"]
    (agent,) = by_kind("DaemonSet", "edgegpu-node-agent")["spec"]["template"]["spec"]["containers"]
    url = next(a for a in agent["args"] if a.startswith("--extender-urls="))
    assert url.endswith(f"edgegpu-extender-headless.edgegpu-system.svc:{service_port}")


def test_the_network_policy_lets_the_scheduler_and_the_agents_reach_the_extenders_port():
    policy = by_kind("NetworkPolicy", "edgegpu-extender")["spec"]
    extender = by_kind("Deployment", "edgegpu-extender")["spec"]["template"]["metadata"]
    assert policy["podSelector"]["matchLabels"].items() <= extender["labels"].items()
    (rule,) = policy["ingress"]
    allowed = [p["podSelector"]["matchLabels"] for p in rule["from"]]
    for kind, name in (("Deployment", "edgegpu-scheduler"), ("DaemonSet", "edgegpu-node-agent")):
        labels = by_kind(kind, name)["spec"]["template"]["metadata"]["labels"]
        assert any(a.items() <= labels.items() for a in allowed), name
    (c,) = by_kind("Deployment", "edgegpu-extender")["spec"]["template"]["spec"]["containers"]
    assert [p["port"] for p in rule["ports"]] == [p["name"] for p in c["ports"]]


async def test_every_metric_the_dashboard_and_the_alerts_name_is_one_that_is_exported():
    """The names are taken from what the agent and the extender really serve on /metrics."""
    import httpx
    from prometheus_client import CollectorRegistry, generate_latest

    from node_agent.backends.simulated import SimulatedBackend
    from node_agent.loop import Agent
    from node_agent.protection.health import HealthArgs
    from node_agent.protection.power import PowerArgs
    from node_agent.telemetry.exporter import AgentMetrics
    from tests.builders import args_names, gpu, pod, report

    t = [0.0]
    backend = SimulatedBackend(clock=lambda: t[0], gpus=1, node="n1")
    backend.open()
    registry = CollectorRegistry()
    agent = Agent(backend, node="n1", interval_s=5.0, metrics=AgentMetrics(registry, "n1"),
                  health_args=HealthArgs(), power_args=PowerArgs(), clock=lambda: t[0])  # fmt: skip
    for _ in range(2):
        t[0] += 5.0
        await agent.round()
    served = generate_latest(registry).decode()
    app = create_app()
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        await client.post("/v1/telemetry", json=report("n1", [gpu(0)]))
        await client.post("/filter", json=args_names(pod("p"), ["n1"]))
        served += (await client.get("/metrics")).text
    exported = set(re.findall(r"^([a-z_]+)[{ ]", served, re.MULTILINE))
    for name, kind in re.findall(r"^# TYPE ([a-z_]+) ([a-z]+)$", served, re.MULTILINE):
        # A family without a sample yet (no error so far, no pod) is served all the same.
        suffixes = {"counter": ["", "_total"], "histogram": ["_bucket", "_sum", "_count"]}
        exported |= {name.removesuffix("_total") + x for x in suffixes.get(kind, [""])}
    dashboard = json.loads((MANIFESTS / "monitoring/grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = yaml.safe_load((MANIFESTS / "monitoring/prometheusrule.yaml").read_text())
    exprs += [r["expr"] for g in rules["spec"]["groups"] for r in g["rules"]]
    named = {m for e in exprs for m in re.findall(r"\b(?:node_gpu|edgegpu)_[a-z_]+", e)}
    assert named and named <= exported, sorted(named - exported)


def test_the_crd_is_the_one_generated_from_the_policy_model():
    # `make crd` writes it; a policy field added without regenerating fails here.
    assert (MANIFESTS / "crd" / "gpuschedulingpolicies.yaml").read_text() == crd.render()


def test_the_maintenance_crd_is_the_one_generated_from_its_model():
    assert (MANIFESTS / "crd" / "gpumaintenances.yaml").read_text() == maintenance_crd.render()
    doc = by_kind("CustomResourceDefinition", "gpumaintenances.edgegpu.io")
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(spec["properties"]) == {
        info.alias or name for name, info in MaintenanceSpec.model_fields.items()
    }


def test_the_extender_and_the_scheduler_never_run_on_an_edge_node():
    """A node's kubelet may read the Secrets of its pods: the keys stay off edge nodes."""
    for name in ("edgegpu-extender", "edgegpu-scheduler"):
        pod = by_kind("Deployment", name)["spec"]["template"]["spec"]
        (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert {"key": "node-role.kubernetes.io/edge", "operator": "DoesNotExist"} in term[
            "matchExpressions"
        ]
    agent = by_kind("DaemonSet", "edgegpu-node-agent")["spec"]["template"]["spec"]
    assert not [v for v in agent["volumes"] if "secret" in v]


def test_the_podmonitors_scrape_a_named_port_of_the_pods_they_select():
    for name, workload in (("edgegpu-extender", "Deployment"), ("edgegpu-node-agent", "DaemonSet")):
        monitor = by_kind("PodMonitor", name)
        pod = by_kind(workload, name)["spec"]["template"]
        labels = pod["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    (https,) = by_kind("PodMonitor", "edgegpu-extender")["spec"]["podMetricsEndpoints"]
    assert https["scheme"] == "https"  # the extender serves nothing in plain http
    cert = by_kind("Certificate", "edgegpu-extender")
    assert https["tlsConfig"]["serverName"] in cert["spec"]["dnsNames"]
    assert https["tlsConfig"]["ca"]["configMap"]["name"] == "edgegpu-ca"
