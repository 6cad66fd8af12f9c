"""Agent authentication (DESIGN.md §7): who is pushing telemetry, and may it report for this node?

``TokenReviewAuth`` checks the agent's projected ServiceAccount token with the TokenReview API
(cached briefly, in bounded memory), that it belongs to the agent's ServiceAccount, and that the
token's bound pod runs on the node the report is for — so one compromised node cannot report
for another. ``StaticTokenAuth`` reads ``TOKEN NODE`` lines from a file, for the embedded mode
and tests. Neither looks at a token longer than ``MAX_TOKEN_CHARS``.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
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


MAX_TOKEN_CHARS = 8 * 1024
"""The longest bearer token looked at: a projected ServiceAccount token is about 1 KiB. A longer
one is refused 401 before it is hashed, reviewed or kept."""


def _digest(token: str) -> bytes:
    """SHA-256 of a token no longer than ``MAX_TOKEN_CHARS``; AuthError(401) for a longer one."""
    if len(token) > MAX_TOKEN_CHARS:
        raise AuthError(
            401,
            f"token rejected: longer than {MAX_TOKEN_CHARS} characters (a projected token "
            "is about 1 KiB)",
        )
    return hashlib.sha256(token.encode()).digest()


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
        found = self._tokens.get(_digest(token))
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


class _Lru:
    """At most ``size`` (expiry, value) entries by key; the least recently used goes first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[bytes, tuple[float, Identity | AuthError]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes, now: float) -> Identity | AuthError | None:
        """The value of an unexpired entry (now the most recently used), else None."""
        hit = self._entries.get(key)
        if hit is None:
            return None
        if hit[0] <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return hit[1]

    def put(self, key: bytes, expires: float, value: Identity | AuthError) -> None:
        """Keep ``value`` until ``expires``, dropping the least recently used past ``size``."""
        self._entries[key] = (expires, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


class TokenReviewAuth:
    """Projected ServiceAccount tokens, checked with TokenReview and the pod cache.

    Outcomes are kept for ``cache_ttl_s`` by the token's SHA-256, in two least-recently-used
    caches of fixed size: tokens the API server accepted (``accepted_entries``: twice the agents
    of the largest cluster Kubernetes supports, 5,000 nodes) and tokens it refused
    (``refused_entries``). However many distinct tokens arrive, the memory they take is bounded,
    and refused ones cannot push the agents' accepted tokens out.
    """

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
        accepted_entries: int = 10_000,
        refused_entries: int = 1_000,
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
        self._accepted = _Lru(accepted_entries)
        self._refused = _Lru(refused_entries)

    @property
    def cached(self) -> tuple[int, int]:
        """How many accepted and refused tokens are kept now."""
        return len(self._accepted), len(self._refused)

    async def authenticate(self, token: str) -> Identity:
        """TokenReview (off the event loop, cached for ``cache_ttl_s``), then the SA check."""
        key = _digest(token)
        now = self._clock()
        outcome = self._accepted.get(key, now) or self._refused.get(key, now)
        if outcome is None:
            try:
                status = await self._run(self._review, token) if self._run else self._review(token)
                outcome = self._identity(status)
            except AuthError as exc:
                outcome = AuthError(exc.status, str(exc))  # kept without its traceback's frames
            cache = self._refused if isinstance(outcome, AuthError) else self._accepted
            cache.put(key, now + self._ttl, outcome)
        if isinstance(outcome, AuthError):
            raise AuthError(outcome.status, str(outcome))
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
