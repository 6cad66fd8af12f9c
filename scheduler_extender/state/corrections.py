"""Assignments corrected from what agents' reports say pods hold (kubelet's PodResources).

Bind chooses a pod's GPU; kubelet's device manager may give it another one of the same node.
The agent's device plugin reports which GPU each pod holds (``PodHolder``), and the assignment
is made to name that one, so that every action on the pod follows the GPU it really has. An
assignment read again later (from the pod's annotations) is corrected again from what is kept
here. Imports ``domain``, ``telemetry.report`` and ``state.allocations``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Container, Sequence

from scheduler_extender.domain import Assignment
from scheduler_extender.state.allocations import Allocations
from scheduler_extender.telemetry.report import Digest, PodHolder

log = logging.getLogger("scheduler_extender.state")


@dataclasses.dataclass(frozen=True, slots=True)
class Held:
    """The GPUs a report showed a pod holds on its node."""

    node: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]

    def apply(self, a: Assignment) -> Assignment:
        """The assignment naming these GPUs."""
        return dataclasses.replace(a, gpu_indices=self.gpu_indices, gpu_uuids=self.gpu_uuids)


class Corrections:
    """The GPUs reports showed pods hold where bind had said others, and what was checked."""

    def __init__(self) -> None:
        self.count = 0
        """Assignments whose GPUs a report showed the pod does not hold, and were corrected."""
        self._held: dict[str, Held] = {}
        """By pod uid: the GPUs a report showed the pod holds, where bind had said others (an
        assignment read again from the pod's annotations is corrected again)."""
        self._holders_seen: dict[str, tuple[int, tuple[PodHolder, ...], tuple[str, ...]]] = {}
        """By node: the holders and GPUs of its last report checked, with its assignments'
        stamp then (the same again is not checked again)."""

    def correct(
        self,
        allocations: Allocations,
        node: str,
        holders: Sequence[PodHolder],
        d: Digest,
        wall: float,
        reserved: Container[str],
    ) -> None:
        """Make each assignment on ``node`` name the GPUs its pod holds, as the report says.

        A report speaks for its own node: only pods assigned to ``node`` are looked up (by
        namespace and name), and only GPUs it lists are taken. Whole GPUs are not the device
        plugin's (nothing is said of them); a name two assignments share, a pod listed on two
        GPUs, a reservation (``reserved``), and a bind of the last two report intervals before
        ``wall`` are left alone.
        """
        seen = (allocations.stamp(node), tuple(holders), d.uuids)
        if self._holders_seen.get(node) == seen:
            return  # most reports: the same pods on the same GPUs, checked already
        held: dict[tuple[str, str], list[str]] = {}
        for h in holders:
            held.setdefault((h.namespace, h.name), []).append(h.gpu_uuid)
        index_of = dict(zip(d.uuids, map(int, d.column("index")), strict=True))
        on_node: dict[tuple[str, str], list[Assignment]] = {}
        for a in allocations.on_node(node):
            if (a.namespace, a.name) in held:
                on_node.setdefault((a.namespace, a.name), []).append(a)
        # A report of the first moments after a bind may still show a same-name predecessor.
        settled = wall - 2 * d.interval_s
        deferred = False
        for key, found in on_node.items():
            a = found[0]
            uuids = held[key]
            if len(found) > 1 or a.whole or any(u not in index_of for u in uuids):
                continue
            if a.assigned_at > settled or a.pod_uid in reserved:
                deferred = True  # a reservation or a fresh bind: judged by a later report
                continue
            if len(uuids) > 1:
                continue  # a block pod sits on one GPU
            truth = sorted((index_of[u], u) for u in uuids)
            indices = tuple(i for i, _ in truth)
            if indices == a.gpu_indices:
                continue
            corrected = Held(node, indices, tuple(u for _, u in truth))
            self._held[a.pod_uid] = corrected
            allocations.add(corrected.apply(a), allocations.expires_at(a.pod_uid))
            self.count += 1
            log.warning(
                "pod %s/%s holds GPU %s of node %s, not GPU %s as assigned: its assignment is "
                "corrected (every action on it follows)",
                a.namespace, a.name, ",".join(map(str, indices)), node,
                ",".join(map(str, a.gpu_indices)),
            )  # fmt: skip
        # Stamped after the corrections it made: the same report again is not checked again.
        if not deferred:
            self._holders_seen[node] = (allocations.stamp(node), seen[1], seen[2])
        # The node's row is written after this, from the corrected assignments.

    def apply(self, assignment: Assignment) -> Assignment:
        """The assignment as the pod holds it, where a report showed other GPUs of its node."""
        held = self._held.get(assignment.pod_uid)
        if held is not None and held.node == assignment.node and not assignment.whole:
            return held.apply(assignment)  # what the pod holds, not what bind chose
        return assignment

    def forget_pod(self, pod_uid: str) -> None:
        """A pod's GPUs are free: nothing held is kept for it."""
        self._held.pop(pod_uid, None)

    def forget_node(self, node: str) -> None:
        """A node left: its next report is checked whatever the last one said."""
        self._holders_seen.pop(node, None)

    def keep_assigned(self, allocations: Allocations) -> None:
        """Drop what is kept for pods that no longer have an assignment (expired)."""
        if self._held:
            self._held = {u: h for u, h in self._held.items() if allocations.get(u)}
