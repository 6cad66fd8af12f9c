"""The node table's columns: their names, their kinds, and the blank value of each.

Per node: floats (NaN = unknown), flags, the rack id and the row's version. Per GPU slot:
the float readings (one block in memory), flags, the health code and block counts.
Imports numpy and ``telemetry.fields``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_extender.telemetry.fields import KEPT

NODE_FLOAT = (
    "received_at",
    "interval_s",
    "free_blocks",
    "idle_gpus",
    "host_cpu_free",
    "host_memory_free",
)
NODE_BOOL = ("known", "driver_ok", "rdma")
GPU_FLOAT = (*KEPT, "unaccounted_used_mib", "below_since")
"""The per-GPU float columns (one block in memory: a push writes them in one go)."""
GPU_REPORT_COLUMNS = ("index", *GPU_FLOAT, "hot", "health")
"""What ``NodeTable.write_node`` takes per reported GPU, in this order, as one float array."""
GPU_BOOL = ("present", "hot", "whole_taken")
_GPU_BLOCKS = ("allocated_blocks", "lent_blocks", "borrowed_blocks")

ALL_COLUMNS = (
    *NODE_FLOAT,
    *NODE_BOOL,
    "rack",
    "version",
    *GPU_FLOAT,
    *GPU_BOOL,
    "health",
    *_GPU_BLOCKS,
)
"""Every column of the table."""

AS_GATHERED = (
    "known",
    "interval_s",
    "driver_ok",
    "present",
    "health",
    "allocated_blocks",
    "lent_blocks",
    "borrowed_blocks",
    "whole_taken",
    "rack",
    "rdma",
    "host_cpu_free",
    "host_memory_free",
)
"""Columns a ``NodeBatch`` takes as they are, besides the per-GPU readings."""


def blank(name: str, rows: int, gpus: int) -> npt.NDArray[Any]:
    """A column of ``rows`` blank rows (``gpus`` slots each, for a per-GPU column)."""
    if name in NODE_FLOAT:
        return np.full(rows, np.nan)
    if name in NODE_BOOL:
        return np.zeros(rows, dtype=np.bool_)
    if name == "rack":
        return np.full(rows, -1, dtype=np.int64)
    if name == "version":
        return np.zeros(rows, dtype=np.int64)
    if name in GPU_FLOAT:
        return np.full((rows, gpus), np.nan)
    if name in GPU_BOOL:
        return np.zeros((rows, gpus), dtype=np.bool_)
    if name == "health":
        return np.zeros((rows, gpus), dtype=np.int8)
    if name in _GPU_BLOCKS:
        return np.zeros((rows, gpus), dtype=np.int64)
    raise KeyError(name)
