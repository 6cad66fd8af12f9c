"""The extender's fault-loop asks, followed on this node.

A self-test is run once per request id, in a thread, and its verdict kept for the next report;
a passing one clears the fatal XIDs seen before it. A reboot ask writes or withdraws the
reboot sentinel (``reboot``). Its bandwidths are judged against the node's last passing run
(``baseline``). Imports the backend protocol, ``baseline``, ``reboot``, the push answer's
``Ask`` and the exporter's metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from node_agent.backends.base import GpuBackend
from node_agent.protection.baseline import Baseline
from node_agent.protection.reboot import RebootSentinel
from node_agent.telemetry.exporter import AgentMetrics
from node_agent.uplink.answer import Ask

log = logging.getLogger("node_agent")


class Remediation:
    """The self-tests and the reboot the extenders ask of one node."""

    def __init__(
        self,
        backend: GpuBackend,
        metrics: AgentMetrics,
        *,
        clock: Callable[[], float],
        reboot_sentinel: Path | None,
        verified: Callable[[float], None],
        baseline: Baseline | None = None,
    ) -> None:
        """Follow the asks of the extenders for this node.

        ``verified``: told when a self-test started then passed (the GPUs were verified);
        ``baseline``: what its bandwidths are compared with (none: not compared).
        """
        self.backend = backend
        self.metrics = metrics
        self.clock = clock
        self.verified = verified
        self.reboot = RebootSentinel(reboot_sentinel)
        """The reboot sentinel, written and withdrawn as the extender's answers ask."""
        self.self_test: dict[str, str] | None = None
        """The verdict of the last self-test the extender asked for: id, verdict, detail."""
        self.testing: asyncio.Task[None] | None = None
        """The self-test running, if one is."""
        self._asked_test: str | None = None
        """The last self-test request id acted on."""
        self.baseline = baseline or Baseline(None, 0)
        self.gpus: list[str] = []
        """The UUIDs of the GPUs as last sampled, by index (whose figures the baseline keeps)."""

    def follow(self, asks: Mapping[str, Ask], boot: str, *, every_replica_answered: bool) -> None:
        """Start a requested self-test once per id; write or withdraw the reboot sentinel.

        ``boot`` is the boot this agent reports (what a reboot ask must name).
        """
        test = asks.get("self_test")
        if test and test.id != self._asked_test and self.testing is None:
            self._asked_test = test.id
            self.testing = asyncio.create_task(self._run_self_test(test.id, test.level or 1))
        refused = self.reboot.follow(asks.get("reboot"), boot, every_replica_answered)
        if refused is not None:
            self.metrics.answer_fields_ignored.labels("reboot", refused).inc()

    async def _run_self_test(self, request: str, level: int = 1) -> None:
        started = self.clock()
        try:
            log.warning("the extender asked for a level-%d self-test (%s): running it", level,
                        request)  # fmt: skip
            try:
                doc = await asyncio.to_thread(self.backend.self_test, level)
                doc = await asyncio.to_thread(self.baseline.judge, doc, list(self.gpus))
            except Exception as exc:
                doc = {"verdict": "fail", "reason": f"{type(exc).__name__}: {exc}", "checks": []}
            verdict = "pass" if doc.get("verdict") == "pass" else "fail"
            failed = [
                f"{c.get('name')}: {c.get('detail', '')}".strip(": ")
                for c in doc.get("checks") or []
                if c.get("outcome") == "fail"
            ]
            detail = "; ".join([str(doc.get("reason") or ""), *failed]).strip("; ")
            # A tool's JSON may carry lone surrogates: not UTF-8, the report would not encode.
            detail = detail.encode("utf-8", "replace").decode("utf-8")[:1024]
            if verdict == "pass":
                self.verified(started)
            self.self_test = {"id": request, "verdict": verdict, "detail": detail}
            log.warning("self-test %s: %s %s", request, verdict, detail)
        finally:
            self.testing = None
