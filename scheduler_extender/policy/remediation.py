"""Remediation settings: the GPU fault loop and thermal migration, run by the elected leader.

Pure; only the arguments live here, validated with the rest of the policy document.
"""

from __future__ import annotations

import math

from pydantic import Field

from scheduler_extender.policy.base import ArgsModel, Duration


class RemediationArgs(ArgsModel):
    """``spec.remediation`` (ours)."""

    enabled: bool = Field(False, description="Act on faults at all (off until asked for).")
    dry_run: bool = Field(
        True,
        alias="dryRun",
        description="Plan, log, count and record Events, but change no Node or Pod.",
    )
    max_unavailable_pct: float = Field(
        10.0,
        alias="maxUnavailablePercent",
        ge=0,
        le=100,
        description="% of GPU nodes that remediation may hold cordoned at once (at least one "
        "while above 0).",
    )
    confirm_after_s: Duration = Field(
        5.0,
        alias="confirmAfter",
        description="How long a fault must last before its node is cordoned (5s).",
    )
    self_test_timeout_s: Duration = Field(
        600.0,
        alias="selfTestTimeout",
        description="Wait this long for a self-test verdict before handing the node to a "
        "human (10m).",
    )
    reboot_timeout_s: Duration = Field(
        1800.0,
        alias="rebootTimeout",
        description="Wait this long for the node to come back after a reboot request (30m).",
    )
    evictions_per_minute: int = Field(
        60, alias="evictionsPerMinute", ge=1, description="Evictions across the cluster."
    )

    def cordon_cap(self, gpu_nodes: int) -> int:
        """Nodes remediation may hold cordoned at once, out of ``gpu_nodes``."""
        if self.max_unavailable_pct <= 0:
            return 0
        return max(1, math.floor(gpu_nodes * self.max_unavailable_pct / 100.0))
