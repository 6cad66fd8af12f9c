"""The interleaved A/B benchmark: both sides measured, samples pooled, bad trees refused."""

from __future__ import annotations

import subprocess
import sys

from benchmarks.ab import compare
from benchmarks.latency import ROOT, Server, load


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


def test_a_directory_without_the_extender_is_refused(tmp_path: object) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.ab", str(ROOT), str(tmp_path), "--rounds", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "is not a source tree of this project" in done.stderr
