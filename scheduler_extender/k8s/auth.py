"""Agent authentication (DESIGN.md §7): who is pushing telemetry, and may it report for this node?

``TokenReviewAuth`` checks the agent's projected ServiceAccount token with the TokenReview API
(cached briefly), that it belongs to the agent's ServiceAccount, and that the token's bound pod
runs on the node the report is for — so one compromised node cannot report for another.
``StaticTokenAuth`` reads ``TOKEN NODE`` lines from a file, for the embedded mode and tests.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated agent."""

    user: str
    pod_namespace: str | None = None
    pod_name: str | None = None
    pod_uid: str | None = None
    node: str | None = None
    """The node the credential is bound to, when the credential itself says so."""


class AuthError(Exception):
    """401 (who are you?) or 403 (not for that node) with a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class AgentAuth(Protocol):
    """Authenticates a bearer token, then authorises a report for a node."""

    async def authenticate(self, token: str) -> Identity:
        """The identity behind a token; AuthError(401) if there is none."""
        ...

    def authorize(self, identity: Identity, node: str) -> None:
        """AuthError(403) unless the identity may report for ``node``."""
        ...


class StaticTokenAuth:
    """Tokens from a file: one ``TOKEN NODE`` pair per line (``*`` = any node); # comments."""

    def __init__(self, path: Path) -> None:
        self._tokens: dict[bytes, str] = {}
        """SHA-256 of each token → its node: one lookup a push, and no comparison whose time
        depends on how much of a token an attacker guessed."""
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ValueError(f"{path}:{n}: expected 'TOKEN NODE', got {len(parts)} fields")
            self._tokens[hashlib.sha256(parts[0].encode()).digest()] = parts[1]

    async def authenticate(self, token: str) -> Identity:
        """The node of a configured token."""
        found = self._tokens.get(hashlib.sha256(token.encode()).digest())
        if found is None:
            raise AuthError(401, "unknown token")
        return Identity(user="static-token", node=None if found == "*" else found)

    def authorize(self, identity: Identity, node: str) -> None:
        """A token bound to a node may only report for that node."""
        if identity.node is not None and identity.node != node:
            raise AuthError(403, f"this token may report for node {identity.node!r} only")


PodLookup = Callable[[str, str], "dict[str, Any] | None"]
"""(namespace, name) → the pod's {uid, node, service_account}, from the pod cache."""
Review = Callable[[str], "dict[str, Any]"]
"""token → the TokenReview status (``authenticated``, ``user``...), from the API server."""


class TokenReviewAuth:
    """Projected ServiceAccount tokens, checked with TokenReview and the pod cache."""

    POD_NAME = "authentication.kubernetes.io/pod-name"
    POD_UID = "authentication.kubernetes.io/pod-uid"
    NODE_NAME = "authentication.kubernetes.io/node-name"

    def __init__(
        self,
        review: Review,
        pods: PodLookup,
        *,
        namespace: str,
        service_account: str,
        audience: str | None = None,
        cache_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        run: Callable[..., Any] | None = None,
    ) -> None:
        self._review = review
        self._pods = pods
        self._user = f"system:serviceaccount:{namespace}:{service_account}"
        self._audience = audience
        self._ttl = cache_ttl_s
        self._clock = clock
        self._run = run
        self._cache: dict[str, tuple[float, Identity | AuthError]] = {}

    async def authenticate(self, token: str) -> Identity:
        """TokenReview (off the event loop, cached for ``cache_ttl_s``), then the SA check."""
        now = self._clock()
        hit = self._cache.get(token)
        if hit is not None and hit[0] > now:
            outcome = hit[1]
        else:
            try:
                status = await self._run(self._review, token) if self._run else self._review(token)
                outcome = self._identity(status)
            except AuthError as exc:
                outcome = exc
            if len(self._cache) > 10_000:
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            self._cache[token] = (now + self._ttl, outcome)
        if isinstance(outcome, AuthError):
            raise outcome
        return outcome

    def _identity(self, status: dict[str, Any]) -> Identity:
        if not status.get("authenticated"):
            raise AuthError(401, f"token rejected: {status.get('error') or 'not authenticated'}")
        if self._audience is not None and self._audience not in (status.get("audiences") or []):
            raise AuthError(401, f"token rejected: not issued for the audience {self._audience!r}")
        user = status.get("user") or {}
        if user.get("username") != self._user:
            raise AuthError(403, f"{user.get('username')!r} is not the agent's ServiceAccount")
        extra = user.get("extra") or {}

        def one(key: str) -> str | None:
            values = extra.get(key) or []
            return str(values[0]) if values else None

        namespace = self._user.split(":")[2]
        return Identity(
            user=self._user,
            pod_namespace=namespace,
            pod_name=one(self.POD_NAME),
            pod_uid=one(self.POD_UID),
            node=one(self.NODE_NAME),
        )

    def authorize(self, identity: Identity, node: str) -> None:
        """The token's pod must exist, be the same pod (uid) and run on ``node``."""
        if identity.pod_name is None or identity.pod_namespace is None:
            raise AuthError(403, "the token is not bound to a pod (use a projected token)")
        pod = self._pods(identity.pod_namespace, identity.pod_name)
        if pod is None:
            raise AuthError(403, f"pod {identity.pod_namespace}/{identity.pod_name} is not known")
        if identity.pod_uid is not None and pod.get("uid") != identity.pod_uid:
            raise AuthError(403, "the token's pod was replaced (uid differs)")
        if pod.get("node") != node:
            raise AuthError(403, f"the token's pod runs on {pod.get('node')!r}, not on {node!r}")
