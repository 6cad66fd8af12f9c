"""``make run``'s launcher: SIGTERM stops the extender and the agents it started."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.e2e.controlplane import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_sigterm_stops_everything_the_launcher_started():
    port, metrics = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.devcluster", "--port", str(port), "--nodes", "1",
         "--metrics-base-port", str(metrics)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # until it says what to try
            if b"Ctrl-C stops everything" in line:
                break
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 2  # the extender and one agent
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{c}").exists() for c in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(Path(f"/proc/{c}/status").exists() for c in children)
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            raise AssertionError("the extender still answers")
        except httpx.HTTPError:
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_taken_port_fails_at_once_and_names_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "tools.devcluster", "--port", str(port), "--nodes", "1",
             "--metrics-base-port", str(free_port())],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 2
    assert f"127.0.0.1:{port}" in out.stderr and "PORT=" in out.stderr
    assert "Try:" not in out.stdout  # no success banner


def test_an_agent_that_dies_ends_the_run_with_its_name_and_last_lines():
    port, metrics = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.devcluster", "--port", str(port), "--nodes", "1",
         "--metrics-base-port", str(metrics)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "Ctrl-C stops everything" in line:
                break
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        agent = max(int(c) for c in children)  # started after the extender
        os.kill(agent, signal.SIGKILL)
        assert proc.wait(timeout=20) == 1
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert "agent edge-0" in err and "exited with status -9" in err
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
