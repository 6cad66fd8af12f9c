"""Bind: write the GPU assignment on the pod, then create its ``v1.Binding``.

The device plugin (and anyone reading the pod) finds the choice in the pod's annotations
(DESIGN.md §4), so they are written first. Binding is idempotent: a pod already bound to the
same node counts as success (a retried bind whose first reply was lost).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Protocol

from scheduler_extender.domain import Assignment
from scheduler_extender.errors import BindError
from scheduler_extender.k8s.client import KubeApi, KubeError
from scheduler_extender.names import (
    ASSIGNED_AT_ANNOTATION,
    GPU_INDEX_ANNOTATION,
    GPU_UUID_ANNOTATION,
)


class Binder(Protocol):
    """Creates the ``v1.Binding`` for a pod after annotating it with its GPU assignment."""

    async def bind(self, assignment: Assignment) -> None:
        """Annotate and bind; ``BindError`` on failure. Already bound to that node = success."""
        ...


def assignment_annotations(assignment: Assignment) -> dict[str, str]:
    """The pod annotations that carry an assignment."""
    return {
        GPU_INDEX_ANNOTATION: ",".join(str(i) for i in assignment.gpu_indices),
        GPU_UUID_ANNOTATION: ",".join(assignment.gpu_uuids),
        ASSIGNED_AT_ANNOTATION: datetime.fromtimestamp(assignment.assigned_at, UTC)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z"),
    }


class KubeBinder:
    """The Binder against the API server (calls run in a worker thread)."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api

    def bind_blocking(self, a: Assignment) -> None:
        """Annotate (a pod given GPUs), then bind; raises BindError with the server's reason."""
        try:
            if a.gpu_indices:
                self._api.annotate_pod(a.namespace, a.name, assignment_annotations(a))
        except KubeError as exc:
            raise BindError(f"cannot annotate pod {a.namespace}/{a.name}: {exc}") from None
        try:
            self._api.bind_pod(a.namespace, a.name, a.pod_uid, a.node)
        except KubeError as exc:
            if exc.status != 409:
                raise BindError(f"cannot bind pod {a.namespace}/{a.name}: {exc}") from None
            try:
                bound_to = self._api.get_pod(a.namespace, a.name).get("spec", {}).get("nodeName")
            except KubeError as again:
                raise BindError(f"pod {a.namespace}/{a.name}: {again}") from None
            if bound_to != a.node:
                raise BindError(
                    f"pod {a.namespace}/{a.name} is already bound to {bound_to!r}"
                ) from None

    async def bind(self, assignment: Assignment) -> None:
        """``bind_blocking`` off the event loop."""
        await asyncio.to_thread(self.bind_blocking, assignment)
