"""The served process refuses an oversized request head and keeps serving."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx

from tests.e2e.controlplane import ROOT, free_port


def test_a_megabyte_of_headers_is_refused_and_the_server_serves_on():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler_extender", "--port", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
            sent = 0
            try:
                while sent < 1 << 20:
                    s.sendall(b"a" * 8192)
                    sent += 8192
            except OSError:
                pass  # closed on us mid-way: refused
            answer = s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 400"), answer[:100]
        assert sent < 1 << 20 or b"over the size limit" in answer
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        ok = httpx.get(f"http://127.0.0.1:{port}/healthz", headers={"x-small": "a" * 4000})
        assert ok.status_code == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
