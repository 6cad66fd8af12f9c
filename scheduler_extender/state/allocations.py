"""GPU assignments: which pod holds which blocks of which GPU (the assume cache of bind).

An assignment made at bind counts at once, before telemetry shows the pod, so that a burst of
pods cannot pile onto one cool node. An *assumed* assignment expires after ``ttl_s`` unless
telemetry shows the pod's process on that GPU, which renews it; an assignment read from the
pod's annotations (the pod watch) is *authoritative* and lasts until the pod is gone.
Imports ``domain`` only.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from dataclasses import dataclass

from scheduler_extender.domain import Assignment, QosClass


@dataclass(slots=True)
class _Entry:
    assignment: Assignment
    expires_at: float | None
    """Monotonic expiry; None = authoritative (no expiry)."""


class Allocations:
    """Assignments by pod uid, indexed by node. Not thread-safe: use one event loop."""

    def __init__(self) -> None:
        self._by_pod: dict[str, _Entry] = {}
        self._by_node: dict[str, set[str]] = defaultdict(set)
        self._by_group: dict[str, set[str]] = defaultdict(set)
        self._expiry: list[tuple[float, str]] = []
        self._writes = itertools.count(1)
        self._changed: dict[str, int] = {}
        """By node holding GPUs: when its assignments last changed (see ``stamp``)."""

    def __len__(self) -> int:
        return len(self._by_pod)

    def get(self, pod_uid: str) -> Assignment | None:
        """A pod's assignment, if any."""
        entry = self._by_pod.get(pod_uid)
        return entry.assignment if entry else None

    def on_node(self, node: str) -> list[Assignment]:
        """Every assignment on a node, by pod uid."""
        return [self._by_pod[uid].assignment for uid in sorted(self._by_node.get(node, ()))]

    def stamp(self, node: str) -> int:
        """A number that changes whenever the node's assignments do (0: it holds none)."""
        return self._changed.get(node, 0)

    def holds_gpus(self, node: str) -> bool:
        """Whether any pod holds GPUs of the node."""
        return bool(self._by_node.get(node))

    def gpus_held(self, node: str, qos: QosClass) -> list[int]:
        """GPU indices of a node that pods of class ``qos`` or above hold, sorted."""
        if not self.holds_gpus(node):
            return []
        return sorted({i for a in self.on_node(node) if a.qos >= qos for i in a.gpu_indices})

    def nodes_of_group(self, group: str) -> set[str]:
        """Nodes where pods of a job group hold GPUs."""
        return {self._by_pod[uid].assignment.node for uid in self._by_group.get(group, ())}

    def expires_at(self, pod_uid: str) -> float | None:
        """When an assumed assignment lapses (None: authoritative or absent)."""
        entry = self._by_pod.get(pod_uid)
        return entry.expires_at if entry else None

    def add(self, assignment: Assignment, expires_at: float | None) -> str | None:
        """Record an assignment; returns the node whose totals changed before (on a move)."""
        moved = self.remove(assignment.pod_uid)
        self._by_pod[assignment.pod_uid] = _Entry(assignment, expires_at)
        self._by_node[assignment.node].add(assignment.pod_uid)
        self._changed[assignment.node] = next(self._writes)
        if assignment.group is not None:
            self._by_group[assignment.group].add(assignment.pod_uid)
        if expires_at is not None:
            heapq.heappush(self._expiry, (expires_at, assignment.pod_uid))
        return moved if moved != assignment.node else None

    def remove(self, pod_uid: str) -> str | None:
        """Forget a pod's assignment; returns its node."""
        entry = self._by_pod.pop(pod_uid, None)
        if entry is None:
            return None
        node = entry.assignment.node
        self._changed[node] = next(self._writes)
        for index, key in ((self._by_node, node), (self._by_group, entry.assignment.group)):
            if key is None:
                continue
            uids = index.get(key)
            if uids is not None:
                uids.discard(pod_uid)
                if not uids:
                    del index[key]
        if node not in self._by_node:
            del self._changed[node]
        return node

    def renew(self, pod_uid: str, expires_at: float) -> None:
        """Push back an assumed assignment's expiry (telemetry shows the pod)."""
        entry = self._by_pod.get(pod_uid)
        if entry is not None and entry.expires_at is not None and expires_at > entry.expires_at:
            entry.expires_at = expires_at
            heapq.heappush(self._expiry, (expires_at, pod_uid))

    def expire(self, now: float) -> set[str]:
        """Drop assumed assignments whose time is up; returns the nodes that changed."""
        changed: set[str] = set()
        while self._expiry and self._expiry[0][0] <= now:
            _at, uid = heapq.heappop(self._expiry)
            entry = self._by_pod.get(uid)
            if entry is not None and entry.expires_at is not None and entry.expires_at <= now:
                node = self.remove(uid)
                if node is not None:
                    changed.add(node)
        return changed

    def totals(self, node: str) -> tuple[dict[int, int], set[int], dict[int, set[str]]]:
        """Per GPU index of a node: blocks held, GPUs held whole, and the pod uids on each."""
        blocks: dict[int, int] = defaultdict(int)
        whole: set[int] = set()
        pods: dict[int, set[str]] = defaultdict(set)
        for uid in self._by_node.get(node, ()):
            a = self._by_pod[uid].assignment
            for i in a.gpu_indices:
                pods[i].add(uid)
                if a.whole:
                    whole.add(i)
                else:
                    blocks[i] += a.mem_blocks
        return dict(blocks), whole, dict(pods)
