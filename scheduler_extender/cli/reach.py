"""How ``kubectl edgegpu`` reaches an extender.

Through the API server's port-forward to a Ready extender pod (as ``kubectl port-forward``
does), or straight to ``--extender-url``; then one HTTPS exchange, checked against ConfigMap
edgegpu-ca (or the CA given). Every call has a limit.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import orjson

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

    def _request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        if self.api is None:  # only --extender-url was usable: nodes work, pods and explain not
            raise PluginError(self.problem)
        headers = {"Accept": "application/json", "Content-Type": content_type}
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

    def kube_write(self, method: str, path: str, body: Any = None) -> Any:
        """A POST, merge PATCH or DELETE on the API server."""
        kind = "application/merge-patch+json" if method == "PATCH" else "application/json"
        return self._request(method, path, body, kind)

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
