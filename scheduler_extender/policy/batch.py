"""The nodes a decision is about, as arrays: what every rule reads.

Imports only numpy and the standard library.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class NodeBatch:
    """The candidate nodes of one request as arrays: shape (N,) per node, (N, G) per GPU slot.

    A slot without a GPU has ``present`` False. Unknown readings are NaN.
    """

    known: BoolArray
    """Telemetry was ever received from the node."""
    age_s: FloatArray
    """Seconds since the node's last accepted report (by the extender's clock)."""
    interval_s: FloatArray
    driver_ok: BoolArray
    present: BoolArray
    health: npt.NDArray[np.int8]
    readings: dict[str, FloatArray]
    """(N, G) per kept field of ``telemetry.fields.GPU_FIELDS``, by its name."""
    unaccounted_used_mib: FloatArray
    """Memory in use by anything other than pods assigned to this GPU."""
    excluded_until: FloatArray
    """Thermal hysteresis: +inf while hot, the end of the cool-down after, -inf if never hot."""
    allocated_blocks: IntArray
    """Blocks given to pods at bind, seen in telemetry or not."""
    lent_blocks: IntArray
    """Idle blocks of the GPU's pods that best-effort pods may borrow (``memory.idleRelease``)."""
    borrowed_blocks: IntArray
    """Of ``allocated_blocks``, those best-effort pods hold in lent blocks (at most lent)."""
    whole_taken: BoolArray
    """A pod holds the GPU as a whole (nvidia.com/gpu or realtime)."""
    rack: IntArray
    """Rack id (an index into the context's rack table); -1 = no rack."""
    rdma: BoolArray
    host_cpu_free: FloatArray
    """Host CPU not requested by the node's pods (millicores); NaN = unknown."""
    host_memory_free: FloatArray
    """Host memory not requested by the node's pods (MiB); NaN = unknown."""

    @property
    def size(self) -> int:
        """Number of nodes."""
        return int(self.known.shape[0])

    def take(self, at: slice | npt.NDArray[np.int64]) -> NodeBatch:
        """The nodes at positions ``at`` (a slice or an array of positions), in that order."""
        parts = {
            f.name: getattr(self, f.name)[at]
            for f in dataclasses.fields(self)
            if f.name != "readings"
        }
        return NodeBatch(readings={k: v[at] for k, v in self.readings.items()}, **parts)

    def row(self, i: int) -> NodeBatch:
        """A batch of the one node at position ``i``."""
        return self.take(slice(i, i + 1))
