"""``make cluster``: the e2e suite's cluster, kept running for people who want kubectl.

A real control plane (etcd, kube-apiserver, kube-controller-manager, the default
kube-scheduler), edgegpu installed as docs/install.md says, two extender replicas, the
edgegpu scheduler, N simulated GPU nodes with their agents (a fake kubelet runs their pods) and
R nodes run by the real kubelet, containerd and runc (``realnode.py``), where pods really run.
The admin kubeconfig is written to ``.e2e/kubeconfig``. Ctrl-C or SIGTERM stops everything.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

import yaml

from tests.e2e import conftest
from tests.e2e.controlplane import ROOT
from tests.e2e.realnode import IMAGE, TAINT, why_no_real_node

SCENARIOS = ["steady", "steady", "overheat", "xid-79", "steady", "ecc", "steady", "gpu-lost"]


def node_table(count: int) -> list[tuple[str, int, str, str]]:
    """``count`` nodes with a varied scenario mix, as ``make run`` has."""
    return [
        (f"edge-{i}", 2 + (i % 3) * 2, SCENARIOS[i % len(SCENARIOS)], f"rack-{'ab'[i % 2]}")
        for i in range(count)
    ]


def _stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM or SIGINT: stop as Ctrl-C does; later signals are ignored until it is done."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def faults(nodes: list[tuple[str, int, str, str]]) -> str:
    """One line per simulated fault, for the startup message."""
    what = {
        "overheat": "GPU 0 overheats (blocked airflow), held while its agent runs",
        "xid-79": "GPU 0 raises XID 79 until a passing self-test resets it (the fault loop "
        "asks for one once remediation is on)",
        "ecc": "GPU 0 has uncorrectable ECC errors (its self-test fails)",
        "gpu-lost": "the last GPU is lost (its self-test fails)",
    }
    return "\n".join(
        f"  {name}: {what[scenario]}" for name, _, scenario, _ in nodes if scenario in what
    )


def write_private(path: Path, text: str) -> None:
    """``text`` in ``path``, readable by its owner only: the user who ran ``sudo make cluster``
    where there is one (an admin token, and with a real node root on this machine)."""
    uid, gid = os.environ.get("SUDO_UID", ""), os.environ.get("SUDO_GID", "")
    owner = (int(uid), int(gid)) if os.geteuid() == 0 and uid.isdigit() and gid.isdigit() else None
    path.parent.mkdir(exist_ok=True)
    if owner is not None:
        os.chown(path.parent, *owner)  # a later make cluster without sudo can write there
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        if owner is not None:
            os.fchown(out.fileno(), *owner)
        out.write(text)


def user_kubeconfig(cluster: conftest.Cluster) -> str:
    """The admin kubeconfig with its CA inline: the run's folder is root's alone."""
    doc = yaml.safe_load(cluster.cp.admin_kubeconfig.read_text())
    for entry in doc["clusters"]:
        ca = Path(entry["cluster"].pop("certificate-authority"))
        entry["cluster"]["certificate-authority-data"] = base64.b64encode(ca.read_bytes()).decode()
    return str(yaml.safe_dump(doc))


def main(argv: list[str] | None = None) -> int:
    """Start the cluster, print what to try, wait for Ctrl-C or SIGTERM; stop it all."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, default=4, help="simulated GPU nodes (default 4)")
    p.add_argument("--real-nodes", type=int, default=1,
                   help="nodes run by the real kubelet, two simulated T4s each (default 1)")  # fmt: skip
    p.add_argument("--interval-s", type=float, default=2.0, help="agents' report interval")
    args = p.parse_args(argv)
    if args.nodes < 1 or args.real_nodes < 0:
        print("make cluster: NODES must be 1 or more, REAL_NODES 0 or more", file=sys.stderr)
        return 2
    why = why_no_real_node() if args.real_nodes else None
    if why:
        print(f"make cluster: {why} (or REAL_NODES=0)", file=sys.stderr)
        return 2
    real = [(f"real-{i}", 2, "rack-r") for i in range(args.real_nodes)]
    conftest.NODES[:] = node_table(args.nodes)
    # From the start: a signal while the cluster comes up stops what has started, too.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    folder = Path(tempfile.mkdtemp(prefix="edgegpu-cluster-"))
    kubeconfig = ROOT / ".e2e" / "kubeconfig"
    keep = os.environ.get("EDGEGPU_E2E_KEEP") == "1"
    cluster: conftest.Cluster | None = None
    try:
        print(f"starting the control plane and edgegpu (logs in {folder}/logs) ...", flush=True)
        started = time.monotonic()
        try:
            cluster = conftest.start_cluster(folder, agent_interval_s=args.interval_s,
                                             settle=False, real_nodes=real)  # fmt: skip
        except Exception as exc:
            print(f"make cluster: {exc}", file=sys.stderr)
            return 1
        write_private(kubeconfig, user_kubeconfig(cluster))
        print(welcome(cluster, args.nodes, time.monotonic() - started, kubeconfig), flush=True)
        while all(p.alive() for p in cluster.cp.processes):
            time.sleep(1.0)
        dead = [p.name for p in cluster.cp.processes if not p.alive()]
        keep = True
        print(f"make cluster: {', '.join(dead)} exited; see {folder}/logs", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # nothing cuts the clean-up short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if cluster is not None:
            conftest.stop_cluster(cluster)
        kubeconfig.unlink(missing_ok=True)
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def real_node_try(cluster: conftest.Cluster) -> str:
    """A pod holding GPU blocks on the first real node, to exec into (nothing without one)."""
    if not cluster.real:
        return ""
    node = next(iter(cluster.real))
    spec = (
        '{"spec":{"schedulerName":"edgegpu-scheduler","nodeSelector":{"kubernetes.io/hostname":'
        f'"{node}"}},"tolerations":[{{"key":"{TAINT}","operator":"Exists"}}],"containers":'
        f'[{{"name":"shell","image":"{IMAGE}","imagePullPolicy":"Never","command":["sleep",'
        '"3600"],"resources":{"limits":{"edgegpu.io/gpu-mem-block":"1"}}}]}}'
    )
    return f"""
On {node} (the real kubelet, containerd and runc; no GPU: the device plugin's environment):
  kubectl run shell --image={IMAGE} --restart=Never --overrides='{spec}'
  kubectl exec shell -- sh -c 'env | grep -e NVIDIA -e EDGEGPU'
"""


def welcome(cluster: conftest.Cluster, nodes: int, took_s: float, kubeconfig: Path) -> str:
    """What is up and what to try."""
    kubectl = cluster.cp.binary("kubectl")
    node = conftest.NODES[0][0]
    ca = cluster.balancer.pki.ca
    return f"""
Kubernetes is up in {took_s:.0f} s ({cluster.cp.versions()}), with edgegpu,
{nodes} simulated GPU nodes and {len(cluster.real)} run by the real kubelet. The admin kubeconfig is {kubeconfig.relative_to(ROOT)};
kubectl (the one built with the control plane) is {kubectl}. Try:

  export KUBECONFIG=$PWD/.e2e/kubeconfig; alias kubectl={kubectl}
  kubectl get nodes -L edgegpu.io/rack
  kubectl get gpuschedulingpolicies
  kubectl run infer --image=example/app --restart=Never \\
    --overrides='{{"spec":{{"schedulerName":"edgegpu-scheduler","containers":[{{"name":"infer","image":"example/app","resources":{{"limits":{{"edgegpu.io/gpu-mem-block":"1"}}}}}}]}}}}'
  kubectl get pod infer -o wide -w                       # Ctrl-C once it has a node
  kubectl get pod infer -o jsonpath='{{.metadata.annotations}}{{"\\n"}}'
  kubectl get events --field-selector involvedObject.name=infer
  curl -s --cacert {ca} {cluster.extenders[0].url}/debug/nodes | python3 -m json.tool | head -40
{real_node_try(cluster)}
Simulated faults (no node is kept out of the fault loop):
{faults(conftest.NODES) or "  none (NODES=3 or more has some)"}
The fault loop, on (see docs/remediation.md):
  kubectl patch gpuschedulingpolicy edge-gpu-policy --type merge \\
    -p '{{"spec":{{"remediation":{{"enabled":true,"dryRun":false}}}}}}'
  curl -s --cacert {ca} {cluster.extenders[0].url}/debug/remediation | python3 -m json.tool

The extender replicas answer on {", ".join(e.url for e in cluster.extenders)}; {node}'s
agent and the others push to both. Ctrl-C or SIGTERM stops everything and removes
{cluster.cp.folder} (EDGEGPU_E2E_KEEP=1 keeps it)."""


if __name__ == "__main__":
    raise SystemExit(main())
