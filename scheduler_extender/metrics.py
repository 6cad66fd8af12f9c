"""Prometheus metrics of the extender, built against an injected registry.

Imports prometheus-client, numpy and ``state`` (the telemetry-age collector reads the store, and
has the state forget silent unlisted nodes first: a node gone for a while has no series).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from scheduler_extender.policy.base import Reason
from scheduler_extender.state.cluster import ClusterState

# Sub-millisecond resolution: the scheduler waits on every call, so 1 ms matters.
_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class _ReportCounts(Collector):
    """What agents' reports said about pods that the state counts as it ingests them."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state

    _COUNTS = (
        ("edgegpu_extender_foreign_processes", "foreign_processes",
         "GPU processes in agents' reports that name a pod assigned to another node or GPU "
         "(ignored: a report speaks for its own node only)."),
        ("edgegpu_extender_unlisted_nodes_refused", "refused_nodes",
         "Telemetry pushes refused for naming a new node that no Node object lists while the "
         "most such nodes are kept already, from a credential not bound to one node."),
        ("edgegpu_extender_silent_nodes_forgotten", "forgotten_nodes",
         "Nodes that no Node object lists, forgotten (row and metric series) after a silence "
         "of several times their staleAfter."),
        ("edgegpu_extender_assignments_corrected", "corrected_assignments",
         "Assignments corrected because an agent's report showed the pod holding another GPU "
         "of its node than bind chose (kubelet's PodResources, through the device plugin)."),
    )  # fmt: skip
    """(metric, the state's count, help)."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, count, text in self._COUNTS:
            yield CounterMetricFamily(name, text, value=getattr(self._state, count))


class CertificateExpiry(Collector):
    """When the serving certificate expires.

    The family is served without a sample until that is known (no TLS, or a certificate whose
    expiry could not be read).
    """

    def __init__(self) -> None:
        self.timestamp_s: float | None = None

    def set(self, timestamp_s: float) -> None:
        """The notAfter of the certificate served now, in Unix seconds."""
        self.timestamp_s = timestamp_s

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The gauge, with its one sample once known."""
        family = GaugeMetricFamily(
            "edgegpu_extender_certificate_expiry_timestamp_seconds",
            "When the certificate the extender serves HTTPS with expires (notAfter, Unix "
            "seconds); read again whenever the certificate files change.",
        )
        if self.timestamp_s is not None:
            family.add_metric([], self.timestamp_s)
        yield family


class _TelemetryAge(Collector):
    def __init__(self, state: ClusterState) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self._state
        state.forget_silent_nodes()  # a node gone for a while has no series
        now = state.clock.monotonic()
        yield GaugeMetricFamily(
            "edgegpu_extender_unlisted_nodes",
            "Nodes with telemetry that no Node object lists (every node in the embedded mode).",
            value=state.unlisted_nodes,
        )
        age = GaugeMetricFamily(
            "edgegpu_extender_telemetry_age_seconds",
            "Seconds since the node's last accepted telemetry report.",
            labels=["node"],
        )
        stale = GaugeMetricFamily(
            "edgegpu_extender_telemetry_stale",
            "1 when the node's telemetry is older than staleAfter.",
            labels=["node"],
        )
        args = state.policy.spec.stale_telemetry
        for node in state.store.nodes():
            record = state.store.get(node)
            if record is None:
                continue
            seconds = now - record.received_at
            age.add_metric([node], seconds)
            stale.add_metric([node], float(seconds > args.stale_after_s(record.digest.interval_s)))
        yield age
        yield stale


class ExtenderMetrics:
    """Every collector of the extender."""

    def __init__(self, registry: CollectorRegistry, state: ClusterState) -> None:
        self.registry = registry
        self.latency = Histogram(
            "edgegpu_extender_request_duration_seconds",
            "Time to answer one scheduler or telemetry request, by verb.",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.decisions = Counter(
            "edgegpu_extender_decisions_total",
            "Node verdicts given by filter, by result and reason.",
            ["verb", "result", "reason"],
            registry=registry,
        )
        self.request_errors = Counter(
            "edgegpu_extender_request_errors_total",
            "Scheduler requests answered with an error, by verb and kind (malformed, too_large, "
            "busy, timeout, unsupported_media_type, forbidden, internal).",
            ["verb", "kind"],
            registry=registry,
        )
        self.telemetry = Counter(
            "edgegpu_extender_telemetry_reports_total",
            "Telemetry pushes by result (accepted, ignored, invalid, too_large, unauthorized "
            "(401), forbidden (403), unsupported_media_type (415), busy (503), late (408), "
            "refused (429: a new node over the most that no Node lists)).",
            ["result"],
            registry=registry,
        )
        self.binds = Counter(
            "edgegpu_extender_binds_total",
            "Bind requests by result (bound, no_binder, no_fit, unknown_pod, foreign_scheduler, "
            "failed, malformed).",
            ["result"],
            registry=registry,
        )
        self.watch_restarts = Counter(
            "edgegpu_extender_watch_restarts_total",
            "Watches of the API server restarted, by resource and why (gone = relisted after 410).",
            ["resource", "why"],
            registry=registry,
        )
        self.policy_refused = Gauge(
            "edgegpu_extender_policy_refused",
            "1 while the GPUSchedulingPolicy custom resource's last edit is refused (not in force; "
            "a replica that starts meanwhile is not ready).",
            registry=registry,
        )
        self.leader = Gauge(
            "edgegpu_extender_leader",
            "1 while this replica holds the leader Lease (acts on the cluster).",
            registry=registry,
        )
        self.remediation = Counter(
            "edgegpu_extender_remediation_actions_total",
            "Actions of the remediation loop, by action (evict, cordon, self-test, reboot, "
            "uncordon, release, needs-human), reason (thermal, gpu_fault, over_budget, reclaim: "
            "lent memory blocks taken back) and result (evicted, "
            "done, dry_run, blocked by a PodDisruptionBudget, rate_limited, gone, failed).",
            ["action", "reason", "result"],
            registry=registry,
        )
        self.remediation_breaker = Gauge(
            "edgegpu_extender_remediation_breaker_tripped",
            "1 while remediation's circuit breaker is tripped (no new cordon until an operator "
            "deletes the ConfigMap edgegpu-remediation-breaker), as the leader last read it.",
            registry=registry,
        )
        self.remediation_timeouts = Counter(
            "edgegpu_extender_remediation_call_timeouts_total",
            "API calls of the remediation loop abandoned after their timeout, by call (get, "
            "patch, condition, event, evict).",
            ["call"],
            registry=registry,
        )
        self.maintenance_nodes = Gauge(
            "edgegpu_extender_maintenance_nodes",
            "Nodes of each GPUMaintenance by state (pending, draining, step, rebooting, "
            "validating, done, failed, skipped), as the leader last wrote its status.",
            ["maintenance", "state"],
            registry=registry,
        )
        self.maintenance_transitions = Counter(
            "edgegpu_extender_maintenance_transitions_total",
            "Nodes of GPU maintenances entering a state, by state.",
            ["state"],
            registry=registry,
        )
        self.slice_writes = Counter(
            "edgegpu_extender_resourceslice_writes_total",
            "ResourceSlices of the DRA driver gpu.edgegpu.io written by the leader, by operation "
            "(create, replace, delete).",
            ["op"],
            registry=registry,
        )
        self.remediation_transitions = Counter(
            "edgegpu_extender_remediation_transitions_total",
            "Nodes entering a state of the GPU fault loop (healthy: the loop ended).",
            ["state"],
            registry=registry,
        )
        self.certificate_expiry = CertificateExpiry()
        registry.register(self.certificate_expiry)
        registry.register(_TelemetryAge(state))
        registry.register(_ReportCounts(state))
        # Children of the per-request series, looked up once (a labels() call takes a lock).
        self._verdict_children: dict[tuple[str, int], Counter] = {}
        self._latency_children: dict[str, Histogram] = {}
        self.pushes_accepted = self.telemetry.labels("accepted")
        self.pushes_ignored = self.telemetry.labels("ignored")

    def observe_latency(self, verb: str, seconds: float) -> None:
        """Record the time one request took."""
        child = self._latency_children.get(verb)
        if child is None:
            child = self._latency_children[verb] = self.latency.labels(verb)
        child.observe(seconds)

    def count_verdicts(
        self, verb: str, reasons: npt.NDArray[np.int64], passed: npt.NDArray[np.bool_]
    ) -> None:
        """Add one request's verdicts: one counter update per distinct reason, not per node."""
        counts = np.bincount(np.where(passed, 0, reasons), minlength=len(Reason))
        for code in np.flatnonzero(counts).tolist():
            child = self._verdict_children.get((verb, code))
            if child is None:
                reason = Reason(code)
                if reason is Reason.OK:
                    result, label = "passed", "ok"
                else:
                    result = "failed" if reason.resolvable else "unresolvable"
                    label = reason.name.lower()
                child = self._verdict_children[verb, code] = self.decisions.labels(
                    verb, result, label
                )
            child.inc(int(counts[code]))
