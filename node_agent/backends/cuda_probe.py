"""Application-level health: create and destroy a CUDA context through libcuda (ctypes).

``cuInit`` → ``cuDeviceGet`` → ``cuCtxCreate`` → ``cuCtxDestroy`` per GPU. A driver that lists
GPUs but cannot run work fails here. The library is looked up lazily and its absence is a
result, not an exception. Imports only the standard library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

_LIBS = ("libcuda.so.1", "libcuda.so")


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One probe of one GPU."""

    index: int
    ok: bool
    detail: str = ""


def _load(loader: Callable[[str], ctypes.CDLL]) -> ctypes.CDLL | None:
    for name in (*_LIBS, ctypes.util.find_library("cuda")):
        if not name:
            continue
        try:
            return loader(name)
        except OSError:
            continue
    return None


class CudaProbe:
    """Probes every GPU and keeps a rolling success ratio over the last ``window`` probes."""

    def __init__(
        self, window: int = 10, loader: Callable[[str], ctypes.CDLL] = ctypes.CDLL
    ) -> None:
        self._loader = loader
        self._lib: ctypes.CDLL | None = None
        self._tried = False
        self._history: deque[bool] = deque(maxlen=window)

    @property
    def available(self) -> bool:
        """Whether libcuda could be loaded."""
        if not self._tried:
            self._tried = True
            self._lib = _load(self._loader)
        return self._lib is not None

    def probe(self, index: int) -> ProbeResult:
        """One create/destroy cycle on GPU ``index``."""
        if not self.available or self._lib is None:
            return ProbeResult(index, False, "libcuda not found")
        lib = self._lib
        rc = lib.cuInit(0)
        if rc != 0:
            return self._record(ProbeResult(index, False, f"cuInit returned {rc}"))
        device = ctypes.c_int()
        rc = lib.cuDeviceGet(ctypes.byref(device), index)
        if rc != 0:
            return self._record(ProbeResult(index, False, f"cuDeviceGet returned {rc}"))
        ctx = ctypes.c_void_p()
        create = getattr(lib, "cuCtxCreate_v2", None) or lib.cuCtxCreate
        rc = create(ctypes.byref(ctx), 0, device)
        if rc != 0:
            return self._record(ProbeResult(index, False, f"cuCtxCreate returned {rc}"))
        destroy = getattr(lib, "cuCtxDestroy_v2", None) or lib.cuCtxDestroy
        rc = destroy(ctx)
        if rc != 0:
            return self._record(ProbeResult(index, False, f"cuCtxDestroy returned {rc}"))
        return self._record(ProbeResult(index, True))

    def _record(self, result: ProbeResult) -> ProbeResult:
        self._history.append(result.ok)
        return result

    def ratio(self) -> float | None:
        """Share of recent probes that succeeded; None before the first."""
        if not self._history:
            return None
        return sum(self._history) / len(self._history)
