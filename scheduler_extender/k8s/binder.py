"""The seam between bind and the API server: write the GPU assignment, then the Binding.

Only the interface lives here until the Kubernetes client arrives; without a binder the
extender answers bind with a clear ``Error`` (embedded mode has no cluster to bind in).
"""

from __future__ import annotations

from typing import Protocol

from scheduler_extender.domain import Assignment


class Binder(Protocol):
    """Creates the ``v1.Binding`` for a pod after annotating it with its GPU assignment."""

    async def bind(self, assignment: Assignment) -> None:
        """Annotate and bind; ``BindError`` on failure. Already bound to that node = success."""
        ...
