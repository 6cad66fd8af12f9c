"""The Helm chart installed by a real ``helm`` on a control plane of its own, and the extender
its Deployment describes answering there with the policy the values gave."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import yaml

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.edgegpu import Extender
from tests.gotools import HELM, build_go_tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "edgegpu"


def test_the_chart_installs_and_the_extender_it_deploys_answers() -> None:
    helm = build_go_tool(*HELM)
    with tempfile.TemporaryDirectory(prefix="edgegpu-chart-") as tmp:
        cp = ControlPlane(Path(tmp))
        try:
            cp.start(controllers=False)
            install = subprocess.run(
                [helm, "install", "edge", str(CHART), "--kubeconfig", str(cp.admin_kubeconfig),
                 "--namespace", "edge-ops", "--create-namespace",
                 "--set", "policyName=edge-ops-policy",
                 "--set", "policy.thermalThrottling.maxTemp=80"],
                capture_output=True, text=True, cwd=ROOT,
            )  # fmt: skip
            assert install.returncode == 0, install.stdout + install.stderr
            manifest = subprocess.run(
                [helm, "get", "manifest", "edge", "--kubeconfig", str(cp.admin_kubeconfig),
                 "--namespace", "edge-ops"],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            (deployment,) = (
                d for d in yaml.safe_load_all(manifest)
                if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "edgegpu-extender"
            )  # fmt: skip
            assert cp.get("/apis/kepler.io/v1/gpuschedulingpolicies/edge-ops-policy") is not None
            ext = Extender(cp, "edgegpu-extender-0", deployment=deployment, namespace="edge-ops")
            ext.start()  # waits for /readyz: the Node, Pod and policy caches synced

            def follows_the_values() -> bool:
                spec = ext.get("/debug/policy")["policy"]["spec"]
                return bool(spec["thermalThrottling"]["maxTemp"] == 80)

            wait_until("the chart's policy in force", follows_the_values, 30.0, 0.3)
            print(
                f"chart: helm install in edge-ops; extender ready; {ext.get('/debug/policy')['source']}"
            )
            ext.stop()
        finally:
            cp.stop()
