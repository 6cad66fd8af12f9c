"""Remediation settings (cordon → evict → self-test → reboot decision → uncordon).

Pure; only the arguments live here so far, validated with the rest of the policy document.
"""

from __future__ import annotations

from pydantic import Field

from scheduler_extender.policy.base import ArgsModel


class RemediationArgs(ArgsModel):
    """``spec.remediation`` (ours)."""

    enabled: bool = Field(False, description="Act on faults at all (off until asked for).")
    dry_run: bool = Field(
        True, alias="dryRun", description="Log and count the actions without taking them."
    )
    max_unavailable_pct: float = Field(
        10.0,
        alias="maxUnavailablePercent",
        ge=0,
        le=100,
        description="% of GPU nodes that may be cordoned by remediation at once.",
    )
