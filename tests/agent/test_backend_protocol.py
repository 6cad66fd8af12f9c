"""Every registered backend implements every method of ``GpuBackend``."""

import importlib
import inspect

import pytest

from node_agent.backends import REGISTRY
from node_agent.backends.base import GpuBackend

METHODS = sorted(
    name
    for name, _ in inspect.getmembers(GpuBackend, inspect.isfunction)
    if not name.startswith("_")
)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_the_backend_has_every_method_of_the_protocol(name: str) -> None:
    module, cls_name = REGISTRY[name]
    cls = getattr(importlib.import_module(module), cls_name)
    missing = [m for m in METHODS if not callable(getattr(cls, m, None))]
    assert missing == [], f"{cls_name} lacks {missing}"
    assert "self_test" in METHODS
