"""README's curl block, run as written against ``make run``'s cluster once its faults are in:
the refusals README describes are what the extender answers."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.controlplane import free_port

ROOT = Path(__file__).resolve().parents[2]


def _free_run(count: int) -> int:
    """The first of ``count`` consecutive ports free on 127.0.0.1 now (the agents' metrics)."""
    for _ in range(50):
        base = free_port()
        if base + count > 65535:
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    raise RuntimeError(f"no {count} consecutive free ports")


def _curl_block(port: int, metrics_port: int) -> str:
    text = (ROOT / "README.md").read_text()
    block = text.split("### Try it with curl (against `make run`)", 1)[1]
    block = block.split("```sh\n", 1)[1].split("```", 1)[0]
    return block.replace("127.0.0.1:8888", f"127.0.0.1:{port}").replace(
        "127.0.0.1:9400", f"127.0.0.1:{metrics_port}"
    )


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl here")
def test_readmes_curls_show_the_refusals_it_describes(tmp_path: Path) -> None:
    port, metrics = free_port(), _free_run(4)
    log = (tmp_path / "demo.log").open("wb")
    demo = subprocess.Popen(
        [sys.executable, "-m", "tools.devcluster", "--port", str(port),
         "--metrics-base-port", str(metrics), "--duration-s", "300"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        # README: "after a minute or so" edge-2 is hot and edge-3's GPU 0 has its XID.
        deadline = time.monotonic() + 240
        while True:
            assert demo.poll() is None, (tmp_path / "demo.log").read_text()[-3000:]
            try:
                nodes = {n["node"]: n for n in httpx.get(
                    f"http://127.0.0.1:{port}/debug/nodes", timeout=5).json()["nodes"]}  # fmt: skip
                cabinet = nodes.get("edge-2", {}).get("gpus", [])
                hot = bool(cabinet) and all(g["hot"] or g["cool_down_until"] for g in cabinet)
                xid = nodes.get("edge-3", {}).get("gpus", [{}])[0].get("health") == "unhealthy"
                if hot and xid:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "edge-2 never hot or edge-3 never unhealthy"
            time.sleep(2)
        out = subprocess.run(["bash", "-c", _curl_block(port, metrics)], capture_output=True,
                             text=True, timeout=60, cwd=ROOT).stdout  # fmt: skip
    finally:
        demo.terminate()
        demo.wait(30)
        log.close()
    refusals = re.search(r'\{"Nodes":null,"NodeNames":\[\],"FailedNodes":(\{.*?\}),'
                         r'"FailedAndUnresolvableNodes":(\{.*?\})', out)  # fmt: skip
    assert refusals, out[:3000]
    hot_or_cooling = ('"edge-2":"edgegpu: gpu too hot"', '"edge-2":"edgegpu: gpu cooling down"')
    assert any(r in refusals.group(1) for r in hot_or_cooling), refusals.group(0)
    assert '"edge-3":"edgegpu: the gpu with room is unhealthy"' in refusals.group(2)
    assert '"edge-9":"edgegpu: no gpu telemetry from node"' in refusals.group(2)
    assert '"unhealthy: xid:79"' in out  # explain: edge-3's GPU 0, by its reason
    assert '"too hot (' in out  # explain: edge-2's GPUs
    assert "node_gpu_temperature_celsius" in out and "edgegpu_extender_decisions_total" in out
