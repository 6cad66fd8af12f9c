"""The interleaved A/B benchmark: every side measured, samples pooled, bad arguments refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.ab import compare, paired, sign_test
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
        # from the unrounded p99s (rounded to 0.001 ms): within what that rounding allows
        idle, busy = side["idle_p99_ms"], side["busy_p99_ms"]
        lowest = (busy - 0.0005) / (idle + 0.0005) - 0.005
        highest = (busy + 0.0005) / (idle - 0.0005) + 0.005
        assert lowest <= side["ratio_p99"] <= highest
        assert side["busy_p99_ms"] <= side["busy_p999_ms"] <= side["busy_max_ms"]
        assert side["pushes_per_s"] > 0
        assert len(side["busy_p99_by_round_ms"]) == 2
        assert max(side["busy_p99_by_round_ms"]) <= side["busy_max_ms"]


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
    assert result["busy_p99_over_first"]["floor"] == pytest.approx(
        result["floor"]["busy_p99_ms"] / result["mine"]["busy_p99_ms"], abs=0.006
    )
    assert list(result["paired_with_first"]) == ["floor"]
    assert result["paired_with_first"]["floor"]["rounds"] == 1
    assert "floor against mine, round by round" in done.stdout


def test_the_sign_test_gives_the_binomial_tail_on_both_sides() -> None:
    assert sign_test(14, 6) == sign_test(6, 14) == pytest.approx(0.11532, abs=1e-5)
    assert sign_test(20, 0) == pytest.approx(2 / 2**20)
    assert sign_test(10, 10) == 1.0  # an even split is as likely as it gets
    assert sign_test(0, 0) == 1.0


def test_rounds_are_paired_and_ties_left_out_of_the_sign_test() -> None:
    first = [1.0, 2.0, 2.0, 4.0, 1.0]
    other = [0.5, 2.0, 1.0, 5.0, 0.9]  # lower, tie, lower, higher, lower
    result = paired(first, other)
    assert result == {
        "rounds": 5, "rounds_lower": 3, "rounds_higher": 1,
        "sign_test_p": 0.625, "median_round_ratio": 0.9,
    }  # fmt: skip
