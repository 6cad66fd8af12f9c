"""Leader election on a ``coordination.k8s.io`` Lease, as client-go's leaderelection does.

Several extender replicas answer the scheduler identically; only the Lease holder acts on the
cluster (remediation). The holder renews every ``retry_s``; another replica takes over when it
has seen the same renewTime for longer than ``lease_duration_s`` (its own clock, so skew
between machines does not matter). Writes use the Lease's resourceVersion, so two replicas
cannot both win. Leading means a renew that succeeded within ``renew_deadline_s`` (shorter than
the lease): a holder whose renews hang or fail stops leading before any other replica can take
the Lease, and ``holds(for_s)`` tells a caller whether that will still be so ``for_s`` from now.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from scheduler_extender.k8s.client import KubeApi, KubeError

log = logging.getLogger("scheduler_extender.k8s")


def _now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class LeaseElector:
    """Acquire and renew a Lease in a background thread; ``is_leader`` tells the state."""

    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float | None = None,
        retry_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], Any] | None = None,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.identity = identity
        if renew_deadline_s is None:
            renew_deadline_s = lease_duration_s * 2 / 3  # client-go's 10 s of 15
        if not 0 < renew_deadline_s < lease_duration_s:
            raise ValueError("renew_deadline_s must be positive and shorter than the lease")
        # A Lease call that hangs is given up well before the renew deadline runs out.
        self._api = api.with_timeout(min(api.timeout_s, renew_deadline_s / 3))
        self._duration = lease_duration_s
        self._deadline = renew_deadline_s
        self._retry = retry_s
        self._renewed_at = -float("inf")
        """When (monotonic, before the call) the last renew that succeeded was sent."""
        self._clock = clock
        self._on_change = on_change
        self._leader = False
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-elector", daemon=True)

    @property
    def is_leader(self) -> bool:
        """Whether this replica holds the Lease now (renewed within the renew deadline)."""
        return self.holds(0.0)

    def holds(self, for_s: float) -> bool:
        """Whether this replica leads, and will still ``for_s`` from now without a renew.

        A caller about to write something that takes up to ``for_s`` asks this first: then the
        write lands before any other replica may acquire the Lease.
        """
        return self._leader and self._clock() + for_s - self._renewed_at < self._deadline

    def start(self) -> None:
        """Start campaigning."""
        self._thread.start()

    def stop(self) -> None:
        """Stop, and give the Lease up if held (the next replica need not wait it out)."""
        self._stop.set()
        self._thread.join(timeout=5)
        held = self._leader
        self._set(False)  # before the Lease is given up: nothing more is written from here
        if held:
            try:
                lease = self._api.get_lease(self.namespace, self.name)
                if lease and lease.get("spec", {}).get("holderIdentity") == self.identity:
                    lease["spec"]["holderIdentity"] = ""
                    self._api.replace_lease(self.namespace, self.name, lease)
            except KubeError as exc:
                log.info("could not release the lease: %s", exc)

    def _set(self, leader: bool) -> None:
        if leader != self._leader:
            self._leader = leader
            log.info("%s %s leadership of lease %s/%s", self.identity,
                     "acquired" if leader else "lost", self.namespace, self.name)  # fmt: skip
            if self._on_change is not None:
                self._on_change(leader)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._set(self.try_acquire_or_renew())
            except KubeError as exc:
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            if self._leader and not self.is_leader:
                self._set(False)  # no renew within the deadline: another may take it soon
            self._stop.wait(self._retry)

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this replica holds the Lease afterwards."""
        now = self._clock()
        lease = self._api.get_lease(self.namespace, self.name)
        renew = _now_rfc3339()
        spec_new: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self._duration),
            "renewTime": renew,
        }
        if lease is None:
            try:
                self._api.create_lease(
                    self.namespace,
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace},
                        "spec": {**spec_new, "acquireTime": renew, "leaseTransitions": 0},
                    },
                )
            except KubeError as exc:
                if exc.status == 409:
                    return False
                raise
            self._observed, self._observed_at = (self.identity, renew), now
            self._renewed_at = now
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        seen = (holder, str(spec.get("renewTime") or ""))
        if seen != self._observed:
            self._observed, self._observed_at = seen, now
        if holder and holder != self.identity:
            duration = float(spec.get("leaseDurationSeconds") or self._duration)
            if now - self._observed_at < duration:
                return False  # someone else holds it and renews it
        new_spec = dict(spec, **spec_new)
        if holder != self.identity:
            new_spec["acquireTime"] = renew
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        lease["spec"] = new_spec
        try:
            self._api.replace_lease(self.namespace, self.name, lease)
        except KubeError as exc:
            if exc.status == 409:
                return False  # another replica wrote first
            raise
        self._observed, self._observed_at = (self.identity, renew), now
        self._renewed_at = now
        return True
