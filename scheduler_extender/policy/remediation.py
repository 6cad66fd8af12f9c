"""Remediation settings: the GPU fault loop and thermal migration, run by the elected leader.

Pure; only the arguments live here, validated with the rest of the policy document.
"""

from __future__ import annotations

import math

from pydantic import Field

from scheduler_extender.policy.base import ArgsModel, Duration, Section


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
        description="% of GPU nodes (at least one while above 0) that the fault loop may work on "
        "at once (draining to verifying); nodes handed to a human hold no place.",
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
    drain_timeout_s: Duration = Field(
        1800.0,
        alias="drainTimeout",
        description="Wait this long for a drain to finish (pods a PodDisruptionBudget keeps) "
        "before handing the node to a human (30m); also how long a lender waits on a borrower "
        "its budget keeps before a Warning Event says so.",
    )
    evictions_per_minute: int = Field(
        60,
        alias="evictionsPerMinute",
        ge=1,
        le=5000,
        description="Evictions across the cluster, counted in the circuit breaker's ConfigMap "
        "so that a new leader goes on counting.",
    )
    paused: bool = Field(
        False,
        description="Start nothing new: no cordon, eviction, self-test or reboot ask; nodes "
        "already cordoned stay as they are until the pause ends (an operator's switch).",
    )
    unreachable_after_s: Duration = Field(
        300.0,
        alias="unreachableAfter",
        ge=0,
        description="How long a node must be NotReady with its agent silent, as this replica "
        "saw it, before it counts as a node fault (5m: Kubernetes' own default toleration of "
        "an unreachable node). Such a node is cordoned, never drained: Kubernetes evicts its "
        "pods by their own tolerations. An edge link that drops is not a GPU fault.",
    )
    repeat_limit: int = Field(
        3,
        alias="repeatLimit",
        ge=1,
        description="The fault on the same GPU (or node) for this many times within "
        "repeatWindow goes to needs-human instead of another drain (1: every fault does).",
    )
    repeat_window_s: Duration = Field(
        86400.0,
        alias="repeatWindow",
        description="The window in which repeated faults on one GPU are counted (24h).",
    )
    breaker_percent: float = Field(
        30.0,
        alias="breakerPercent",
        ge=0,
        le=100,
        description="% of GPU nodes (at least one) that may be cordoned within breakerWindow; "
        "one more trips the circuit breaker: no new cordon until an operator resets it by "
        "deleting the ConfigMap edgegpu-remediation-breaker (0: no breaker).",
    )
    breaker_evictions: int = Field(
        100,
        alias="breakerEvictions",
        ge=0,
        le=5000,
        description="Evictions across the cluster, by every controller, within breakerWindow "
        "before the circuit breaker trips (one more is not made; 0: no eviction limit).",
    )
    breaker_window_s: Duration = Field(
        3600.0,
        alias="breakerWindow",
        description="The sliding window of the circuit breaker (1h).",
    )

    def breaker_allows(self, gpu_nodes: int) -> int:
        """Nodes that may be cordoned within ``breakerWindow`` before the breaker trips."""
        return max(1, math.floor(gpu_nodes * self.breaker_percent / 100.0))

    def cordon_cap(self, gpu_nodes: int) -> int:
        """Nodes remediation may hold cordoned at once, out of ``gpu_nodes``."""
        if self.max_unavailable_pct <= 0:
            return 0
        return max(1, math.floor(gpu_nodes * self.max_unavailable_pct / 100.0))


SECTION = Section(
    "remediation",
    RemediationArgs,
    "The fault loop: cordon, evict, self-test, reboot decision, uncordon.",
)
