"""``kubectl edgegpu``: GPUs, the pods that hold them, and why a pod fits nowhere.

kubectl runs any ``kubectl-edgegpu`` on PATH as ``kubectl edgegpu``. It reads the cluster with
the user's kubeconfig and reaches one extender pod (Ready first) through the API server as
``kubectl port-forward`` does, then speaks HTTPS to it, checked against ConfigMap edgegpu-ca.

    kubectl edgegpu nodes                  per node and GPU: temperature, power / limit, blocks
                                           free / held, health, hot or cooling, remediation
    kubectl edgegpu pods [-n NS | -A]      which pod holds which GPU and how many blocks
    kubectl edgegpu explain POD [-n NS]    every node's verdict for a pod, and why
    kubectl edgegpu maintenance list|show|begin|wait|pause|resume|abort|end
                                           rolling GPU maintenances (docs/maintenance.md)
    ... -o json                            the same as JSON

The extender answers /debug/* to loopback clients only, which a port-forward is (it connects
inside the pod): whoever may create pods/portforward in the extender's namespace may read it.
``--extender-url`` talks to an extender directly instead (``--extender-ca`` or SSL_CERT_FILE
for its CA). Everything printed comes from the cluster, and so from whoever can name a node,
label a pod or report a GPU: control characters (``logs.escape``) are written escaped, never
sent raw to the terminal.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from scheduler_extender.cli import maintenance
from scheduler_extender.cli.reach import (
    CA_CONFIGMAP,
    NAMESPACE,
    TIMEOUT_S,
    Cluster,
    PluginError,
    PortForward,
    port_forward,
)
from scheduler_extender.logs import CONTROL, escape
from scheduler_extender.names import (
    GPU_INDEX_ANNOTATION,
    GPU_UUID_ANNOTATION,
    MEM_BLOCK_RESOURCE,
    QOS_ANNOTATION,
)
from scheduler_extender.telemetry.fields import GPU_FIELDS


def _table(rows: list[list[Any]], headers: list[str]) -> str:
    cells = [headers, *[[escape("-" if v is None else str(v)) for v in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cells)  # fmt: skip


_COLUMNS = {
    column: tuple(f.name for f in GPU_FIELDS if f.kubectl == column)
    for column in dict.fromkeys(f.kubectl for f in GPU_FIELDS if f.kubectl)
}
"""The reading columns of ``nodes`` as the field table names them, in its order: each header
and the readings it shows, ``/`` between them."""
_SHOWN = tuple(k for keys in _COLUMNS.values() for k in keys)


def nodes(c: Cluster) -> tuple[list[dict[str, Any]], str]:
    """Per node and GPU (rows, and the table)."""
    known = c.extender("GET", "debug/nodes")["nodes"]
    try:
        loop = {n["node"]: n for n in c.extender("GET", "debug/remediation")["nodes"]}
    except PluginError:
        loop = {}
    rows, table = [], []
    for n in known:
        remediation = loop.get(n["node"], {}).get("state")
        for g in n.get("gpus") or []:
            state = "stale" if n.get("stale") else "hot" if g.get("hot") else (
                "cooling" if g.get("cool_down_until") else "ok")  # fmt: skip
            blocks = (
                "whole"
                if g.get("held_whole")
                else f"{g.get('free_blocks')}/{g.get('allocated_blocks')}"
            )
            row = {"node": n["node"], "gpu": g["index"], "model": g.get("model"),
                   "vendor": g.get("vendor"), "driver_version": g.get("driver_version"),
                   "vbios_version": g.get("vbios_version"), **{k: g.get(k) for k in _SHOWN},
                   "free_blocks": g.get("free_blocks"), "held_blocks": g.get("allocated_blocks"),
                   "health": g.get("health"), "health_reasons": g.get("health_reasons") or [],
                   "state": state, "remediation": remediation}  # fmt: skip
            rows.append(row)
            readings = ["/".join(_n(g.get(k)) for k in keys) for keys in _COLUMNS.values()]
            table.append([n["node"], g["index"], g.get("model"), g.get("driver_version"),
                          *readings, blocks, g.get("health"), state, remediation])  # fmt: skip
    headers = ["NODE", "GPU", "MODEL", "DRIVER", *_COLUMNS, "BLOCKS FREE/HELD", "HEALTH",
               "STATE", "REMEDIATION"]  # fmt: skip
    return rows, _table(table, headers)


def _n(v: Any) -> str:
    return "-" if v is None else f"{float(v):.0f}"


def pods(c: Cluster, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
    """Pods holding GPUs, from their annotations (what bind wrote)."""
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    rows = []
    for pod in c.kube(path).get("items") or []:
        meta = pod.get("metadata") or {}
        notes = meta.get("annotations") or {}
        if GPU_INDEX_ANNOTATION not in notes:
            continue
        blocks = sum(
            int(((ctr.get("resources") or {}).get("limits") or {}).get(MEM_BLOCK_RESOURCE, 0) or 0)
            for ctr in (pod.get("spec") or {}).get("containers") or []
        )
        rows.append({
            "namespace": meta.get("namespace"), "pod": meta.get("name"),
            "node": (pod.get("spec") or {}).get("nodeName"),
            "gpu": notes.get(GPU_INDEX_ANNOTATION), "uuid": notes.get(GPU_UUID_ANNOTATION),
            "blocks": blocks or None, "qos": notes.get(QOS_ANNOTATION),
            "phase": (pod.get("status") or {}).get("phase"),
        })  # fmt: skip
    headers = ["NAMESPACE", "POD", "NODE", "GPU", "UUID", "BLOCKS", "QOS", "PHASE"]
    keys = ["namespace", "pod", "node", "gpu", "uuid", "blocks", "qos", "phase"]
    return rows, _table([[r[k] for k in keys] for r in rows], headers)


def explain(c: Cluster, name: str, namespace: str) -> tuple[dict[str, Any], str]:
    """Every node's verdict for one pod (``/debug/explain`` with every node as a candidate)."""
    pod = c.kube(f"/api/v1/namespaces/{namespace}/pods/{name}")
    names = [n["metadata"]["name"] for n in c.kube("/api/v1/nodes").get("items") or []]
    doc = c.extender("POST", "debug/explain", {"Pod": pod, "NodeNames": names})
    rows = [[n["node"], n["verdict"], n.get("reason") or "", n["score"],
             ",".join(map(str, n.get("gpus") or []))] for n in doc["nodes"]]  # fmt: skip
    rows.sort(key=lambda r: (r[1] != "passed", -int(r[3]), r[0]))
    p = doc["pod"]
    asks = f"{p['mem_blocks']} block(s)" if p["mem_blocks"] else f"{p['whole_gpus']} whole GPU(s)"
    head = escape(f"pod {namespace}/{name}: {p['qos']}, asks {asks}") + "\n"
    return doc, head + _table(rows, ["NODE", "VERDICT", "REASON", "SCORE", "GPUS"])


def _options(p: argparse.ArgumentParser, defaults: bool) -> None:
    """The options every command takes, before or after its name, as kubectl's own flags.

    After the name they carry no default, so they never undo one given before it.
    """

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    p.add_argument("--kubeconfig", type=Path, default=default(None),
                   help="default: $KUBECONFIG or ~/.kube/config")  # fmt: skip
    p.add_argument("--context", default=default(None), help="kubeconfig context")
    p.add_argument("--extender-url", metavar="URL", default=default(None),
                   help="talk to the extender here instead of through a port-forward")  # fmt: skip
    p.add_argument("--extender-ca", type=Path, metavar="FILE", default=default(None),
                   help=f"the CA of the extender's certificate (default: ConfigMap {CA_CONFIGMAP}"
                        " through a port-forward, the system CAs with --extender-url)")  # fmt: skip
    p.add_argument("--extender-namespace", default=default(NAMESPACE),
                   help=f"default {NAMESPACE}")  # fmt: skip
    p.add_argument("--request-timeout", type=float, default=default(TIMEOUT_S), metavar="SECONDS",
                   help=f"each call's limit, default {TIMEOUT_S:g}")  # fmt: skip
    p.add_argument("-o", "--output", choices=["table", "json"], default=default("table"))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl edgegpu", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[6:13]))  # fmt: skip
    _options(p, defaults=True)
    sub = p.add_subparsers(dest="command", required=True)
    pn = sub.add_parser("nodes", help="every GPU of every node")
    pp = sub.add_parser("pods", help="pods holding GPUs")
    pp.add_argument("-n", "--namespace")
    pp.add_argument("-A", "--all-namespaces", action="store_true")
    pe = sub.add_parser("explain", help="why a pod fits where it does, or nowhere")
    pe.add_argument("pod")
    pe.add_argument("-n", "--namespace", default="default")
    for command in (pn, pp, pe):
        _options(command, defaults=False)
    maintenance.add_commands(sub, lambda command: _options(command, defaults=False))
    return p


def main(argv: Sequence[str] | None = None, forward: PortForward = port_forward) -> int:
    """Run one command; errors are one line on stderr and exit 1."""
    ns = _parser().parse_args(argv)
    kubeconfig = ns.kubeconfig
    if kubeconfig is None and os.environ.get("KUBECONFIG"):
        kubeconfig = Path(os.environ["KUBECONFIG"].split(os.pathsep)[0])
    try:
        cluster = Cluster(kubeconfig, ns.context, ns.extender_url, ns.extender_namespace,
                          ns.extender_ca, ns.request_timeout, forward)  # fmt: skip
        status = 0
        if ns.command == "nodes":
            data: Any
            data, text = nodes(cluster)
        elif ns.command == "maintenance":
            data, text, status = maintenance.run(cluster, ns, _table)
        elif ns.command == "pods":
            data, text = pods(cluster, None if ns.all_namespaces else (ns.namespace or "default"))
        else:
            data, text = explain(cluster, ns.pod, ns.namespace)
    except PluginError as exc:
        print(f"kubectl edgegpu: {escape(str(exc))}", file=sys.stderr)
        return 1
    print(_json(data) if ns.output == "json" else text)
    return status


def _json(data: Any) -> str:
    r"""``data`` as JSON whose control characters are all ``\u`` escapes: the same values.

    orjson escapes C0 in strings already (a raw newline is its indentation's); DEL, C1 and the
    bidirectional controls it writes raw, and only in strings, where a ``\u`` escape stands
    for the same character.
    """
    text = orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()
    return CONTROL.sub(lambda m: m[0] if m[0] == "\n" else f"\\u{ord(m[0]):04x}", text)


if __name__ == "__main__":
    sys.exit(main())
