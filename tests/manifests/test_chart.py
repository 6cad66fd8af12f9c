"""The Helm chart: generated from manifests/, linted and rendered by a real helm, and its
objects valid Kubernetes objects with any of its values."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import tools.chart
from tests.fakes.fake_kube import json_patch
from tests.gotools import HELM, build_go_tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "edgegpu"
K8S_VERSION = "1.34.0"
CUSTOM_KINDS = {"GPUSchedulingPolicy", "CustomResourceDefinition"}


def test_the_helm_chart_is_the_one_generated_from_the_manifests():
    # `make chart` writes it from manifests/.
    committed = {
        p.relative_to(CHART).as_posix(): p.read_text() for p in CHART.rglob("*") if p.is_file()
    }
    assert committed == tools.chart.files()


def test_a_manifest_edit_that_a_chart_value_no_longer_matches_stops_the_chart_build(monkeypatch):
    real = Path.read_text

    def edited(path: Path, *args: Any, **kwargs: Any) -> str:
        text = real(path, *args, **kwargs)
        return (
            text.replace("replicas: 2", "replicas: 3") if path.name == "deployment.yaml" else text
        )

    monkeypatch.setattr(Path, "read_text", edited)
    with pytest.raises(ValueError, match="not there exactly once"):
        tools.chart.files()


def _helm(*args: str) -> str:
    proc = subprocess.run([build_go_tool(*HELM), *args], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _objects(text: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(text) if d]
    return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}


def _kustomized() -> dict[tuple[str, str, str], dict[str, Any]]:
    """What ``kubectl apply -k manifests/`` creates (its image tags applied), and the CRD."""
    manifests = ROOT / "manifests"
    kustomization = yaml.safe_load((manifests / "kustomization.yaml").read_text())
    tags = {i["name"]: i["newTag"] for i in kustomization["images"]}
    text = "\n---\n".join(
        (manifests / r).read_text()
        for r in [
            *kustomization["resources"],
            "crd/gpuschedulingpolicies.yaml",
            "crd/gpumaintenances.yaml",
        ]
    )
    objects = _objects(text)
    for obj in objects.values():
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for c in pod.get("containers", []):
            if c["image"] in tags:
                c["image"] = f"{c['image']}:{tags[c['image']]}"
    return objects


def test_helm_lints_the_chart_and_its_defaults_render_the_manifests_objects():
    lint = _helm("lint", str(CHART), "--strict")
    assert "0 chart(s) failed" in lint, lint
    rendered = _objects(
        _helm("template", "edgegpu", str(CHART), "--namespace", "edgegpu-system", "--include-crds")
    )
    kustomized = _kustomized()
    del kustomized[("Namespace", "", "edgegpu-system")]  # helm install --create-namespace
    # tls.source: helm (the default) adds what cert-manager would make, and the CA ConfigMap.
    tls = {("Secret", "edgegpu-system", "edgegpu-extender-tls"),
           ("Secret", "edgegpu-system", "edgegpu-scheduler-tls"),
           ("ConfigMap", "edgegpu-system", "edgegpu-ca")}  # fmt: skip
    assert sorted(set(rendered) - tls) == sorted(kustomized)
    assert tls <= set(rendered)
    for key, obj in kustomized.items():
        assert rendered[key] == obj, key


def _pem(data: dict[str, str], key: str, folder: Path) -> Path:
    path = folder / key
    path.write_bytes(base64.b64decode(data[key]))
    return path


def _openssl(*args: str) -> str:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=True).stdout


def _with_dra_overlay() -> dict[tuple[str, str, str], dict[str, Any]]:
    """What ``kubectl apply -k overlays/dra/`` creates: its patches applied, its objects added."""
    overlay = ROOT / "overlays" / "dra"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    objects = _kustomized()
    for patch in kustomization["patches"]:
        target = patch["target"]
        (key,) = [k for k in objects if k[0] == target["kind"] and k[2] == target["name"]]
        objects[key] = json_patch(objects[key], yaml.safe_load(patch["patch"]))
    for resource in kustomization["resources"]:
        if not resource.startswith(".."):
            objects.update(_objects((overlay / resource).read_text()))
    return objects


def test_dra_enabled_renders_what_the_dra_overlay_applies():
    rendered = _objects(_helm("template", "edgegpu", str(CHART), "--namespace", "edgegpu-system",
                              "--include-crds", "--set", "dra.enabled=true"))  # fmt: skip
    overlaid = _with_dra_overlay()
    del overlaid[("Namespace", "", "edgegpu-system")]
    for key, obj in overlaid.items():
        assert rendered[key] == obj, key
    agent = rendered[("DaemonSet", "edgegpu-system", "edgegpu-node-agent")]
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--dra" in args and "--device-plugin" not in args


def test_by_default_helm_makes_one_ca_the_extenders_serving_and_the_schedulers_client_certificate(
    tmp_path: Path,
) -> None:
    objects = _objects(_helm("template", "edge", str(CHART), "--namespace", "edge-ops"))
    for key in (("Secret", "edge-ops", "edgegpu-extender-tls"),
                ("Secret", "edge-ops", "edgegpu-scheduler-tls"), ("ConfigMap", "edge-ops", "edgegpu-ca")):  # fmt: skip
        # Switching tls.source or uninstalling leaves them: a CA copied elsewhere stays valid.
        assert objects[key]["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    server = objects[("Secret", "edge-ops", "edgegpu-extender-tls")]["data"]
    client = objects[("Secret", "edge-ops", "edgegpu-scheduler-tls")]["data"]
    ca = tmp_path / "bundle.crt"
    ca.write_text(objects[("ConfigMap", "edge-ops", "edgegpu-ca")]["data"]["ca.crt"])
    assert (
        base64.b64decode(server["ca.crt"]) == ca.read_bytes() == base64.b64decode(client["ca.crt"])
    )
    for data, who in ((server, "server"), (client, "client")):
        folder = tmp_path / who
        folder.mkdir()
        crt = _pem(data, "tls.crt", folder)
        assert _openssl("verify", "-CAfile", str(ca), str(crt)).strip().endswith(": OK")
        _pem(data, "tls.key", folder)
    names = _openssl("x509", "-in", str(tmp_path / "server" / "tls.crt"), "-noout", "-ext",
                     "subjectAltName")  # fmt: skip
    assert "DNS:edgegpu-extender.edge-ops.svc" in names
    assert "DNS:edgegpu-extender-headless.edge-ops.svc" in names
    subject = _openssl("x509", "-in", str(tmp_path / "client" / "tls.crt"), "-noout", "-subject")
    assert "edgegpu-scheduler" in subject


def test_with_cert_manager_the_chart_asks_for_the_certificates_the_manifests_ask_for():
    objects = _objects(_helm("template", "edge", str(CHART), "--namespace", "edge-ops",
                             "--set", "tls.source=cert-manager"))  # fmt: skip
    assert not [k for k in objects if k[0] == "Secret"]
    wanted = [
        d for d in yaml.safe_load_all(
            (ROOT / "manifests" / "cert-manager" / "certificates.yaml").read_text()
            .replace("edgegpu-system", "edge-ops")
        ) if d
    ]  # fmt: skip
    for doc in wanted:
        assert objects[(doc["kind"], "edge-ops", doc["metadata"]["name"])] == doc
    existing = _objects(_helm("template", "edge", str(CHART), "--namespace", "edge-ops",
                              "--set", "tls.source=existing"))  # fmt: skip
    assert not [k for k in existing if k[0] in ("Secret", "Certificate", "Issuer")]
    typo = subprocess.run([build_go_tool(*HELM), "template", "edge", str(CHART),
                           "--set", "tls.source=cert-manger"],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert typo.returncode != 0 and "'helm', 'cert-manager', 'existing'" in typo.stderr


def test_other_values_render_valid_objects_that_carry_them():
    objects = _objects(
        _helm(
            "template", "edge", str(CHART), "--namespace", "edge-ops",
            "--set", "extender.replicas=3", "--set", "nodeAgent.backend=amd",
            "--set", "nodeAgent.nodeSelector.gpu=amd-mi210",
            "--set", "nodeAgent.powerControl=false", "--set", "nodeAgent.privileged=false",
            "--set-json", 'nodeAgent.tolerations=[{"key":"node-role.kubernetes.io/edge",'
                          '"operator":"Exists","effect":"NoSchedule"}]',
            "--set", "scheduler.enabled=false", "--set", "policyName=edge-ops-policy",
            "--set", "policy.thermalThrottling.maxTemp=80",
            "--set", "policy.remediation.enabled=true",
            "--set", "prometheusNamespace=observability",
            "--set", "nodeAgent.protection.powerSaving=false",
            "--set", "nodeAgent.protection.maxTempC=80",
        )
    )  # fmt: skip
    for (kind, _, _), obj in objects.items():
        if kind not in CUSTOM_KINDS:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    # The scheduler's client certificate stays: the cluster's own scheduler presents it.
    assert [k for k in objects if "scheduler" in k[2]] == [
        ("Secret", "edge-ops", "edgegpu-scheduler-tls")
    ]
    extender = objects[("Deployment", "edge-ops", "edgegpu-extender")]["spec"]
    assert extender["replicas"] == 3
    (serving,) = extender["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in serving["env"]}
    assert env["EDGEGPU_POLICY_NAME"] == "edge-ops-policy"
    assert env["EDGEGPU_AGENT_NAMESPACE"] == "edge-ops"
    agent = objects[("DaemonSet", "edge-ops", "edgegpu-node-agent")]["spec"]["template"]["spec"]
    (container,) = agent["containers"]
    assert "--backend=amd" in container["args"]
    assert (
        "--extender-urls=https://edgegpu-extender-headless.edge-ops.svc:8888" in container["args"]
    )
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["EDGEGPU_AGENT_POWER_SAVING"] == "false"
    assert env["EDGEGPU_AGENT_MAX_TEMP_C"] == "80"
    policy_rule = objects[("NetworkPolicy", "edge-ops", "edgegpu-extender")]["spec"]["ingress"][0]
    (prometheus,) = [f for f in policy_rule["from"] if "namespaceSelector" in f]
    assert prometheus["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "observability"
    }
    assert agent["nodeSelector"] == {"gpu": "amd-mi210"}
    assert agent["affinity"]["nodeAffinity"]  # the GPU-node labels still, unless set otherwise
    assert agent["tolerations"] == [
        {"key": "node-role.kubernetes.io/edge", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert {"name": "EDGEGPU_AGENT_POWER_CONTROL", "value": "false"} in container["env"]
    assert container["securityContext"]["privileged"] is False
    policy = objects[("GPUSchedulingPolicy", "", "edge-ops-policy")]["spec"]
    assert policy["thermalThrottling"] == {"maxTemp": 80, "coolDownPeriod": "5m"}
    assert policy["remediation"] == {"enabled": True}


def test_the_second_scheduler_calls_the_extender_with_mtls_and_agents_get_the_ca_only():
    objects = _objects(_helm("template", "edge", str(CHART), "--namespace", "edge-ops"))
    for (kind, _, _), obj in objects.items():
        if kind not in CUSTOM_KINDS:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    config = yaml.safe_load(
        objects[("ConfigMap", "edge-ops", "edgegpu-scheduler-config")]["data"]["config.yaml"]
    )
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "https://edgegpu-extender.edge-ops.svc:8888"
    assert extender["enableHTTPS"] is True
    assert extender["tlsConfig"] == {"certFile": "/etc/edgegpu-tls/tls.crt",
                                     "keyFile": "/etc/edgegpu-tls/tls.key",
                                     "caFile": "/etc/edgegpu-tls/ca.crt"}  # fmt: skip
    pod = objects[("Deployment", "edge-ops", "edgegpu-scheduler")]["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "edgegpu-scheduler-tls"}} in pod["volumes"]
    serving = objects[("Deployment", "edge-ops", "edgegpu-extender")]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in serving["containers"][0]["env"]}
    assert env["EDGEGPU_CLIENT_CA_FILE"] == "/etc/edgegpu-tls/ca.crt"
    assert env["EDGEGPU_TOKEN_AUDIENCE"] == "edgegpu"
    assert serving["containers"][0]["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    agent = objects[("DaemonSet", "edge-ops", "edgegpu-node-agent")]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in agent["volumes"]}
    assert volumes["ca"] == {"name": "ca", "configMap": {"name": "edgegpu-ca", "optional": True}}
    assert not [v for v in agent["volumes"] if "secret" in v]  # never a private key on a node
    (token,) = volumes["token"]["projected"]["sources"]
    assert token["serviceAccountToken"]["audience"] == "edgegpu"


@pytest.mark.parametrize(
    ("values", "refusal"),
    [
        pytest.param(
            ["--set", "policy.thermalThrottling.maxTemp=500"], "maximum", id="maxTemp 500"
        ),
        pytest.param(
            ["--set", "policy.thermalThrotling.maxTemp=80"],
            "thermalThrotling",
            id="a typo in a policy section",
        ),
        pytest.param(["--set", "nodeAgent.protection.maxTempC=0"], "maxTempC", id="maxTempC 0"),
        pytest.param(["--set", "nodeAgent.backend=cuda"], "backend", id="an unknown backend"),
        pytest.param(["--set", "extendr.replicas=3"], "extendr", id="a typo at the top"),
    ],
)
def test_helm_refuses_values_the_chart_cannot_render_into_a_working_release(values, refusal):
    proc = subprocess.run([build_go_tool(*HELM), "template", "edge", str(CHART), *values],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert proc.returncode != 0, proc.stdout[-500:]
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert refusal in proc.stderr, proc.stderr


def test_monitoring_enabled_renders_the_podmonitors_the_alert_rules_and_the_dashboard():
    objects = _objects(_helm("template", "edge", str(CHART), "--namespace", "edge-ops",
                             "--set", "monitoring.enabled=true"))  # fmt: skip
    monitoring = ROOT / "manifests" / "monitoring"
    for path in ("prometheusrule.yaml", "podmonitors.yaml"):
        for doc in yaml.safe_load_all((monitoring / path).read_text()):
            doc = yaml.safe_load(yaml.safe_dump(doc).replace("edgegpu-system", "edge-ops"))
            assert objects[(doc["kind"], "edge-ops", doc["metadata"]["name"])] == doc
    dashboard = objects[("ConfigMap", "edge-ops", "edgegpu-grafana-dashboard")]
    assert dashboard["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert json.loads(dashboard["data"]["grafana-dashboard.json"]) == json.loads(
        (monitoring / "grafana-dashboard.json").read_text()
    )
    plain = _objects(_helm("template", "edge", str(CHART), "--namespace", "edge-ops"))
    assert not [k for k in plain if k[0] in ("PodMonitor", "PrometheusRule")]


def test_monitoring_labels_reach_every_object_a_prometheus_selects():
    objects = _objects(_helm("template", "edge", str(CHART), "--set", "monitoring.enabled=true",
                             "--set", "monitoring.labels.release=kps"))  # fmt: skip
    selected = [o for k, o in objects.items() if k[0] in ("PodMonitor", "PrometheusRule")]
    assert len(selected) == 3
    for obj in selected:
        assert obj["metadata"]["labels"] == {
            "app.kubernetes.io/part-of": "edgegpu",
            "release": "kps",
        }


def test_helm_takes_the_policy_values_the_policy_docs_give():
    objects = _objects(_helm("template", "edge", str(CHART), "--namespace", "edge-ops",
                             "--set", "policy.qos.defaultClass=training",
                             "--set", "policy.thermalThrottling.maxTemp=80"))  # fmt: skip
    (policy,) = [o for k, o in objects.items() if k[0] == "GPUSchedulingPolicy"]
    assert policy["spec"]["qos"]["defaultClass"] == "training"
    assert policy["spec"]["thermalThrottling"]["maxTemp"] == 80
