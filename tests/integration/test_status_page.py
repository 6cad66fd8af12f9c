"""The status page in a real browser: headless Chromium renders what the extender knows.

Runs where Debian's ``chromium`` is installed (``apt-get install chromium``); skipped elsewhere.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.builders import gpu, report
from tests.e2e.controlplane import free_port
from tests.harness import extender_process

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_headless_chromium_shows_every_gpu_and_the_hot_one(tmp_path: Path) -> None:
    with extender_process(free_port()) as base:
        body = report("edge-7", [gpu(0, model="Tesla T4"), gpu(1, temperature_c=93.0)])
        assert httpx.post(f"{base}/v1/telemetry", json=body, timeout=5).status_code == 200
        dom = subprocess.run(
            [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
             f"--user-data-dir={tmp_path}", "--virtual-time-budget=5000", "--dump-dom", f"{base}/"],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
        assert "1 nodes, 2 GPUs" in dom, dom[-2000:]
        assert "edge-7" in dom and "Tesla T4" in dom
        assert 'class="num hot"' in dom  # GPU 1 at 93 °C is marked hot
