"""The Kubernetes API as edgegpu uses it, through the official ``kubernetes`` client.

Raw JSON in and out (``_preload_content=False`` and orjson): the caches keep plain dicts, and
typed model objects would cost more than the scheduler's whole decision. Every call is
blocking; callers run them in threads, never on the request path of the scheduler verbs.
"""

from __future__ import annotations

import builtins
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import orjson
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from scheduler_extender.names import (
    DRA_DRIVER,
    MAINTENANCE_API_VERSION,
    MAINTENANCE_PLURAL,
    POLICY_PLURAL,
)

log = logging.getLogger("scheduler_extender.k8s")

JsonDict = dict[str, Any]
POLICY_GROUP: Final = "kepler.io"
POLICY_VERSION: Final = "v1"
MAINTENANCE_GROUP, MAINTENANCE_VERSION = MAINTENANCE_API_VERSION.split("/")
MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Gone(KubeError):
    """The resourceVersion is too old (410): list again."""


class KubeTimeout(KubeError):
    """No answer within the call's timeout (the server may or may not have acted)."""


def _date(headers: Any, on_date: Callable[[str], None] | None) -> None:
    if on_date is not None and headers is not None:
        date = headers.get("Date")
        if date:
            on_date(str(date))


def _call(
    fn: Any,
    *args: Any,
    stream: bool = False,
    on_date: Callable[[str], None] | None = None,
    **kwargs: Any,
) -> Any:
    """Call the API; the body is read and the connection given back to the pool.

    Unless ``stream`` (the caller reads and releases it): a connection never given back costs
    the next call a new TLS handshake, on both sides. ``on_date`` is told every answer's
    ``Date`` header, errors too.
    """
    try:
        resp = fn(*args, _preload_content=False, **kwargs)
        _date(getattr(resp, "headers", None), on_date)
        if not stream:
            resp.data  # noqa: B018 - read to the end (kept on the response)
            resp.release_conn()
    except ApiException as exc:
        _date(exc.headers, on_date)
        message = exc.reason or ""
        try:
            message = orjson.loads(exc.body or b"{}").get("message") or message
        except orjson.JSONDecodeError:
            pass
        if exc.status == 410:
            raise Gone(410, message) from None
        raise KubeError(exc.status or 0, f"HTTP {exc.status}: {message}") from None
    except (TimeoutError, urllib3.exceptions.TimeoutError) as exc:
        raise KubeTimeout(0, f"{type(exc).__name__}: {exc}") from None
    except urllib3.exceptions.MaxRetryError as exc:
        if isinstance(exc.reason, urllib3.exceptions.TimeoutError):
            raise KubeTimeout(0, f"{type(exc.reason).__name__}: {exc.reason}") from None
        raise KubeError(0, f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:  # urllib3 connection errors and the like
        raise KubeError(0, f"{type(exc).__name__}: {exc}") from None
    return resp


BIND_CONCURRENCY = 32
"""Binds in flight to the API server at once (kube-scheduler sends them concurrently)."""


def load_api_client(kubeconfig: Path | None) -> client.ApiClient:
    """An ApiClient from a kubeconfig file, or from the in-cluster ServiceAccount."""
    cfg = client.Configuration()
    if kubeconfig is not None:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=cfg
        )
    else:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    # Binds run concurrently (``KubeBinder``): one kept-alive connection each.
    cfg.connection_pool_maxsize = BIND_CONCURRENCY
    # No retries inside the HTTP library: a write retried there could go out long after its
    # caller gave up on it (and after leadership was checked); callers retry themselves.
    cfg.retries = False
    return client.ApiClient(cfg)


LIST_PAGE = 500
"""Objects per page of a list (``limit``/``continue``): no answer holds a whole large cluster."""

REQUEST_TIMEOUT_S = 10.0
"""The longest any API call but a watch may take (the client's own default is none: a
half-open connection would hang the caller for good)."""


class KubeApi:
    """The handful of resources edgegpu reads and writes.

    Every call but a watch gives up after ``timeout_s`` (``KubeTimeout``, status 0).
    ``on_date``, when given, is told the ``Date`` header of every answer (the server's clock).
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        timeout_s: float = REQUEST_TIMEOUT_S,
        on_date: Callable[[str], None] | None = None,
    ) -> None:
        self.api_client = api_client
        self.timeout_s = timeout_s
        self.on_date = on_date
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.authn = client.AuthenticationV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.resource = client.ResourceV1Api(api_client)

    def with_timeout(
        self, timeout_s: float, on_date: Callable[[str], None] | None = None
    ) -> KubeApi:
        """The same client, whose calls give up after ``timeout_s``."""
        return KubeApi(self.api_client, timeout_s, on_date or self.on_date)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", self.timeout_s)
        return _call(fn, *args, on_date=self.on_date, **kwargs)

    def _lister(self, resource: str) -> Any:
        if resource == "nodes":
            return self.core.list_node, ()
        if resource == "pods":
            return self.core.list_pod_for_all_namespaces, ()
        if resource == "resourceslices":  # ours only
            return functools.partial(
                self.resource.list_resource_slice, field_selector=f"spec.driver={DRA_DRIVER}"
            ), ()
        if resource == "resourceclaims":
            return self.resource.list_resource_claim_for_all_namespaces, ()
        if resource == POLICY_PLURAL:
            return self.custom.list_cluster_custom_object, (
                POLICY_GROUP,
                POLICY_VERSION,
                POLICY_PLURAL,
            )
        if resource == MAINTENANCE_PLURAL:
            return self.custom.list_cluster_custom_object, (
                MAINTENANCE_GROUP,
                MAINTENANCE_VERSION,
                MAINTENANCE_PLURAL,
            )
        raise ValueError(resource)

    def list(self, resource: str, page: int = LIST_PAGE) -> tuple[list[JsonDict], str]:
        """Every object of a resource and the list's resourceVersion, ``page`` at a time.

        The pages are one snapshot (the API server serves every continuation at the first
        page's resourceVersion); an expired continuation is a ``Gone``: list again.
        """
        fn, args = self._lister(resource)
        items: list[JsonDict] = []
        token = ""
        while True:
            more: dict[str, Any] = {"_continue": token} if token else {}
            doc = orjson.loads(self._call(fn, *args, limit=page, **more).data)
            items += doc.get("items") or []
            meta = doc.get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    def watch(self, resource: str, resource_version: str, timeout_s: int) -> Iterator[JsonDict]:
        """Watch events after ``resource_version`` (with bookmarks); Gone on 410."""
        fn, args = self._lister(resource)
        resp = self._call(
            fn,
            *args,
            watch=True,
            stream=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_s,
            _request_timeout=(10, timeout_s + 30),
        )
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if not line or line.isspace():
                    continue
                event = orjson.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    code = int(status.get("code") or 0)
                    if code == 410:
                        raise Gone(410, status.get("message", "resource version too old"))
                    raise KubeError(code, f"watch {resource}: {status.get('message')}")
                yield event
        finally:
            resp.close()
            resp.release_conn()

    # -- pods ---------------------------------------------------------------------------------
    def get_pod(self, namespace: str, name: str) -> JsonDict:
        """One pod."""
        doc: JsonDict = orjson.loads(
            self._call(self.core.read_namespaced_pod, name, namespace).data
        )
        return doc

    def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        """Create the pod's ``v1.Binding`` to ``node`` (409 if it is bound already).

        The API server merges the Binding's annotations into the pod's as it binds it: one
        call, and the pod is never bound without them.
        """
        meta: JsonDict = {"name": name, "namespace": namespace}
        if annotations:
            meta["annotations"] = annotations
        body: JsonDict = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        if uid:
            body["metadata"]["uid"] = uid
        self._call(self.core.create_namespaced_pod_binding, name, namespace, body)

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> None:
        """The Eviction API (honours PodDisruptionBudgets: 429 when one forbids it).

        With ``uid``, only that pod: a new pod of the same name is left alone (409).
        """
        body: JsonDict = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        self._call(self.core.create_namespaced_pod_eviction, name, namespace, body)

    # -- nodes --------------------------------------------------------------------------------
    def get_node(self, name: str) -> JsonDict:
        """One node."""
        doc: JsonDict = orjson.loads(self._call(self.core.read_node, name).data)
        return doc

    def patch_node(self, name: str, patch: JsonDict) -> JsonDict:
        """Merge-patch a node (labels, annotations, taints, spec.unschedulable).

        With ``metadata.resourceVersion`` in the patch, 409 when the node changed since.
        """
        doc: JsonDict = orjson.loads(
            self._call(self.core.patch_node, name, patch, _content_type=MERGE_PATCH).data
        )
        return doc

    def set_node_condition(self, name: str, condition: JsonDict) -> None:
        """Add or replace one condition of a node's status (merged by ``type``)."""
        self._call(
            self.core.patch_node_status,
            name,
            {"status": {"conditions": [condition]}},
            _content_type=STRATEGIC_MERGE_PATCH,
        )

    # -- DRA: ResourceSlices ------------------------------------------------------------------
    def create_resource_slice(self, body: JsonDict) -> JsonDict:
        """Create a ResourceSlice."""
        doc: JsonDict = orjson.loads(self._call(self.resource.create_resource_slice, body).data)
        return doc

    def replace_resource_slice(self, name: str, body: JsonDict) -> JsonDict:
        """Replace a ResourceSlice; 409 unless ``body``'s resourceVersion is the stored one."""
        doc: JsonDict = orjson.loads(
            self._call(self.resource.replace_resource_slice, name, body).data
        )
        return doc

    def delete_resource_slice(self, name: str, uid: str, resource_version: str) -> None:
        """Delete a ResourceSlice, only the one of that uid and resourceVersion (409 else)."""
        body = {"preconditions": {"uid": uid, "resourceVersion": resource_version}}
        self._call(self.resource.delete_resource_slice, name, body=body)

    # -- authentication, events, leases, policy ---------------------------------------------
    def token_review(self, token: str, audiences: Sequence[str] = ()) -> JsonDict:
        """The TokenReview status for a token (valid for one of ``audiences`` when given)."""
        spec: JsonDict = {"token": token}
        if audiences:
            spec["audiences"] = [*audiences]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        doc = orjson.loads(self._call(self.authn.create_token_review, body).data)
        status: JsonDict = doc.get("status") or {}
        return status

    def create_event(self, namespace: str, event: JsonDict) -> str:
        """Record a core/v1 Event; returns its name."""
        doc = orjson.loads(self._call(self.core.create_namespaced_event, namespace, event).data)
        return str((doc.get("metadata") or {}).get("name", ""))

    def patch_event(self, namespace: str, name: str, patch: JsonDict) -> None:
        """Merge-patch an Event (a repeat: its count, lastTimestamp and message)."""
        self._call(
            self.core.patch_namespaced_event, name, namespace, patch, _content_type=MERGE_PATCH
        )

    def get_lease(self, namespace: str, name: str) -> JsonDict | None:
        """A Lease, or None when there is none."""
        try:
            doc: JsonDict = orjson.loads(
                self._call(self.coordination.read_namespaced_lease, name, namespace).data
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return doc

    def create_lease(self, namespace: str, lease: JsonDict) -> JsonDict:
        """Create a Lease (409 if someone else did first)."""
        doc: JsonDict = orjson.loads(
            self._call(self.coordination.create_namespaced_lease, namespace, lease).data
        )
        return doc

    def replace_lease(self, namespace: str, name: str, lease: JsonDict) -> JsonDict:
        """Replace a Lease; 409 when its resourceVersion moved on (someone else wrote it)."""
        doc: JsonDict = orjson.loads(
            self._call(self.coordination.replace_namespaced_lease, name, namespace, lease).data
        )
        return doc

    def get_config_map(self, namespace: str, name: str) -> JsonDict | None:
        """A ConfigMap, or None when there is none."""
        try:
            doc: JsonDict = orjson.loads(
                self._call(self.core.read_namespaced_config_map, name, namespace).data
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return doc

    def put_config_map(self, namespace: str, name: str, data: dict[str, str]) -> None:
        """Create a ConfigMap with ``data``, or replace the data of the one there."""
        body: JsonDict = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": data,
        }
        try:
            self._call(self.core.create_namespaced_config_map, namespace, body)
        except KubeError as exc:
            if exc.status != 409:
                raise
            self._call(
                self.core.patch_namespaced_config_map, name, namespace, {"data": data},
                _content_type=MERGE_PATCH,
            )  # fmt: skip

    def write_config_map(
        self, namespace: str, name: str, data: dict[str, str], resource_version: str | None
    ) -> JsonDict:
        """Create the ConfigMap (``resource_version`` None), or replace it at that version.

        409 when someone else wrote it since (or created it first); 404 when it was deleted.
        """
        body: JsonDict = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": data,
        }
        if resource_version is None:
            resp = self._call(self.core.create_namespaced_config_map, namespace, body)
        else:
            body["metadata"]["resourceVersion"] = resource_version
            resp = self._call(self.core.replace_namespaced_config_map, name, namespace, body)
        doc: JsonDict = orjson.loads(resp.data)
        return doc

    def set_policy_status(self, name: str, status: JsonDict) -> None:
        """Write a GPUSchedulingPolicy's status subresource."""
        self._call(
            self.custom.patch_cluster_custom_object_status,
            POLICY_GROUP,
            POLICY_VERSION,
            POLICY_PLURAL,
            name,
            {"status": status},
        )

    # -- GPU maintenances ---------------------------------------------------------------------
    def list_maintenances(self) -> builtins.list[JsonDict]:
        """Every GPUMaintenance (one page: a fleet has a handful)."""
        return self.list(MAINTENANCE_PLURAL)[0]

    def replace_maintenance_status(self, name: str, doc: JsonDict) -> JsonDict:
        """Replace a GPUMaintenance's status; 409 unless ``doc``'s resourceVersion is current."""
        out: JsonDict = orjson.loads(
            self._call(
                self.custom.replace_cluster_custom_object_status,
                MAINTENANCE_GROUP,
                MAINTENANCE_VERSION,
                MAINTENANCE_PLURAL,
                name,
                doc,
            ).data
        )
        return out

    def patch_maintenance(self, name: str, patch: JsonDict) -> JsonDict:
        """Merge-patch a GPUMaintenance (its finalizers), at the patch's resourceVersion."""
        out: JsonDict = orjson.loads(
            self._call(
                self.custom.patch_cluster_custom_object,
                MAINTENANCE_GROUP,
                MAINTENANCE_VERSION,
                MAINTENANCE_PLURAL,
                name,
                patch,
                _content_type=MERGE_PATCH,
            ).data
        )
        return out
