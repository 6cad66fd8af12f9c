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


def _chromium(base: str, profile: Path, *args: str) -> str:
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
         f"--user-data-dir={profile}", "--virtual-time-budget=7000", *args, f"{base}/"],
        capture_output=True, text=True, timeout=120, check=True, cwd=profile,
    ).stdout  # fmt: skip


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_headless_chromium_shows_every_gpu_its_state_and_its_trend(tmp_path: Path) -> None:
    with extender_process(free_port()) as base:
        gpus = [
            gpu(0, model="NVIDIA L4", vendor="nvidia"),
            gpu(1, temperature_c=93.0),
            gpu(2, health="unhealthy", health_reasons=["xid:79"]),
        ]
        body = report("edge-7", gpus)
        assert httpx.post(f"{base}/v1/telemetry", json=body, timeout=5).status_code == 200
        dom = _chromium(base, tmp_path, "--dump-dom")
        assert "1 nodes, 3 GPUs" in dom and "maxTemp 85 °C" in dom, dom[-2000:]
        assert "edge-7" in dom and ">NVIDIA L4<" in dom  # the vendor not said twice
        assert 'class="num hot"' in dom  # GPU 1 at 93 °C is marked hot
        assert '<td class="unhealthy">faulty</td>' in dom  # the XID GPU's state is not "ok"
        assert "none: no node is in the fault loop" in dom
        # A trend per GPU (the page refreshed a few times in its virtual 7 s), maxTemp drawn.
        assert dom.count('<svg class="trend"') == 3, dom[-3000:]
        assert dom.count('class="temp"') == 3 and dom.count('class="power"') == 3
        assert dom.count('class="limit"') == 3
        # And as a person sees it: a screenshot that is not blank.
        _chromium(base, tmp_path, "--window-size=1400,500", "--screenshot")
        shot = tmp_path / "screenshot.png"
        assert shot.stat().st_size > 10_000, shot.stat().st_size
