"""``kubectl edgegpu``: GPUs, the pods that hold them, and why a pod fits nowhere.

kubectl runs any ``kubectl-edgegpu`` on PATH as ``kubectl edgegpu``. It reads the cluster with
the user's kubeconfig and reaches one extender pod (Ready first) through the API server as
``kubectl port-forward`` does, then speaks HTTPS to it, checked against ConfigMap edgegpu-ca.

    kubectl edgegpu nodes                  per node and GPU: temperature, power / limit, blocks
                                           free / held, health, hot or cooling, remediation
    kubectl edgegpu pods [-n NS | -A]      which pod holds which GPU and how many blocks
    kubectl edgegpu explain POD [-n NS]    every node's verdict for a pod, and why
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
import http.client
import os
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import orjson

from scheduler_extender.logs import CONTROL, escape
from scheduler_extender.names import (
    GPU_INDEX_ANNOTATION,
    GPU_UUID_ANNOTATION,
    MEM_BLOCK_RESOURCE,
    QOS_ANNOTATION,
)
from scheduler_extender.telemetry.fields import GPU_FIELDS

NAMESPACE = "edgegpu-system"
SERVICE = "edgegpu-extender"
"""The Service the extender's certificate names (``edgegpu-extender.<namespace>.svc``)."""
SELECTOR = "app.kubernetes.io/name=edgegpu-extender"
"""The Service's selector, as installed: the extender pods."""
PORT = 8888
CA_CONFIGMAP = "edgegpu-ca"
"""Holds ``ca.crt``, the CA that signs the extender's certificate (what the agents trust)."""
TIMEOUT_S = 30.0
"""Each call's limit (connecting, TLS, each read): the API server's, the port-forward's."""

PortForward = Callable[[Any, str, str, int], socket.socket]
"""(API client, namespace, pod, port) → a stream to that port of that pod."""


class PluginError(Exception):
    """A one-line error for the user (``status``: the HTTP status that caused it, if one did)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def port_forward(api: Any, namespace: str, pod: str, port: int) -> socket.socket:
    """A stream to ``port`` of ``pod`` through the API server (pods/portforward over a websocket).

    The kubelet connects to the port inside the pod's network namespace, so the extender sees
    a loopback client.
    """
    from kubernetes import client
    from kubernetes.stream import portforward

    forward = portforward(
        client.CoreV1Api(api).connect_get_namespaced_pod_portforward, pod, namespace,
        ports=str(port),
    )  # fmt: skip
    stream: socket.socket = forward.socket(port)
    return stream


def _within(timeout_s: float, what: str, call: Callable[[], socket.socket]) -> socket.socket:
    """``call()``, or a PluginError once ``timeout_s`` passed (the websocket takes no timeout)."""
    done: list[socket.socket | BaseException] = []

    def run() -> None:
        try:
            done.append(call())
        except Exception as exc:
            done.append(exc)

    worker = threading.Thread(target=run, name="edgegpu-port-forward", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not done:
        raise PluginError(f"{what}: no connection within {timeout_s:g} s")
    if isinstance(done[0], BaseException):
        reason = getattr(done[0], "reason", None) or done[0]  # an ApiException's str is lines
        raise PluginError(f"{what}: {reason}")
    return done[0]


def exchange(stream: socket.socket, host: str, method: str, path: str, body: Any = None) -> Any:
    """The JSON answer to one HTTP/1.1 request over a connected (TLS) stream, which it closes."""
    data = b"" if body is None else orjson.dumps(body)
    head = (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            "Connection: close\r\n\r\n")  # fmt: skip
    resp = http.client.HTTPResponse(stream, method=method)
    try:
        stream.sendall(head.encode("ascii") + data)
        resp.begin()
        answer = resp.read()
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise PluginError(f"{method} {path}: {exc or type(exc).__name__}") from None
    finally:
        resp.close()
        _close(stream)
    if resp.status >= 400:
        raise PluginError(f"{method} {path}: HTTP {resp.status}: {answer[:300]!r}", resp.status)
    try:
        return orjson.loads(answer)
    except orjson.JSONDecodeError:
        raise PluginError(f"{method} {path}: not JSON: {answer[:300]!r}") from None


def _close(stream: socket.socket) -> None:
    """Close ``stream`` after its peer ended it too, so that nothing it sent is left unread.

    The kubernetes client's port-forward thread fails, and prints why, on a stream closed with
    bytes unread (a TLS alert, say).
    """
    try:
        stream.shutdown(socket.SHUT_WR)  # a TLS socket: the raw socket's, and reads are raw now
        while stream.recv(65536):
            pass
    except OSError:
        pass
    finally:
        stream.close()


class Cluster:
    """The API server through the user's kubeconfig, and the extender behind it."""

    def __init__(self, kubeconfig: Path | None, context: str | None, extender_url: str | None,
                 namespace: str, extender_ca: Path | None, timeout_s: float = TIMEOUT_S,
                 forward: PortForward = port_forward) -> None:  # fmt: skip
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
        self.namespace = namespace
        self.extender_ca = extender_ca
        self.timeout_s = timeout_s
        self.forward = forward
        self._pod: str | None = None
        self._tls: tuple[ssl.SSLContext, str] | None = None

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        if self.api is None:  # only --extender-url was usable: nodes work, pods and explain not
            raise PluginError(self.problem)
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        m, url, headers, sent, _ = self.api.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        try:
            resp = self.api.call_api(m, url, headers, sent, _request_timeout=self.timeout_s)
            answer: bytes = resp.read() or b""
        except Exception as exc:
            raise PluginError(f"{method} {path}: {exc}") from None
        if resp.status >= 400:
            raise PluginError(f"{method} {path}: HTTP {resp.status}: {answer[:300]!r}", resp.status)
        return orjson.loads(answer)

    def kube(self, path: str) -> Any:
        """A GET on the API server."""
        return self._request("GET", path)

    def extender(self, method: str, path: str, body: Any = None) -> Any:
        """The extender's answer, through a port-forward to one of its pods (or directly)."""
        if self.extender_url is not None:
            return self._direct(self.extender_url, method, path, body)
        pod = self._pod = self._pod or self._extender_pod()
        context, trusted = self._tls = self._tls or self._trust()
        where = f"port-forward to pod {self.namespace}/{pod}:{PORT}"
        stream = _within(self.timeout_s, where,
                         lambda: self.forward(self.api, self.namespace, pod, PORT))  # fmt: skip
        host = f"{SERVICE}.{self.namespace}.svc"
        stream.settimeout(self.timeout_s)
        tls = context.wrap_socket(stream, server_hostname=host, do_handshake_on_connect=False)
        try:
            tls.do_handshake()
        except OSError as exc:
            _close(tls)
            raise PluginError(
                f"TLS to {host} ({where}): {exc}; checked against {trusted}"
            ) from None
        return exchange(tls, host, method, f"/{path}", body)

    def _extender_pod(self) -> str:
        """An extender pod that runs, a Ready one first."""
        found = self.kube(f"/api/v1/namespaces/{self.namespace}/pods"
                          f"?labelSelector={quote(SELECTOR)}").get("items") or []  # fmt: skip
        running = [p for p in found if (p.get("status") or {}).get("phase") == "Running"
                   and not p["metadata"].get("deletionTimestamp")]  # fmt: skip
        if not running:
            raise PluginError(f"no running extender pod ({SELECTOR}) in {self.namespace}")
        return str(min(running, key=lambda p: (not _ready(p), p["metadata"]["name"]))
                   ["metadata"]["name"])  # fmt: skip

    def _trust(self) -> tuple[ssl.SSLContext, str]:
        """Whom the extender's certificate must be signed by, and those words for an error."""
        if self.extender_ca is not None:
            return _context(self.extender_ca), str(self.extender_ca)
        where = f"ConfigMap {self.namespace}/{CA_CONFIGMAP}"
        try:
            ca = self.kube(f"/api/v1/namespaces/{self.namespace}/configmaps/{CA_CONFIGMAP}")
            pem = (ca.get("data") or {}).get("ca.crt")
            missing = "" if pem else "it has no ca.crt"
        except PluginError as exc:
            pem, missing = None, "not found" if exc.status == 404 else str(exc)
        if not pem:
            why = f"the system CAs, as {where} was not read ({missing}); --extender-ca names one"
            return ssl.create_default_context(), why
        try:
            return ssl.create_default_context(cadata=pem), f"the CA in {where}"
        except ssl.SSLError as exc:
            raise PluginError(f"{where}: ca.crt is no certificate: {exc}") from None

    def _direct(self, url: str, method: str, path: str, body: Any) -> Any:
        parts = urlsplit(url)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            port = 0
        if parts.scheme not in ("http", "https") or not parts.hostname or not port:
            raise PluginError(f"--extender-url {url}: not an http:// or https:// URL")
        context = _context(self.extender_ca) if parts.scheme == "https" else None
        try:
            stream = socket.create_connection((parts.hostname, port), timeout=self.timeout_s)
        except OSError as exc:
            raise PluginError(f"{method} {url}: {exc}") from None
        if context is not None:
            stream = context.wrap_socket(stream, server_hostname=parts.hostname,
                                         do_handshake_on_connect=False)  # fmt: skip
            try:
                stream.do_handshake()
            except OSError as exc:
                _close(stream)
                trusted = self.extender_ca or "the system CAs (SSL_CERT_FILE, or --extender-ca)"
                raise PluginError(f"TLS to {url}: {exc}; checked against {trusted}") from None
        return exchange(stream, parts.netloc, method, f"{parts.path.rstrip('/')}/{path}", body)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _context(ca_file: Path | None) -> ssl.SSLContext:
    """Certificates checked against ``ca_file``, or the system CAs (SSL_CERT_FILE honoured)."""
    try:
        return ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise PluginError(f"--extender-ca {ca_file}: {exc}") from None


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
                   "vendor": g.get("vendor"), **{k: g.get(k) for k in _SHOWN},
                   "free_blocks": g.get("free_blocks"), "held_blocks": g.get("allocated_blocks"),
                   "health": g.get("health"), "health_reasons": g.get("health_reasons") or [],
                   "state": state, "remediation": remediation}  # fmt: skip
            rows.append(row)
            readings = ["/".join(_n(g.get(k)) for k in keys) for keys in _COLUMNS.values()]
            table.append([n["node"], g["index"], g.get("model"), *readings, blocks, g.get("health"),
                          state, remediation])  # fmt: skip
    headers = ["NODE", "GPU", "MODEL", *_COLUMNS, "BLOCKS FREE/HELD", "HEALTH", "STATE",
               "REMEDIATION"]  # fmt: skip
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
                                epilog="\n".join(__doc__.splitlines()[6:11]))  # fmt: skip
    p.add_argument(
        "--kubeconfig", type=Path, default=None, help="default: $KUBECONFIG or ~/.kube/config"
    )
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--extender-url", metavar="URL",
                   help="talk to the extender here instead of through a port-forward")  # fmt: skip
    p.add_argument("--extender-ca", type=Path, metavar="FILE",
                   help=f"the CA of the extender's certificate (default: ConfigMap {CA_CONFIGMAP}"
                        " through a port-forward, the system CAs with --extender-url)")  # fmt: skip
    p.add_argument("--extender-namespace", default=NAMESPACE, help=f"default {NAMESPACE}")
    p.add_argument("--request-timeout", type=float, default=TIMEOUT_S, metavar="SECONDS",
                   help=f"each call's limit, default {TIMEOUT_S:g}")  # fmt: skip
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


def main(argv: Sequence[str] | None = None, forward: PortForward = port_forward) -> int:
    """Run one command; errors are one line on stderr and exit 1."""
    ns = _parser().parse_args(argv)
    kubeconfig = ns.kubeconfig
    if kubeconfig is None and os.environ.get("KUBECONFIG"):
        kubeconfig = Path(os.environ["KUBECONFIG"].split(os.pathsep)[0])
    try:
        cluster = Cluster(kubeconfig, ns.context, ns.extender_url, ns.extender_namespace,
                          ns.extender_ca, ns.request_timeout, forward)  # fmt: skip
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
