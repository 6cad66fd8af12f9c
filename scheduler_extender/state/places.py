"""Where nodes are: their Node objects' labels, and the rack and RDMA flag labels give them.

A Node object's labels (from the watch) win over the labels the node's agent reports; full
Node objects sent with a request override both. Imports numpy, ``names``, ``policy`` and
``state.table``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from scheduler_extender.names import RDMA_LABEL
from scheduler_extender.policy.rules.topology import TopologyArgs
from scheduler_extender.state.table import NodeTable


def rack_and_rdma(labels: Mapping[str, str], topo: TopologyArgs) -> tuple[str | None, bool]:
    """The rack (None: none) and the RDMA flag that a node's labels say."""
    rack = labels.get(topo.rack_label) or (
        labels.get(topo.rack_label_fallback) if topo.rack_label_fallback else None
    )
    return rack, labels.get(RDMA_LABEL, "").lower() == "true"


def override_racks(
    table: NodeTable,
    rack: npt.NDArray[np.int64],
    rdma: npt.NDArray[np.bool_],
    labels: Sequence[Mapping[str, str] | None],
    topo: TopologyArgs,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Racks and RDMA flags as full Node objects' labels (where given) say."""
    rack, rdma = rack.copy(), rdma.copy()
    for i, node_labels in enumerate(labels):
        if node_labels:
            name, flag = rack_and_rdma(node_labels, topo)
            rack[i] = table.rack_id(name)
            rdma[i] = flag
    return rack, rdma


def racks_of(table: NodeTable, nodes: Iterable[str]) -> npt.NDArray[np.int64]:
    """The rack ids of the nodes that have a row and a rack, sorted, each once."""
    racks = {table.column("rack")[row] for node in nodes if (row := table.row(node)) is not None}
    return np.array(sorted(r for r in racks if r >= 0), dtype=np.int64)


class NodeLabels:
    """The labels of every node a Node object lists."""

    def __init__(self) -> None:
        self._by_node: dict[str, Mapping[str, str]] = {}

    def __contains__(self, node: object) -> bool:
        """Whether a Node object lists the node."""
        return node in self._by_node

    def set(self, node: str, labels: Mapping[str, str]) -> None:
        """The labels of the node's Node object (a copy is kept)."""
        self._by_node[node] = dict(labels)

    def forget(self, node: str) -> None:
        """The node's Node object is gone."""
        self._by_node.pop(node, None)

    def of(self, node: str, agent: Mapping[str, str]) -> Mapping[str, str]:
        """The node's labels: its agent's, and its Node object's over them."""
        return {**agent, **self._by_node.get(node, {})}
