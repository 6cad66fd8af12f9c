"""The Helm chart with a real ``helm`` (built from the Go module proxy): it lints, its default
values give exactly the objects of ``kubectl apply -k manifests/``, and with other values and
another namespace the API server takes every object (server-side dry run)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.conftest import Cluster, build_go_tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "edgegpu"


def _helm() -> str:
    return build_go_tool("helm", "helm.sh/helm/v4/cmd/helm", "v4.3.2")


def _run(*args: str) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _objects(text: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(text) if d]
    return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}


def test_the_chart_gives_the_manifests_objects_and_the_api_server_takes_other_values(
    cluster: Cluster,
) -> None:
    helm = _helm()
    lint = _run(helm, "lint", str(CHART))
    assert "0 chart(s) failed" in lint, lint

    rendered = _objects(
        _run(helm, "template", "edgegpu", str(CHART), "--namespace", "edgegpu-system",
             "--include-crds")
    )  # fmt: skip
    kustomized = _objects(
        cluster.cp.kubectl("kustomize", "manifests/").stdout
        + "\n---\n"
        + (ROOT / "manifests" / "crd" / "gpuschedulingpolicies.yaml").read_text()
    )
    del kustomized[("Namespace", "", "edgegpu-system")]  # helm install --create-namespace
    assert sorted(rendered) == sorted(kustomized)
    for key, obj in kustomized.items():
        assert rendered[key] == obj, key

    other = _run(
        helm, "template", "edge", str(CHART), "--namespace", "edge-ops",
        "--set", "extender.replicas=3", "--set", "nodeAgent.backend=amd",
        "--set", "nodeAgent.nodeSelector.gpu=amd-mi210",
        "--set", "policy.thermalThrottling.maxTemp=80",
    )  # fmt: skip
    objects = _objects(other)
    assert objects[("Deployment", "edge-ops", "edgegpu-extender")]["spec"]["replicas"] == 3
    agent = objects[("DaemonSet", "edge-ops", "edgegpu-node-agent")]["spec"]["template"]["spec"]
    assert "--backend=amd" in agent["containers"][0]["args"]
    assert agent["nodeSelector"] == {"accelerator": "nvidia-tesla", "gpu": "amd-mi210"}
    config = objects[("ConfigMap", "edge-ops", "edgegpu-scheduler-config")]
    assert "edgegpu-extender.edge-ops.svc:8888" in yaml.safe_dump(config)
    policy = objects[("GPUSchedulingPolicy", "", "edge-gpu-policy")]
    assert policy["spec"]["thermalThrottling"] == {"maxTemp": 80, "coolDownPeriod": "5m"}

    cluster.cp.kubectl("create", "namespace", "edge-ops")
    try:
        applied = subprocess.run(
            [cluster.cp.binary("kubectl"), f"--kubeconfig={cluster.cp.admin_kubeconfig}",
             "apply", "--dry-run=server", "-f", "-"],
            input=other, capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        assert applied.returncode == 0, applied.stderr
        assert applied.stdout.count("(server dry run)") == len(objects), applied.stdout
    finally:
        cluster.cp.kubectl("delete", "namespace", "edge-ops", "--wait=false")
