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
