"""The agent and extender command lines, run as real processes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args, timeout=60, env=None):
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_once_print_prints_one_valid_report_and_exits_0():
    proc = run(
        "-m",
        "node_agent",
        "--backend",
        "simulated",
        "--node-name",
        "n1",
        "--gpus",
        "3",
        "--once",
        "--print",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["schema"] == "edgegpu.io/telemetry/v1"
    assert report["node"] == "n1" and len(report["gpus"]) == 3


def test_node_name_comes_from_the_downward_api_variable():
    proc = run(
        "-m",
        "node_agent",
        "--backend",
        "simulated",
        "--once",
        "--print",
        env={"NODE_NAME": "from-env"},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["node"] == "from-env"


def test_nvml_without_a_driver_exits_2_with_one_clear_line():
    proc = run("-m", "node_agent", "--backend", "nvml", "--node-name", "n1", "--once")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "NVIDIA driver" in lines[0] and "Traceback" not in proc.stderr


def test_missing_node_name_and_bad_url_are_listed_and_exit_2():
    proc = run(
        "-m",
        "node_agent",
        "--backend",
        "simulated",
        "--extender-urls",
        "ftp://x",
        env={"NODE_NAME": ""},
    )
    assert proc.returncode == 2
    assert "node_name" in proc.stderr and "extender_urls" in proc.stderr


def test_sigterm_stops_the_loop_cleanly():
    proc = subprocess.Popen(
        [sys.executable, "-m", "node_agent", "--backend", "simulated", "--node-name", "n", "--interval-s", "0.2", "--metrics-port", "0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(2.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "stopping" in err and "Traceback" not in err


def test_the_extender_refuses_an_invalid_policy_with_every_error_and_exit_2(tmp_path):
    bad = tmp_path / "policy.yaml"
    bad.write_text(
        "apiVersion: kepler.io/v1\nkind: GPUSchedulingPolicy\nspec:\n  thermalThrottling:\n    maxTemp: -4\n    coolDownPeriod: soon\n"
    )
    proc = run("-m", "scheduler_extender", "--policy", str(bad), "--check-policy")
    assert proc.returncode == 2
    assert "maxTemp" in proc.stderr and "coolDownPeriod" in proc.stderr


def test_the_extender_accepts_the_seed_policy(tmp_path):
    seed = tmp_path / "seed.json"
    seed.write_text(
        '{"apiVersion": "kepler.io/v1", "kind": "GPUSchedulingPolicy", "metadata": {"name": "edge-gpu-policy"},'
        ' "spec": {"powerSaving": {"enabled": true, "threshold": 70},'
        ' "thermalThrottling": {"maxTemp": 85, "coolDownPeriod": "5m"}}}'
    )
    proc = run("-m", "scheduler_extender", "--policy", str(seed), "--check-policy")
    assert proc.returncode == 0, proc.stderr
    assert "edge-gpu-policy" in proc.stdout


def test_check_policy_says_when_idle_release_would_have_no_effect(tmp_path):
    doc = tmp_path / "policy.yaml"
    doc.write_text("spec:\n  memory:\n    idleRelease:\n      enabled: true\n")
    proc = run("-m", "scheduler_extender", "--policy", str(doc), "--check-policy")
    assert proc.returncode == 0, proc.stderr
    assert "note: memory.idleRelease has no effect" in proc.stdout
    doc.write_text(
        "spec:\n  memory:\n    idleRelease:\n      enabled: true\n"
        "  remediation:\n    enabled: true\n    dryRun: false\n"
    )
    proc = run("-m", "scheduler_extender", "--policy", str(doc), "--check-policy")
    assert proc.returncode == 0 and "note:" not in proc.stdout
