"""Backend registry: one name → one lazily imported backend module.

Adding a backend is one module implementing ``base.GpuBackend`` and one line here; nothing
else imports a vendor library.
"""

from __future__ import annotations

import importlib
from typing import Any, Final

from node_agent.backends.base import GpuBackend
from node_agent.errors import BackendUnavailable

REGISTRY: Final = {
    "nvml": ("node_agent.backends.nvml", "NvmlBackend"),
    "simulated": ("node_agent.backends.simulated", "SimulatedBackend"),
    "jetson": ("node_agent.backends.jetson", "JetsonBackend"),
    "amd": ("node_agent.backends.amd", "AmdBackend"),
    "intel": ("node_agent.backends.intel", "IntelBackend"),
}


def load_backend(name: str, **options: Any) -> GpuBackend:
    """Construct the named backend (not yet opened)."""
    try:
        module_name, class_name = REGISTRY[name]
    except KeyError:
        raise BackendUnavailable(
            f"unknown backend {name!r}; available: {', '.join(sorted(REGISTRY))}"
        ) from None
    module = importlib.import_module(module_name)
    backend: GpuBackend = getattr(module, class_name)(**options)
    return backend
