"""GPUs held for pods: assumed at bind, reserved from prioritize until bind, and released.

Every hold goes through the corrections (a pod keeps the GPUs a report showed it holds), and
each node whose assignments changed has its row written again (``written``). Imports
``domain`` and the ``state`` ledgers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scheduler_extender.domain import Assignment
from scheduler_extender.state.allocations import Allocations
from scheduler_extender.state.corrections import Corrections

RESERVE_TTL_S = 5.0
"""How long GPUs held for a pod between prioritize and its bind stay held without the bind."""


class Holds:
    """Assignments made and dropped, and which of them are reservations not bound yet."""

    def __init__(
        self, allocations: Allocations, corrections: Corrections, written: Callable[[str], None]
    ) -> None:
        self._allocations = allocations
        self._corrections = corrections
        self._written = written
        """Write a node's assignment columns again (its assignments changed)."""
        self.pods: set[str] = set()
        """Pods whose assignment is a reservation made at prioritize, not yet bound."""

    def assign(self, assignment: Assignment, expires: float | None) -> None:
        """Record GPUs given to a pod at bind (or read back); None: they do not expire."""
        self.pods.discard(assignment.pod_uid)
        self._hold(assignment, expires)

    def reserve(self, assignment: Assignment, now: float) -> None:
        """Hold GPUs for a pod from its prioritize until its bind (``RESERVE_TTL_S`` at most)."""
        self.pods.add(assignment.pod_uid)
        self._hold(assignment, now + RESERVE_TTL_S)

    def reserved(self, pod_uid: str) -> bool:
        """Whether the pod's assignment is a reservation (prioritized, not bound yet)."""
        return pod_uid in self.pods and self._allocations.get(pod_uid) is not None

    def _hold(self, assignment: Assignment, expires: float | None) -> None:
        assignment = self._corrections.apply(assignment)
        moved_from = self._allocations.add(assignment, expires)
        for node in {assignment.node, moved_from} - {None}:
            self._written(str(node))

    def renew_seen(self, node: str, pods: Sequence[tuple[int, str, float]], until: float) -> int:
        """Renew, to ``until``, the assumed assignments a report of ``node`` shows in use.

        ``pods``: the report's (GPU index, pod uid, MiB). A report speaks for its own node
        only: a pod assigned to another node or GPU is ignored, and counted (the number).
        """
        foreign = 0
        for index, pod_uid, _ in pods:
            a = self._allocations.get(pod_uid)
            if a is not None and a.node == node and index in a.gpu_indices:
                self._allocations.renew(pod_uid, until)
            elif a is not None:
                foreign += 1  # a pod of another node or GPU: ignored
        return foreign

    def release(self, pod_uid: str) -> None:
        """Free a pod's GPUs (bind failed, pod deleted)."""
        self.pods.discard(pod_uid)
        self._corrections.forget_pod(pod_uid)
        node = self._allocations.remove(pod_uid)
        if node is not None:
            self._written(node)

    def expire(self, now: float) -> None:
        """Drop assumed assignments and reservations whose time is up."""
        for node in self._allocations.expire(now):
            self._written(node)
        if self.pods:
            self.pods = {u for u in self.pods if self._allocations.get(u) is not None}
        self._corrections.keep_assigned(self._allocations)
