"""Nodes with telemetry that no Node object lists: the cap on them, and their silence.

Every node is one in the embedded mode (no Node objects at all). A push from a credential not
bound to one node names a new one only while fewer than the cap are kept, and one silent for
long is forgotten. Imports ``policy.staleness`` and ``telemetry.store``.
"""

from __future__ import annotations

from scheduler_extender.policy.staleness import StaleArgs
from scheduler_extender.telemetry.store import PutResult, TelemetryStore

MAX_UNLISTED_NODES = 16_384
"""Nodes kept that no Node object lists, by default: a push no credential binds to one node (a
static token for any node, a loopback push with no agent authentication) names a new one only
while fewer are kept. Above the largest fleet the extender is sized for (10,000 nodes), which
the embedded mode, with no Node objects at all, must hold."""
FORGET_AFTER_STALE = 10.0
FORGET_AFTER_MIN_S = 3600.0
"""A node that no Node object lists is forgotten once its telemetry is ``FORGET_AFTER_STALE``
times older than its ``staleAfter``, and an hour old at least (an edge link may drop for that
long): its row, its metric series and its place under ``MAX_UNLISTED_NODES``. Should it report
again, its agent's ``hot_s_ago`` restores a cool-down. A listed node is forgotten when its Node
is deleted."""


class Unlisted:
    """The unlisted nodes kept, at most ``max_nodes``, and counts of those refused or forgotten."""

    def __init__(self, max_nodes: int = MAX_UNLISTED_NODES) -> None:
        self.max_nodes = max_nodes
        """At most this many nodes are kept that no Node object lists (``MAX_UNLISTED_NODES``)."""
        self.nodes: set[str] = set()
        """Nodes with telemetry that no Node object lists (every node, in the embedded mode)."""
        self.forgotten = 0
        """Unlisted nodes forgotten after their silence (``FORGET_AFTER_STALE``)."""
        self.refused = 0
        """Pushes refused for naming a new unlisted node over ``max_nodes``."""

    def refuse(self, node: str) -> PutResult:
        """Count a push refused for naming ``node``, a new one over the cap; its answer."""
        self.refused += 1
        return PutResult(
            False,
            f"node {node!r} is refused: {self.max_nodes} nodes that no Node object "
            "lists are kept already, and a credential not bound to one node names no more (a "
            f"silent one is forgotten after {FORGET_AFTER_STALE:g} x its staleAfter, "
            f"{FORGET_AFTER_MIN_S:g} s at least)",
            refused=True,
        )

    def silent(self, store: TelemetryStore, now: float, stale: StaleArgs) -> list[str]:
        """The unlisted nodes silent for long enough to be forgotten (``FORGET_AFTER_STALE``)."""
        gone = []
        for node in self.nodes:
            record = store.get(node)
            if record is None or now - record.received_at > max(
                FORGET_AFTER_STALE * stale.stale_after_s(record.digest.interval_s),
                FORGET_AFTER_MIN_S,
            ):
                gone.append(node)
        return gone
