"""What every route reads: settings, state, metrics, binder, body budgets. On ``app.state.ctx``."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
from fastapi import Request

from scheduler_extender.api.bodies import BodyBudget
from scheduler_extender.config import ExtenderSettings
from scheduler_extender.k8s.auth import AgentAuth
from scheduler_extender.k8s.binder import Binder
from scheduler_extender.k8s.leader import LeaseElector
from scheduler_extender.k8s.sync import ClusterSync
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.remediation.runner import Remediator
from scheduler_extender.state.cluster import ClusterState

log = logging.getLogger("scheduler_extender")


@dataclass
class AppContext:
    """The app's dependencies, built once by ``create_app``."""

    settings: ExtenderSettings
    state: ClusterState
    metrics: ExtenderMetrics
    binder: Binder | None = None
    auth: AgentAuth | None = None
    """None: accept pushes from loopback only (embedded mode)."""
    policy_source: str = "defaults"
    sync: ClusterSync | None = None
    elector: LeaseElector | None = None
    remediator: Remediator | None = None
    warned: set[str] = field(default_factory=set)
    request_bodies: BodyBudget = field(init=False)
    """Scheduler request bodies (and /debug/explain's) held at once."""
    push_bodies: BodyBudget = field(init=False)
    """Telemetry push bodies held at once."""

    rng: np.random.Generator = field(init=False)
    """Breaks ties between equally good nodes."""

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.settings.tie_seed)
        self.request_bodies = BodyBudget(self.settings.max_inflight_request_bytes)
        self.push_bodies = BodyBudget(self.settings.max_inflight_telemetry_bytes)

    @property
    def ready(self) -> bool:
        """Policy loaded; with a cluster, every cache listed once and the cluster's policy in force.

        A replica that starts while that policy is refused is not ready: it would decide with
        other rules than the replicas already running.
        """
        return self.sync is None or (self.sync.synced and not self.sync.policy_refused)

    @property
    def leader(self) -> bool | None:
        """Whether this replica holds the Lease (None: no leader election)."""
        return None if self.elector is None else self.elector.is_leader

    def warn_once(self, key: str, message: str) -> None:
        """Log a warning the first time only."""
        if key not in self.warned:
            self.warned.add(key)
            log.warning(message)


def get_ctx(request: Request) -> AppContext:
    """The context of the app serving this request."""
    ctx: AppContext = request.app.state.ctx
    return ctx
