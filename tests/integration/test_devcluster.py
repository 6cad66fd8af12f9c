"""``make run``'s launcher: SIGTERM stops the extender and the agents it started."""

from __future__ import annotations

import signal
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
