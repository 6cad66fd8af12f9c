"""Go commands the tests need (promtool, helm), built once from the Go module proxy."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HELM = ("helm", "helm.sh/helm/v4/cmd/helm", "v4.3.2")
PROMTOOL = ("promtool", "github.com/prometheus/prometheus/cmd/promtool", "v0.316.0")
"""Prometheus 3.x's module version."""


def build_go_tool(name: str, package: str, version: str) -> str:
    """Path of the command, built by ``build-go-tool.sh`` on first use (skips without Go)."""
    if shutil.which("go") is None:
        pytest.skip(f"{name} is built from the Go module proxy, and Go is not installed")
    script = Path(__file__).with_name("build-go-tool.sh")
    return subprocess.run(
        ["bash", str(script), name, package, version], capture_output=True, text=True, check=True
    ).stdout.strip()
