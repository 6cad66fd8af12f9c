"""The interleaved A/B benchmark: every side measured, samples pooled, bad arguments refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.ab import compare
from benchmarks.latency import ROOT, Server, load


def _ab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.ab", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_compare_measures_both_sides_idle_and_under_pushes() -> None:
    servers: dict[str, Server] = {}
    try:
        for name in ("A", "B"):
            servers[name] = Server("ours", root=ROOT)
            load(servers[name], 200, gpus=2)
        result = compare(servers, rounds=2, rate=400.0, nodes=200, cycles=6, ramp_s=0.3)
    finally:
        for s in servers.values():
            s.stop()
    assert set(result) == {"A", "B"}
    for side in result.values():
        assert side["requests_per_side"] == 2 * 6 * 2  # rounds x pods x (filter + prioritize)
        assert 0 < side["idle_p50_ms"] <= side["idle_p99_ms"]
        assert 0 < side["busy_p50_ms"] <= side["busy_p99_ms"]
        assert side["ratio_p99"] == round(side["busy_p99_ms"] / side["idle_p99_ms"], 2)
        assert side["busy_p99_ms"] <= side["busy_p999_ms"] <= side["busy_max_ms"]
        assert side["pushes_per_s"] > 0


def test_a_directory_without_the_extender_is_refused(tmp_path: Path) -> None:
    done = _ab(str(ROOT), str(tmp_path), "--rounds", "1")
    assert done.returncode == 2
    assert "is not a source tree of this project" in done.stderr


def test_one_tree_alone_is_refused() -> None:
    done = _ab(str(ROOT), "--rounds", "1")
    assert done.returncode == 2
    assert "give two trees, or one tree and --floor" in done.stderr


def test_two_sides_of_one_name_are_refused() -> None:
    done = _ab(f"x={ROOT}", f"x={ROOT}", "--rounds", "1")
    assert done.returncode == 2
    assert "each side needs a name of its own: x, x" in done.stderr


def test_a_named_tree_against_the_floor(tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    done = _ab(
        f"mine={ROOT}", "--floor", "--rounds", "1", "--nodes", "200", "--cycles", "4",
        "--rate", "400", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["mine"]["tree"] == str(ROOT)
    assert "tree" not in result["floor"]
    for side in ("mine", "floor"):
        assert result[side]["requests_per_side"] == 1 * 4 * 2
        assert result[side]["pushes_per_s"] > 0
    assert result["busy_p99_over_first"]["mine"] == 1.0
    assert result["busy_p99_over_first"]["floor"] == round(
        result["floor"]["busy_p99_ms"] / result["mine"]["busy_p99_ms"], 2
    )
