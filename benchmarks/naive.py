"""The naive baseline: how a straightforward Python extender is written — pydantic models for
the body and every node, telemetry as pydantic objects, a Python loop over nodes and GPUs with
the same rules (thermal with cool-down, health, one-GPU memory blocks, staleness, scores).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from scheduler_extender.telemetry.schema import TelemetryReport


class Meta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    labels: dict[str, str] = Field(default_factory=dict)


class Node(BaseModel):
    model_config = ConfigDict(extra="allow")
    metadata: Meta


class NodeList(BaseModel):
    model_config = ConfigDict(extra="allow")
    items: list[Node] = Field(default_factory=list)


class Args(BaseModel):
    model_config = ConfigDict(extra="allow")
    Pod: dict[str, Any]
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


app = FastAPI()
STORE: dict[str, tuple[TelemetryReport, float]] = {}
HOT: dict[str, float] = {}
MAX_TEMP, COOL_DOWN, BLOCK = 85.0, 300.0, 4096


def _blocks(pod: dict[str, Any]) -> int:
    total = 0
    for c in pod.get("spec", {}).get("containers") or []:
        total += int(
            (c.get("resources", {}).get("limits") or {}).get("edgegpu.io/gpu-mem-block", 0)
        )
    return total


def _judge(name: str, blocks: int, now: float) -> tuple[bool, float]:
    entry = STORE.get(name)
    if entry is None:
        return False, 0.0
    rep, at = entry
    if now - at > 3 * rep.interval_s:
        return False, 0.0
    best = -1.0
    for g in rep.gpus:
        if g.health == "unhealthy" or g.temperature_c is None:
            continue
        key = f"{name}/{g.index}"
        if g.temperature_c >= MAX_TEMP or now - HOT.get(key, -1e18) < COOL_DOWN:
            continue
        free = int((g.memory_total_mib or 0) // BLOCK) - int(-(-(g.memory_used_mib or 0) // BLOCK))
        if free < blocks:
            continue
        head = (MAX_TEMP - g.temperature_c) / 55
        power = 1 - (g.power_w or 0) / (g.power_limit_w or 1)
        best = max(best, (head + power) / 2)
    return best >= 0, best


@app.post("/v1/telemetry")
def push(report: TelemetryReport) -> dict[str, bool]:
    now = time.monotonic()
    STORE[report.node] = (report, now)
    for g in report.gpus:
        if g.temperature_c is not None and g.temperature_c >= MAX_TEMP:
            HOT[f"{report.node}/{g.index}"] = now
    return {"accepted": True}


def _names(args: Args) -> list[str]:
    if args.NodeNames is not None:
        return args.NodeNames
    return [n.metadata.name for n in (args.Nodes.items if args.Nodes else [])]


@app.post("/filter")
def filter_nodes(args: Args) -> dict[str, Any]:
    now, blocks = time.monotonic(), _blocks(args.Pod)
    passed, failed = [], {}
    for name in _names(args):
        ok, _ = _judge(name, blocks, now)
        if ok:
            passed.append(name)
        else:
            failed[name] = "no fit"
    nodes = None
    if args.Nodes is not None:
        keep = set(passed)
        nodes = {"items": [n.model_dump() for n in args.Nodes.items if n.metadata.name in keep]}
    return {"Nodes": nodes, "NodeNames": passed if args.NodeNames is not None else None,
            "FailedNodes": failed, "FailedAndUnresolvableNodes": {}, "Error": ""}  # fmt: skip


@app.post("/prioritize")
def prioritize(args: Args) -> list[dict[str, Any]]:
    now, blocks = time.monotonic(), _blocks(args.Pod)
    return [
        {"Host": n, "Score": round(10 * max(_judge(n, blocks, now)[1], 0))} for n in _names(args)
    ]


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


def main() -> None:
    from benchmarks.floor import serve

    serve(app)


if __name__ == "__main__":
    main()
