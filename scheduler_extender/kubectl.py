"""``kubectl edgegpu``: GPUs, the pods that hold them, and why a pod fits nowhere.

kubectl runs any ``kubectl-edgegpu`` on PATH as ``kubectl edgegpu``. It reads the cluster with
the user's kubeconfig and reaches the extender through the API server's service proxy (the
``edgegpu-extender`` Service, as installed), as kubectl plugins do; ``--extender-url`` talks to
an extender directly instead.

    kubectl edgegpu nodes                  per node and GPU: temperature, power / limit, blocks
                                           free / held, health, hot or cooling, remediation
    kubectl edgegpu pods [-n NS | -A]      which pod holds which GPU and how many blocks
    kubectl edgegpu explain POD [-n NS]    every node's verdict for a pod, and why
    ... -o json                            the same as JSON

Everything printed comes from the cluster, and so from whoever can name a node, label a pod or
report a GPU: control characters (``logs.escape``) are written escaped, never sent raw to the
terminal.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson

from scheduler_extender.logs import CONTROL, escape
from scheduler_extender.names import (
    GPU_INDEX_ANNOTATION,
    GPU_UUID_ANNOTATION,
    MEM_BLOCK_RESOURCE,
    QOS_ANNOTATION,
)

NAMESPACE = "edgegpu-system"
SERVICE = "edgegpu-extender:8888"


class PluginError(Exception):
    """A one-line error for the user."""


class Cluster:
    """The API server through the user's kubeconfig, and the extender behind it."""

    def __init__(self, kubeconfig: Path | None, context: str | None, extender_url: str | None,
                 namespace: str, service: str) -> None:  # fmt: skip
        from kubernetes import client, config

        cfg = client.Configuration()
        self.api: Any = None
        self.problem = ""
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig) if kubeconfig else None,
                context=context,
                client_configuration=cfg,
            )
            self.api = client.ApiClient(cfg)
        except Exception as exc:
            self.problem = f"cannot load the kubeconfig: {exc}"
            if extender_url is None:
                raise PluginError(self.problem) from None
        self.extender_url = extender_url
        self.proxy = f"/api/v1/namespaces/{namespace}/services/{service}/proxy"

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        if self.api is None:  # only --extender-url was usable: nodes work, pods and explain not
            raise PluginError(self.problem)
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        m, url, headers, sent, _ = self.api.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        try:
            resp = self.api.call_api(m, url, headers, sent, _request_timeout=(5, 30))
            answer: bytes = resp.read() or b""
        except Exception as exc:
            raise PluginError(f"{method} {path}: {exc}") from None
        if resp.status >= 400:
            raise PluginError(f"{method} {path}: HTTP {resp.status}: {answer[:300]!r}")
        return orjson.loads(answer)

    def kube(self, path: str) -> Any:
        """A GET on the API server."""
        return self._request("GET", path)

    def extender(self, method: str, path: str, body: Any = None) -> Any:
        """The extender's answer, through the service proxy (or directly)."""
        if self.extender_url is None:
            return self._request(method, f"{self.proxy}/{path}", body)
        try:
            resp = httpx.request(method, f"{self.extender_url.rstrip('/')}/{path}", json=body,
                                 timeout=30)  # fmt: skip
        except httpx.HTTPError as exc:
            raise PluginError(f"{method} {path}: {exc}") from None
        if resp.status_code >= 400:
            raise PluginError(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:300]}")
        return resp.json()


def _table(rows: list[list[Any]], headers: list[str]) -> str:
    cells = [headers, *[[escape("-" if v is None else str(v)) for v in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cells)  # fmt: skip


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
            power = f"{_n(g.get('power_w'))}/{_n(g.get('power_limit_w'))}"
            blocks = (
                "whole"
                if g.get("held_whole")
                else f"{g.get('free_blocks')}/{g.get('allocated_blocks')}"
            )
            row = {"node": n["node"], "gpu": g["index"], "model": g.get("model"),
                   "vendor": g.get("vendor"), "temperature_c": g.get("temperature_c"),
                   "power_w": g.get("power_w"), "power_limit_w": g.get("power_limit_w"),
                   "free_blocks": g.get("free_blocks"), "held_blocks": g.get("allocated_blocks"),
                   "health": g.get("health"), "health_reasons": g.get("health_reasons") or [],
                   "state": state, "remediation": remediation}  # fmt: skip
            rows.append(row)
            table.append([n["node"], g["index"], g.get("model"), _n(g.get("temperature_c")), power,
                          blocks, g.get("health"), state, remediation])  # fmt: skip
    headers = ["NODE", "GPU", "MODEL", "TEMP°C", "POWER/LIMIT W", "BLOCKS FREE/HELD", "HEALTH",
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl edgegpu", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[7:12]))  # fmt: skip
    p.add_argument(
        "--kubeconfig", type=Path, default=None, help="default: $KUBECONFIG or ~/.kube/config"
    )
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument(
        "--extender-url", help="talk to the extender here instead of through the API server"
    )
    p.add_argument("--extender-namespace", default=NAMESPACE, help=f"default {NAMESPACE}")
    p.add_argument("--extender-service", default=SERVICE, help=f"NAME:PORT, default {SERVICE}")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("nodes", help="every GPU of every node")
    pp = sub.add_parser("pods", help="pods holding GPUs")
    pp.add_argument("-n", "--namespace")
    pp.add_argument("-A", "--all-namespaces", action="store_true")
    pe = sub.add_parser("explain", help="why a pod fits where it does, or nowhere")
    pe.add_argument("pod")
    pe.add_argument("-n", "--namespace", default="default")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; errors are one line on stderr and exit 1."""
    ns = _parser().parse_args(argv)
    kubeconfig = ns.kubeconfig
    if kubeconfig is None and os.environ.get("KUBECONFIG"):
        kubeconfig = Path(os.environ["KUBECONFIG"].split(os.pathsep)[0])
    try:
        cluster = Cluster(kubeconfig, ns.context, ns.extender_url, ns.extender_namespace,
                          ns.extender_service)  # fmt: skip
        if ns.command == "nodes":
            data: Any
            data, text = nodes(cluster)
        elif ns.command == "pods":
            data, text = pods(cluster, None if ns.all_namespaces else (ns.namespace or "default"))
        else:
            data, text = explain(cluster, ns.pod, ns.namespace)
    except PluginError as exc:
        print(f"kubectl edgegpu: {escape(str(exc))}", file=sys.stderr)
        return 1
    print(_json(data) if ns.output == "json" else text)
    return 0


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
