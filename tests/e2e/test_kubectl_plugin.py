"""``kubectl edgegpu`` against the real API server: nodes, pods and explain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.e2e.conftest import Cluster


def plugin(cluster: Cluster, url: str, *args: str) -> Any:
    # The extender serves HTTPS with the install's CA: the plugin trusts it as any Python
    # HTTPS client does, through SSL_CERT_FILE.
    env = {**os.environ, "SSL_CERT_FILE": str(cluster.balancer.pki.ca)}
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler_extender.cli.kubectl",
         "--kubeconfig", str(cluster.cp.admin_kubeconfig), "--extender-url", url,
         "-o", "json", *args],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_kubectl_edgegpu_nodes_pods_and_explain(cluster: Cluster, ns: str) -> None:
    # The extender runs here as a process on loopback, not in a pod, so there is nothing to
    # port-forward to: the plugin talks to it directly (--extender-url) and reads pods through
    # the API server. The port-forward path is tested with a stand-in of the API server's
    # websocket (tests/security/test_kubectl_reach.py, tests/k8s/test_kubectl_plugin.py).
    url = cluster.extenders[0].url
    cluster.create(cluster.pod("holder", ns, blocks=2, qos="inference"))
    bound = cluster.wait_bound(ns, "holder")
    cluster.create(cluster.pod("too-big", ns, blocks=64))

    nodes = plugin(cluster, url, "nodes")
    names = {n["node"] for n in nodes}
    assert bound["spec"]["nodeName"] in names and "gpu-a" in names
    pods = plugin(cluster, url, "pods", "-n", ns)
    (held,) = pods
    assert held["pod"] == "holder" and held["node"] == bound["spec"]["nodeName"]
    assert held["blocks"] == 2
    assert str(held["gpu"]) == bound["metadata"]["annotations"]["edgegpu.io/gpu-index"]
    why = plugin(cluster, url, "explain", "too-big", "-n", ns)
    verdicts = {n["verdict"] for n in why["nodes"]}
    assert "passed" not in verdicts, why
    print(f"kubectl edgegpu: {len(names)} nodes, {len(nodes)} GPUs, holder on {held['node']}, too-big: "
          f"{sorted({n['reason'] for n in why['nodes']})[:2]}")  # fmt: skip
