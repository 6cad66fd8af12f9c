"""Local protection applying the power plan: the planner's state follows what took effect."""

from prometheus_client import CollectorRegistry

from node_agent.model import Capabilities, GpuReading, PowerLimits, Snapshot
from node_agent.protection.health import HealthArgs
from node_agent.protection.local import LocalProtection
from node_agent.protection.power import PowerArgs
from node_agent.telemetry.exporter import AgentMetrics

LIMITS = PowerLimits(min_w=60.0, max_w=140.0, default_w=100.0)


class FlakyBackend:
    """One GPU whose power limit can be set, except that the next ``failures`` sets fail."""

    name = "flaky"

    def __init__(self) -> None:
        self.limit_w = 100.0
        self.failures = 0
        self.readable = True

    def capabilities(self, index: int) -> Capabilities:
        return Capabilities(power_limit=True)

    def power_limits(self, index: int) -> PowerLimits | None:
        return LIMITS if self.readable else None

    def set_power_limit_w(self, index: int, watts: float) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("driver busy")
        self.limit_w = watts


def protection(backend: FlakyBackend) -> LocalProtection:
    return LocalProtection(
        backend,  # type: ignore[arg-type]
        AgentMetrics(CollectorRegistry(), "n"),
        health_args=HealthArgs(),
        power_args=PowerArgs(saving_enabled=False),
    )


def sample(p: LocalProtection, backend: FlakyBackend, temp: float, now: float):
    reading = GpuReading(
        index=0, uuid="g", temperature_c=temp, utilization_pct=90.0, power_limit_w=backend.limit_w
    )
    _, results = p.decide(Snapshot(taken_at=now, readings=[reading]))
    return [(r.action.kind, r.action.watts, r.outcome) for r in results]


def test_a_cap_that_fails_to_be_set_is_set_next_round_not_a_step_lower_a_settle_later():
    backend = FlakyBackend()
    p = protection(backend)
    backend.failures = 1
    assert sample(p, backend, 90.0, 0.0) == [("set_power_limit", 90.0, "failed")]
    assert p.power_states()[0].thermal_cap_w is None
    assert sample(p, backend, 90.0, 5.0) == [("set_power_limit", 90.0, "applied")]
    assert backend.limit_w == 90.0 and p.power_states()[0].thermal_cap_w == 90.0


def test_a_reset_of_the_power_limit_that_fails_keeps_the_cap_and_is_tried_again_next_round():
    backend = FlakyBackend()
    p = protection(backend)
    assert sample(p, backend, 90.0, 0.0) == [("set_power_limit", 90.0, "applied")]
    backend.failures = 1
    assert sample(p, backend, 70.0, 30.0) == [("reset_power_limit", None, "failed")]
    assert p.power_states()[0].thermal_cap_w == 90.0 and backend.limit_w == 90.0
    assert sample(p, backend, 70.0, 35.0) == [("reset_power_limit", None, "applied")]
    assert p.power_states()[0].thermal_cap_w is None and backend.limit_w == 100.0


def test_limits_unreadable_for_a_round_hold_the_cap_on_the_gpu():
    backend = FlakyBackend()
    p = protection(backend)
    sample(p, backend, 90.0, 0.0)
    backend.readable = False
    assert sample(p, backend, 70.0, 30.0) == [] and backend.limit_w == 90.0
    backend.readable = True
    assert sample(p, backend, 70.0, 35.0) == [("reset_power_limit", None, "applied")]
