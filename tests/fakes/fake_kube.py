"""A fake Kubernetes API server: real REST/JSON and watch over HTTP on 127.0.0.1.

It speaks just enough of the API for edgegpu, and is driven by the real ``kubernetes`` client
through a kubeconfig — never by patching client methods:

* nodes: get, list, watch (resourceVersion, bookmarks), patch (labels, annotations, taints,
  ``spec.unschedulable``); pods: list/watch (all or per namespace, ``fieldSelector``
  ``spec.nodeName``/``metadata.name``, ``labelSelector``), get, create, patch, delete;
* ``pods/binding`` (409 when already bound), ``pods/eviction`` (429 when a
  PodDisruptionBudget allows no disruption), PodDisruptionBudgets (create, list);
* ``coordination.k8s.io`` Leases (get, create, replace with optimistic concurrency), core
  events (create, list), ``authentication.k8s.io`` TokenReviews (a token table set by tests),
  the cluster-scoped ``kepler.io/v1`` GPUSchedulingPolicy and ``edgegpu.io/v1alpha1``
  GPUMaintenance custom resources with ``/status`` (an object with finalizers is only marked
  deleted until they are removed).

Watches can be dropped (``drop_watches``) and the history compacted (``compact``): a watch
from an older resourceVersion then gets a 410 Gone ERROR event, as from a real API server.
"""

from __future__ import annotations

import copy
import email.utils
import json
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

JSON = dict[str, Any]
API_SERVER_AUDIENCE = "https://kubernetes.default.svc.cluster.local"


@dataclass(frozen=True)
class Kind:
    plural: str
    kind: str
    api_version: str
    namespaced: bool


KINDS = {
    k.plural: k
    for k in (
        Kind("nodes", "Node", "v1", False),
        Kind("pods", "Pod", "v1", True),
        Kind("events", "Event", "v1", True),
        Kind("leases", "Lease", "coordination.k8s.io/v1", True),
        Kind("configmaps", "ConfigMap", "v1", True),
        Kind("poddisruptionbudgets", "PodDisruptionBudget", "policy/v1", True),
        Kind("gpuschedulingpolicies", "GPUSchedulingPolicy", "kepler.io/v1", False),
        Kind("gpumaintenances", "GPUMaintenance", "edgegpu.io/v1alpha1", False),
        Kind("resourceslices", "ResourceSlice", "resource.k8s.io/v1", False),
        Kind("resourceclaims", "ResourceClaim", "resource.k8s.io/v1", True),
    )
}

_SERVICE_PROXY = re.compile(
    r"^/api/v1/namespaces/(?P<ns>[^/]+)/services/(?P<svc>[^/]+)/proxy(?P<rest>/.*)?$"
)
_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[a-z0-9.-]+)/(?P<version>v[0-9a-z]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?$"
)


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> JSON:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}  # fmt: skip


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (also used for strategic merge: maps merge, lists replace)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def json_patch(target: JSON, ops: list[JSON]) -> JSON:
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        if op["op"] == "replace" and isinstance(parent, list):
            parent[int(last)] = op["value"]
        elif op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"])
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif (
            op["op"] == "test"
            and (parent[int(last)] if isinstance(parent, list) else parent.get(last)) != op["value"]
        ):
            raise ApiError(422, "Invalid", f"test failed at {op['path']}")
    return doc


def _matches(obj: JSON, field_selector: str | None, label_selector: str | None) -> bool:
    for clause in filter(None, (field_selector or "").split(",")):
        key, _, want = clause.partition("=")
        want = want.lstrip("=")
        value: Any = obj
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if (value or "") != want:
            return False
    labels = obj.get("metadata", {}).get("labels") or {}
    for clause in filter(None, (label_selector or "").split(",")):
        key, _, want = clause.partition("=")
        if labels.get(key) != want.lstrip("="):
            return False
    return True


@dataclass
class _Watch:
    stop: threading.Event = field(default_factory=threading.Event)


class FakeKube:
    """The server and its store. Start with ``with FakeKube() as kube:``."""

    def __init__(self, bookmark_interval_s: float = 1.0) -> None:
        self.objects: dict[tuple[str, str, str], JSON] = {}
        self.history: list[tuple[int, str, str, JSON]] = []  # (rv, plural, type, object)
        self.rv = 1000
        self.compacted_rv = 0
        self.cond = threading.Condition()
        self.tokens: dict[str, JSON] = {}
        self.audiences: dict[str, list[str]] = {}
        self.requests: list[tuple[str, str]] = []
        self.fail_next: dict[tuple[str, str], int] = {}
        """(method, path regex) → status code to answer once (fault injection)."""
        self.refuse: dict[tuple[str, str], int] = {}
        """(method, path regex) → status code to answer every time (e.g. 403: no RBAC)."""
        self.hang: dict[tuple[str, str], threading.Event] = {}
        """(method, regex searched in "path body") → an Event: matching requests get no answer
        until it is set (a half-open connection, as after a network partition)."""
        self.services: dict[tuple[str, str], str] = {}
        """(namespace, service[:port]) → the URL its endpoints answer on, for the service proxy
        (``/api/v1/namespaces/NS/services/NAME/proxy/PATH``, forwarded as the API server does)."""
        self.bookmark_interval_s = bookmark_interval_s
        self._watches: list[_Watch] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.connections = 0
        """TCP connections accepted so far."""
        self.now = time.time
        self.pages = 0
        """List answers served (a paginated list is several)."""
        """The server's clock: what every answer's ``Date`` header says (tests may set it)."""

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> FakeKube:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def date_time_string(self, timestamp: float | None = None) -> str:
                return email.utils.formatdate(fake.now(), usegmt=True)

            def do_GET(self) -> None:
                fake._handle(self, "GET")

            def do_POST(self) -> None:
                fake._handle(self, "POST")

            def do_PUT(self) -> None:
                fake._handle(self, "PUT")

            def do_PATCH(self) -> None:
                fake._handle(self, "PATCH")

            def do_DELETE(self) -> None:
                fake._handle(self, "DELETE")

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                return None  # clients closing keep-alive connections is not an error here

            def process_request(self, request: Any, client_address: Any) -> None:
                fake.connections += 1
                super().process_request(request, client_address)

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for released in self.hang.values():
            released.set()
        self.drop_watches()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-admin-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }))  # fmt: skip
        return path

    # -- store ----------------------------------------------------------------------------------
    @staticmethod
    def _generation(old: JSON | None, new: JSON) -> None:
        """metadata.generation: 1 at creation, +1 on every change outside status."""
        if old is None:
            new["metadata"]["generation"] = 1
            return
        gen = old["metadata"].get("generation", 1)
        changed = {k: v for k, v in new.items() if k not in ("status", "metadata")} != {
            k: v for k, v in old.items() if k not in ("status", "metadata")
        }
        new["metadata"]["generation"] = gen + 1 if changed else gen

    def _record(self, plural: str, kind: str, obj: JSON) -> JSON:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append((self.rv, plural, kind, copy.deepcopy(obj)))
        self.cond.notify_all()
        return obj

    def put(self, plural: str, obj: JSON, event: str | None = None) -> JSON:
        """Create or replace an object directly (test set-up), as a watch event."""
        k = KINDS[plural]
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", k.api_version)
        obj.setdefault("kind", k.kind)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2026-12-02T10:00:00Z")
        if k.namespaced:
            meta.setdefault("namespace", "default")
        key = (plural, meta.get("namespace", "") if k.namespaced else "", meta["name"])
        with self.cond:
            existed = key in self.objects
            self._generation(self.objects.get(key), obj)
            self.objects[key] = obj
            self._record(plural, event or ("MODIFIED" if existed else "ADDED"), obj)
            return copy.deepcopy(obj)

    def get(self, plural: str, name: str, namespace: str = "default") -> JSON | None:
        with self.cond:
            obj = self.objects.get((plural, namespace if KINDS[plural].namespaced else "", name))
            return copy.deepcopy(obj) if obj else None

    def delete(self, plural: str, name: str, namespace: str = "default") -> None:
        with self.cond:
            obj = self.objects.pop(
                (plural, namespace if KINDS[plural].namespaced else "", name), None
            )
            if obj is not None:
                self._record(plural, "DELETED", obj)

    def add_node(self, name: str, labels: dict[str, str] | None = None, *,
                 allocatable: dict[str, str] | None = None, **spec: Any) -> JSON:  # fmt: skip
        status = {
            "allocatable": allocatable or {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4"}
        }
        return self.put("nodes", {"metadata": {"name": name, "labels": labels or {}}, "spec": spec,
                                  "status": status})  # fmt: skip

    def add_pod(self, name: str, namespace: str = "default", node: str | None = None, *,
                labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
                uid: str | None = None, service_account: str = "default", phase: str = "Pending",
                limits: dict[str, str] | None = None, requests: dict[str, str] | None = None,
                scheduler: str = "edgegpu-scheduler") -> JSON:  # fmt: skip
        meta: JSON = {
            "name": name,
            "namespace": namespace,
            "labels": labels or {},
            "annotations": annotations or {},
        }
        if uid:
            meta["uid"] = uid
        spec: JSON = {"serviceAccountName": service_account, "schedulerName": scheduler,
                      "containers": [{"name": "app", "image": "app:1", "resources": {"limits": limits or {}, "requests": requests or {}}}]}  # fmt: skip
        if node:
            spec["nodeName"] = node
        return self.put("pods", {"metadata": meta, "spec": spec, "status": {"phase": phase}})

    def add_token(
        self, token: str, namespace: str, service_account: str, pod: str, pod_uid: str,
        audiences: tuple[str, ...] = ("edgegpu",),
    ) -> None:  # fmt: skip
        """A projected token for the pod, issued for ``audiences`` (the DaemonSet's: edgegpu)."""
        self.audiences[token] = list(audiences)
        self.tokens[token] = {
            "username": f"system:serviceaccount:{namespace}:{service_account}",
            "uid": str(uuid.uuid4()),
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{namespace}",
                "system:authenticated",
            ],
            "extra": {
                "authentication.kubernetes.io/pod-name": [pod],
                "authentication.kubernetes.io/pod-uid": [pod_uid],
            },
        }

    def compact(self) -> None:
        """Forget history: a watch resumed from any resourceVersion seen so far gets 410 Gone.

        (As if the API server's history had moved past every client's last version.)
        """
        with self.cond:
            self.rv += 1  # a revision of its own, as etcd's compaction has
            self.compacted_rv = self.rv
            self.history.clear()
            for w in self._watches:  # open watches end with the history they read from
                w.stop.set()
            self.cond.notify_all()

    def drop_watches(self) -> None:
        """End every open watch stream, as an API server restart or a load balancer would."""
        with self.cond:
            for w in self._watches:
                w.stop.set()
            self.cond.notify_all()

    def requests_to(self, pattern: str) -> list[tuple[str, str]]:
        return [r for r in self.requests if re.search(pattern, r[1])]

    # -- HTTP -----------------------------------------------------------------------------------
    def _send(self, h: BaseHTTPRequestHandler, code: int, body: JSON) -> None:
        data = json.dumps(body).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.requests.append((method, h.path))
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            for (m, pattern), released in list(self.hang.items()):
                if m == method and re.search(pattern, f"{url.path} {raw.decode(errors='replace')}"):
                    released.wait(timeout=120)
            for (m, pattern), code in list(self.refuse.items()):
                if m == method and re.search(pattern, url.path):
                    raise ApiError(code, HTTPStatus(code).phrase.replace(" ", ""), "refused")
            for (m, pattern), code in list(self.fail_next.items()):
                if m == method and re.search(pattern, url.path):
                    del self.fail_next[(m, pattern)]
                    raise ApiError(
                        code, HTTPStatus(code).phrase.replace(" ", ""), "injected failure"
                    )
            proxied = _SERVICE_PROXY.match(url.path)
            if proxied:
                self._proxy(h, method, proxied["ns"], proxied["svc"], proxied["rest"] or "/",
                            url.query, raw)  # fmt: skip
                return
            if url.path == "/apis/authentication.k8s.io/v1/tokenreviews" and method == "POST":
                self._send(h, 201, self._token_review(json.loads(raw)))
                return
            m = _PATH.match(url.path)
            if not m or m["plural"] not in KINDS:
                raise ApiError(
                    404, "NotFound", f"the server could not find the requested resource {url.path}"
                )
            plural, ns, name, sub = m["plural"], m["ns"] or "", m["name"], m["sub"]
            body = json.loads(raw) if raw else None
            if method == "GET" and name is None:
                if query.get("watch") in ("true", "1"):
                    self._watch(h, plural, ns, query)
                else:
                    self._send(h, 200, self._list(plural, ns, query))
                return
            code, out = self._dispatch(
                method, plural, ns, name, sub, body, h.headers.get("Content-Type", "")
            )
            self._send(h, code, out)
        except ApiError as exc:
            self._send(h, exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _proxy(self, h: BaseHTTPRequestHandler, method: str, ns: str, svc: str, rest: str,
               query: str, body: bytes) -> None:  # fmt: skip
        base = self.services.get((ns, svc))
        if base is None:
            raise ApiError(503, "ServiceUnavailable", f'no endpoints available for service "{svc}"')
        target = base.rstrip("/") + rest + (f"?{query}" if query else "")
        request = urllib.request.Request(target, data=body or None, method=method,
                                         headers={"Content-Type": h.headers.get("Content-Type") or "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                code, out, kind = resp.status, resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            code, out, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
        h.send_response(code)
        h.send_header("Content-Type", kind or "application/octet-stream")
        h.send_header("Content-Length", str(len(out)))
        h.end_headers()
        h.wfile.write(out)

    def _key(self, plural: str, ns: str, name: str) -> tuple[str, str, str]:
        return (plural, ns if KINDS[plural].namespaced else "", name)

    def _list(self, plural: str, ns: str, query: dict[str, str]) -> JSON:
        k = KINDS[plural]
        with self.cond:
            keys = [
                key for key, o in sorted(self.objects.items())
                if key[0] == plural and (not ns or key[1] == ns)
                and _matches(o, query.get("fieldSelector"), query.get("labelSelector"))
            ]  # fmt: skip
            meta: JSON = {"resourceVersion": str(self.rv)}
            if query.get("continue"):  # the key after which the page starts
                after = tuple(json.loads(query["continue"]))
                keys = [key for key in keys if key > after]
            limit = int(query.get("limit") or 0)
            if limit and len(keys) > limit:
                keys = keys[:limit]
                meta["continue"] = json.dumps(list(keys[-1]))
            self.pages += 1
            items = [copy.deepcopy(self.objects[key]) for key in keys]
            return {"kind": f"{k.kind}List", "apiVersion": k.api_version,
                    "metadata": meta, "items": items}  # fmt: skip

    def _watch(
        self, h: BaseHTTPRequestHandler, plural: str, ns: str, query: dict[str, str]
    ) -> None:
        watch = _Watch()
        timeout = float(query.get("timeoutSeconds", 1800))
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def emit(event: JSON) -> None:
            data = json.dumps(event).encode() + b"\n"
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            h.wfile.flush()

        def wanted(obj: JSON) -> bool:
            meta = obj.get("metadata", {})
            return (not ns or meta.get("namespace") == ns) and _matches(
                obj, query.get("fieldSelector"), query.get("labelSelector")
            )

        try:
            with self.cond:
                self._watches.append(watch)
                since = query.get("resourceVersion")
                if since in (None, "", "0"):
                    start = self.rv
                    initial = [
                        copy.deepcopy(o)
                        for (p, _, _), o in sorted(self.objects.items())
                        if p == plural
                    ]
                else:
                    start = int(since)
                    initial = []
                    if start < self.compacted_rv:
                        emit({"type": "ERROR", "object": ApiError(
                            410, "Expired", f"too old resource version: {start} ({self.compacted_rv})").status()})  # fmt: skip
                        return
            for obj in initial:
                if wanted(obj):
                    emit({"type": "ADDED", "object": obj})
            deadline = time.monotonic() + timeout
            last_bookmark = time.monotonic()
            while not watch.stop.is_set() and time.monotonic() < deadline:
                with self.cond:
                    pending = [e for e in self.history if e[0] > start and e[1] == plural]
                    if not pending:
                        self.cond.wait(timeout=0.1)
                        pending = [e for e in self.history if e[0] > start and e[1] == plural]
                    current = self.rv
                    if watch.stop.is_set():
                        break  # dropped or compacted: deliver nothing more on this stream
                for rv, _, kind, obj in pending:
                    start = rv
                    if wanted(obj):
                        emit({"type": kind, "object": obj})
                if watch.stop.is_set():
                    break
                if bookmarks and time.monotonic() - last_bookmark >= self.bookmark_interval_s:
                    last_bookmark = time.monotonic()
                    start = max(start, current)
                    k = KINDS[plural]
                    emit({"type": "BOOKMARK", "object": {"kind": k.kind, "apiVersion": k.api_version,
                                                         "metadata": {"resourceVersion": str(start)}}})  # fmt: skip
        except (BrokenPipeError, ConnectionResetError):
            return
        finally:
            with self.cond:
                if watch in self._watches:
                    self._watches.remove(watch)
            try:
                h.wfile.write(b"0\r\n\r\n")
                h.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass
            h.close_connection = True

    def _dispatch(self, method: str, plural: str, ns: str, name: str | None, sub: str | None,
                  body: Any, content_type: str) -> tuple[int, JSON]:  # fmt: skip
        k = KINDS[plural]
        with self.cond:
            if method == "POST" and name is None:
                obj = copy.deepcopy(body)
                meta = obj.setdefault("metadata", {})
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                if k.namespaced:
                    meta["namespace"] = ns
                key = self._key(plural, ns, meta["name"])
                if key in self.objects:
                    raise ApiError(
                        409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists'
                    )
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", "2026-12-02T10:00:00Z")
                obj.setdefault("apiVersion", k.api_version)
                obj.setdefault("kind", k.kind)
                self._generation(None, obj)
                self.objects[key] = obj
                return 201, copy.deepcopy(self._record(plural, "ADDED", obj))
            assert name is not None
            key = self._key(plural, ns, name)
            current = self.objects.get(key)
            if current is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            if sub == "binding" and method == "POST":
                target = body["target"]["name"]
                want_uid = (body.get("metadata") or {}).get("uid")
                if want_uid and want_uid != current["metadata"].get("uid"):
                    # As the API server's binding storage: the uid is a precondition.
                    raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: "
                                   f"{want_uid}, UID in object meta: {current['metadata'].get('uid')}")  # fmt: skip
                bound = current.get("spec", {}).get("nodeName")
                if bound:
                    raise ApiError(
                        409, "Conflict", f"pod {name} is already assigned to node {bound!r}"
                    )
                current.setdefault("spec", {})["nodeName"] = target
                extra = (body.get("metadata") or {}).get("annotations") or {}
                if extra:  # as the API server does: the Binding's annotations go on the pod
                    current["metadata"].setdefault("annotations", {}).update(extra)
                current.setdefault("status", {})["conditions"] = [
                    {"type": "PodScheduled", "status": "True"}
                ]
                self._record(plural, "MODIFIED", current)
                return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
            if sub == "eviction" and method == "POST":
                wanted_uid = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get(
                    "uid"
                )
                if wanted_uid and wanted_uid != current["metadata"].get("uid"):
                    raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: "
                                   f"{wanted_uid}, UID in object meta: {current['metadata'].get('uid')}")  # fmt: skip
                labels = current["metadata"].get("labels") or {}
                for (p, pns, _), pdb in self.objects.items():
                    if p != "poddisruptionbudgets" or pns != ns:
                        continue
                    selector = pdb.get("spec", {}).get("selector", {}).get("matchLabels", {})
                    if all(labels.get(a) == b for a, b in selector.items()):
                        allowed = pdb.get("status", {}).get("disruptionsAllowed", 0)
                        if allowed <= 0:
                            raise ApiError(429, "TooManyRequests",
                                           "Cannot evict pod as it would violate the pod's disruption budget.")  # fmt: skip
                        pdb["status"]["disruptionsAllowed"] = allowed - 1
                self.objects.pop(key)
                self._record(plural, "DELETED", current)
                return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
            if method == "GET":
                if sub not in (None, "status"):
                    raise ApiError(404, "NotFound", f"no subresource {sub}")
                return 200, copy.deepcopy(current)
            if method == "DELETE":
                wanted = (body or {}).get("preconditions") or {} if isinstance(body, dict) else {}
                meta = current["metadata"]
                for field_name in ("uid", "resourceVersion"):
                    if wanted.get(field_name) and wanted[field_name] != meta.get(field_name):
                        raise ApiError(409, "Conflict", f"Precondition failed: {field_name} in "
                                       f"precondition: {wanted[field_name]}, in object meta: "
                                       f"{meta.get(field_name)}")  # fmt: skip
                if meta.get("finalizers"):  # as the API server: deleted once they are gone
                    meta.setdefault("deletionTimestamp", "2026-12-02T10:00:00Z")
                    return 200, copy.deepcopy(self._record(plural, "MODIFIED", current))
                self.objects.pop(key)
                self._record(plural, "DELETED", current)
                return 200, copy.deepcopy(current)
            if method == "PUT":
                given = body.get("metadata", {}).get("resourceVersion")
                if given and given != current["metadata"]["resourceVersion"]:
                    raise ApiError(
                        409, "Conflict", f"the object has been modified; rv {given} is stale"
                    )
                new = copy.deepcopy(body)
                if sub == "status":
                    new = {**copy.deepcopy(current), "status": body.get("status", {})}
                new["metadata"] = {**current["metadata"], **{k2: v for k2, v in new.get("metadata", {}).items()
                                                              if k2 in ("labels", "annotations")}}  # fmt: skip
                self._generation(current, new)
                self.objects[key] = new
                return 200, copy.deepcopy(self._record(plural, "MODIFIED", new))
            if method == "PATCH":
                if "json-patch" in content_type:
                    new = json_patch(current, body)
                else:
                    given = (body.get("metadata") or {}).get("resourceVersion")
                    if given and given != current["metadata"]["resourceVersion"]:
                        raise ApiError(
                            409, "Conflict", f"the object has been modified; rv {given} is stale"
                        )
                    patch = body if sub != "status" else {"status": body.get("status", {})}
                    conditions = (patch.get("status") or {}).get("conditions")
                    if "strategic" in content_type and conditions is not None:
                        # Conditions merge by type in a strategic merge patch.
                        by_type = {
                            c["type"]: c for c in current.get("status", {}).get("conditions") or []
                        }
                        by_type.update({c["type"]: c for c in conditions})
                        patch = {**patch, "status": {**patch["status"], "conditions": list(by_type.values())}}  # fmt: skip
                    new = merge_patch(current, patch)
                new["metadata"]["uid"] = current["metadata"]["uid"]
                self._generation(current, new)
                if new["metadata"].get("deletionTimestamp") and not new["metadata"].get(
                    "finalizers"
                ):
                    self.objects.pop(key)
                    return 200, copy.deepcopy(self._record(plural, "DELETED", new))
                self.objects[key] = new
                return 200, copy.deepcopy(self._record(plural, "MODIFIED", new))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    def _token_review(self, body: JSON) -> JSON:
        token = body.get("spec", {}).get("token", "")
        user = self.tokens.get(token)
        # As the API server: the token must be for one of the audiences asked (its own when
        # none are), and the status names those that matched.
        wanted = body.get("spec", {}).get("audiences") or [API_SERVER_AUDIENCE]
        matched = [a for a in self.audiences.get(token, []) if a in wanted]
        if user is not None and not matched:
            user = None
        status: JSON = {"authenticated": user is not None}
        if user is not None:
            status["user"] = user
            status["audiences"] = matched
        else:
            status["error"] = "invalid bearer token"
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
                "spec": body.get("spec", {}), "status": status}  # fmt: skip


@contextmanager
def running(**kwargs: Any) -> Iterator[FakeKube]:
    with FakeKube(**kwargs) as kube:
        yield kube
