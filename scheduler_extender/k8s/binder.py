"""Bind: create the pod's ``v1.Binding``, carrying the GPU assignment as pod annotations.

The device plugin (and anyone reading the pod) finds the choice in the pod's annotations
(DESIGN.md §4); the API server writes them as it binds. Binding is idempotent: a pod already
bound to the same node counts as success (a retried bind whose first reply was lost). A pod is
bound by its uid, never by its name alone.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Protocol

from scheduler_extender.domain import Assignment
from scheduler_extender.errors import BindError
from scheduler_extender.k8s.client import BIND_CONCURRENCY, KubeApi, KubeError
from scheduler_extender.names import (
    ASSIGNED_AT_ANNOTATION,
    GPU_INDEX_ANNOTATION,
    GPU_UUID_ANNOTATION,
)


class Binder(Protocol):
    """Creates the ``v1.Binding`` for a pod, with its GPU assignment as annotations."""

    async def bind(self, assignment: Assignment) -> None:
        """Bind; ``BindError`` on failure. Already bound to that node = success."""
        ...


def assignment_annotations(assignment: Assignment) -> dict[str, str]:
    """The pod annotations that carry an assignment."""
    return {
        GPU_INDEX_ANNOTATION: ",".join(str(i) for i in assignment.gpu_indices),
        GPU_UUID_ANNOTATION: ",".join(assignment.gpu_uuids),
        ASSIGNED_AT_ANNOTATION: datetime.fromtimestamp(assignment.assigned_at, UTC)
        .isoformat(timespec="microseconds")
        .replace("+00:00", "Z"),
    }


class KubeBinder:
    """The Binder against the API server.

    Calls run in worker threads of their own: binds never wait behind other blocking work,
    and at most ``BIND_CONCURRENCY`` run at once.
    """

    def __init__(self, api: KubeApi) -> None:
        self._api = api
        self._pool = ThreadPoolExecutor(BIND_CONCURRENCY, thread_name_prefix="bind")

    def bind_blocking(self, a: Assignment) -> None:
        """Bind, with the assignment's annotations; raises BindError with the server's reason.

        The Binding carries the pod's uid, so the API server binds that pod only (409 for a
        pod of the same name and another uid). A 409 is success only when the pod of that
        uid is bound to that node already.
        """
        if not a.pod_uid:
            raise BindError(f"pod {a.namespace}/{a.name}: no uid to bind by")
        annotations = assignment_annotations(a) if a.gpu_indices else {}
        try:
            self._api.bind_pod(a.namespace, a.name, a.pod_uid, a.node, annotations)
        except KubeError as exc:
            if exc.status != 409:
                raise BindError(f"cannot bind pod {a.namespace}/{a.name}: {exc}") from None
            try:
                pod = self._api.get_pod(a.namespace, a.name)
            except KubeError as again:
                raise BindError(f"pod {a.namespace}/{a.name}: {again}") from None
            if (pod.get("metadata") or {}).get("uid") != a.pod_uid:
                raise BindError(
                    f"pod {a.namespace}/{a.name} is another pod than the one to bind"
                ) from None
            bound_to = (pod.get("spec") or {}).get("nodeName")
            if bound_to != a.node:
                raise BindError(
                    f"pod {a.namespace}/{a.name} is already bound to {bound_to!r}"
                ) from None

    async def bind(self, assignment: Assignment) -> None:
        """``bind_blocking`` off the event loop."""
        await asyncio.get_running_loop().run_in_executor(self._pool, self.bind_blocking, assignment)
