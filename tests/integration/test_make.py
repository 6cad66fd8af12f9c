"""The Makefile as a new user meets it: ``make help`` reads as a table."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_help_lists_every_target_with_its_description_in_one_column() -> None:
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.splitlines()  # fmt: skip
    heads = [line for line in out if line.startswith("  make ")]
    targets = [line.split()[1] for line in heads]
    assert {"run", "test", "e2e", "bench-openb-quick"} <= set(targets)
    columns = {len(line) - len(line.split(None, 2)[2]) for line in heads}
    # Long descriptions go on in the same column, and no line is wider than 88.
    columns |= {len(line) - len(line.lstrip()) for line in out if line not in heads}
    assert len(columns) == 1, out
    assert max(len(line) for line in out) <= 88, out


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_images_without_a_builder_says_which_tool_is_missing_and_fails() -> None:
    done = subprocess.run(["make", "-s", "images", "DOCKER=edgegpu-no-such-builder"], cwd=ROOT,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode != 0
    assert "'edgegpu-no-such-builder' is not installed" in done.stderr
    assert not (ROOT / "dist" / "images" / "extender-0.1.0.tar").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_images_builds_both_dockerfiles_and_saves_each_tag_it_built() -> None:
    lines = subprocess.run(["make", "-n", "images", "REGISTRY=reg.example/edgegpu"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.splitlines()  # fmt: skip
    builds = {ln.split(" -t ")[1].split()[0]: ln.split(" -f ")[1].split()[0]
              for ln in lines if ln.startswith("docker build")}  # fmt: skip
    saves = [ln.split()[-1] for ln in lines if ln.startswith("docker save")]
    version = next(ln for ln in (ROOT / "pyproject.toml").read_text().splitlines()
                   if ln.startswith("version")).split('"')[1]  # fmt: skip
    assert builds == {
        f"reg.example/edgegpu/extender:{version}": "Dockerfile.extender",
        f"reg.example/edgegpu/node-agent:{version}": "Dockerfile.agent",
    }
    assert sorted(saves) == sorted(builds)
