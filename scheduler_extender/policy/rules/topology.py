"""Topology rule: keep the pods of one job group in one rack, and prefer RDMA nodes.

Pure; imports only numpy, pydantic and ``policy.base``. Its term depends on the pod's group:
``combine`` works it out, for group members only.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from pydantic import Field

from scheduler_extender.names import RACK_LABEL, RACK_LABEL_FALLBACK
from scheduler_extender.policy.base import ArgsModel, Section, Term, class_weights

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class TopologyArgs(ArgsModel):
    """``spec.topology`` (ours)."""

    rack_label: str = Field(
        RACK_LABEL, alias="rackLabel", min_length=1, description="Node label naming the rack."
    )
    rack_label_fallback: str = Field(
        RACK_LABEL_FALLBACK,
        alias="rackLabelFallback",
        description="Label read when the rack label is absent ('' for none).",
    )
    rdma_share: float = Field(
        0.2,
        alias="rdmaShare",
        ge=0,
        le=1,
        description="Part of the topology term given by an RDMA-capable node.",
    )


SECTION = Section("topology", TopologyArgs, "Racks and RDMA for pods of one job group.")


def score(
    rack: IntArray,
    rdma: BoolArray,
    group_racks: IntArray,
    rack_free: FloatArray,
    args: TopologyArgs,
) -> FloatArray:
    """Topology term in 0..1 for the nodes of a pod that belongs to a group.

    Where the group already runs: 1 in one of its racks, else 0. A new group: the rack's free
    capacity for the group relative to the roomiest rack. Nodes without a rack get 0.
    score = (1 − rdmaShare) · rack part + rdmaShare · rdma
    """
    known = rack >= 0
    if group_racks.size:
        rack_part = np.isin(rack, group_racks).astype(np.float64)
    elif rack_free.size and rack_free.max() > 0:
        rack_part = rack_free[np.where(known, rack, 0)] / rack_free.max()
    else:
        rack_part = np.zeros(rack.shape, dtype=np.float64)
    rack_part = np.where(known, rack_part, 0.0)
    return (1.0 - args.rdma_share) * rack_part + args.rdma_share * rdma.astype(np.float64)


TERM = Term(
    "topology",
    "Keep a job group in one rack, prefer RDMA.",
    class_weights(realtime=1, training=3, inference=1, best_effort=0.5),
)
