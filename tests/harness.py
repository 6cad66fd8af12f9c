"""A scheduler-side harness: calls the extender the way kube-scheduler's HTTPExtender does.

Follows pkg/scheduler/extender.go and schedule_one.go (research/extender-protocol.md §2): URL =
urlPrefix + "/" + verb, POST JSON with Go field names and explicit nulls, exact 200 required,
responses decoded case-insensitively, names not sent are an error, scores × weight × 10, a single
feasible node skips prioritize, and the call has a timeout (5 s by default).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson


class ExtenderCallError(Exception):
    """What the scheduler would treat as a failed extender call."""


def _fold(doc: dict[str, Any]) -> dict[str, Any]:
    return {k.lower(): v for k, v in doc.items()}


@dataclass
class FilterOutcome:
    feasible: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


class HTTPExtenderHarness:
    def __init__(
        self,
        url_prefix: str,
        *,
        weight: int = 1,
        node_cache_capable: bool = True,
        http_timeout_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url_prefix = url_prefix.rstrip("/")
        self.weight = weight
        self.node_cache_capable = node_cache_capable
        self.client = httpx.Client(timeout=http_timeout_s, transport=transport)

    def close(self) -> None:
        self.client.close()

    def _send(self, verb: str, args: dict[str, Any]) -> Any:
        resp = self.client.post(
            f"{self.url_prefix}/{verb}",
            content=orjson.dumps(args),
            headers={"Content-Type": "application/json"},
        )
        if resp.status_code != 200:
            raise ExtenderCallError(
                f"failed {verb} with extender at URL {self.url_prefix}, code {resp.status_code}"
            )
        return orjson.loads(resp.content)

    def _args(self, pod: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
        if self.node_cache_capable:
            return {"Pod": pod, "Nodes": None, "NodeNames": [n["metadata"]["name"] for n in nodes]}
        return {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}

    def filter(self, pod: dict[str, Any], nodes: list[dict[str, Any]]) -> FilterOutcome:
        result = _fold(self._send("filter", self._args(pod, nodes)))
        if result.get("error"):
            raise ExtenderCallError(result["error"])
        sent = {n["metadata"]["name"] for n in nodes}
        if self.node_cache_capable and result.get("nodenames") is not None:
            feasible = list(result["nodenames"])
            for name in feasible:
                if name not in sent:
                    raise ExtenderCallError(
                        f"extender claims a filtered node {name!r} which is not found in the input node list"
                    )
        elif result.get("nodes") is not None:
            feasible = [n["metadata"]["name"] for n in (result["nodes"].get("items") or [])]
        else:
            feasible = []
        failed = dict(result.get("failednodes") or {})
        unresolvable = dict(result.get("failedandunresolvablenodes") or {})
        for name in failed:
            if not isinstance(failed[name], str):
                raise ExtenderCallError("FailedNodes values must be strings")
        return FilterOutcome(feasible, failed, unresolvable)

    def prioritize(self, pod: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, int]:
        """Scheduler-scale contributions (Score × weight × 10); errors are ignored as upstream does."""
        try:
            result = self._send("prioritize", self._args(pod, nodes))
        except (ExtenderCallError, httpx.HTTPError, orjson.JSONDecodeError):
            return {}
        if not isinstance(result, list):
            return {}
        names = {n["metadata"]["name"] for n in nodes}
        out: dict[str, int] = {}
        for entry in result:
            entry = _fold(entry)
            if not isinstance(entry.get("score"), int) or isinstance(entry.get("score"), bool):
                return {}  # a decode error: the whole answer is dropped
            if entry["host"] in names:
                out[entry["host"]] = out.get(entry["host"], 0) + entry["score"] * self.weight * 10
        return out

    def schedule(
        self, pod: dict[str, Any], nodes: list[dict[str, Any]]
    ) -> tuple[str | None, FilterOutcome, dict[str, int]]:
        """One scheduling cycle as far as the extender is concerned."""
        outcome = self.filter(pod, nodes)
        feasible = [n for n in nodes if n["metadata"]["name"] in set(outcome.feasible)]
        if not feasible:
            return None, outcome, {}
        if len(feasible) == 1:
            return feasible[0]["metadata"]["name"], outcome, {}
        scores = self.prioritize(pod, feasible)
        best = max(feasible, key=lambda n: scores.get(n["metadata"]["name"], 0))
        return best["metadata"]["name"], outcome, scores

    def bind(self, pod: dict[str, Any], node: str) -> str:
        meta = pod["metadata"]
        result = _fold(
            self._send(
                "bind",
                {
                    "PodName": meta["name"],
                    "PodNamespace": meta.get("namespace", ""),
                    "PodUID": meta.get("uid", ""),
                    "Node": node,
                },
            )
        )
        return str(result.get("error") or "")


@contextmanager
def extender_process(port: int) -> Iterator[str]:
    """``python -m scheduler_extender`` on 127.0.0.1:``port`` (no cluster), once it answers."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler_extender", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"],
        cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/healthz", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)
