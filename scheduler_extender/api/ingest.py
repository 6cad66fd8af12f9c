"""``POST /v1/telemetry``: authenticate, validate, store one agent report (DESIGN.md §3).

Answered on the fast path beside the scheduler verbs: at 5,000 nodes pushing every few
seconds, framework overhead per push would cost a core. Without agent authentication only
loopback clients may push (and a warning is logged once).
"""

from __future__ import annotations

import functools
import ipaddress
from typing import Any

import orjson
from pydantic import ValidationError

from scheduler_extender.api.context import AppContext
from scheduler_extender.errors import RequestError
from scheduler_extender.k8s.auth import AuthError, Identity
from scheduler_extender.k8s.translate import per_container
from scheduler_extender.names import MEM_BLOCK_RESOURCE
from scheduler_extender.telemetry.answer import AnswerPolicy, Ask, PushAnswer, StepAsk
from scheduler_extender.telemetry.decode import ReportError, decode_report
from scheduler_extender.telemetry.store import PutResult, Received

_MAX_PROBLEMS = 20


@functools.lru_cache(maxsize=1024)
def is_loopback(host: str | None) -> bool:
    """Whether a client address is on this machine."""
    if host is None:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _error(status: int, message: str, **extra: Any) -> tuple[int, bytes]:
    return status, orjson.dumps({"error": message, **extra})


async def authenticate(
    ctx: AppContext, client: str | None, token: str | None
) -> Identity | tuple[int, bytes] | None:
    """The agent behind a request, or the (status, JSON body) refusing it.

    None: a loopback caller while no agent authentication is configured.
    """
    if ctx.auth is None:
        if not is_loopback(client):
            return _error(
                403, "no agent authentication is configured: only loopback clients may push"
            )
        ctx.warn_once(
            "no-auth", "telemetry: no agent authentication configured; loopback pushes only"
        )
        return None
    if token is None:
        return _error(401, "a bearer token is required (the agent's ServiceAccount token)")
    try:
        return await ctx.auth.authenticate(token)
    except AuthError as exc:
        return _error(exc.status, str(exc))


def authorize(ctx: AppContext, identity: Identity | None, node: str) -> tuple[int, bytes] | None:
    """None when the identity may act for ``node``, else the (status, JSON body) refusing it."""
    if ctx.auth is None or identity is None:
        return None
    try:
        ctx.auth.authorize(identity, node)
    except AuthError as exc:
        return _error(exc.status, str(exc))
    return None


async def authenticate_push(
    ctx: AppContext, client: str | None, token: str | None
) -> Identity | tuple[int, bytes] | None:
    """``authenticate`` for a push, counting a refusal (before its body is read)."""
    identity = await authenticate(ctx, client, token)
    if isinstance(identity, tuple):
        forbidden = identity[0] == 403 and ctx.auth is not None
        ctx.metrics.telemetry.labels("forbidden" if forbidden else "unauthorized").inc()
    return identity


def too_large(ctx: AppContext) -> tuple[int, bytes]:
    """The (status, JSON body) refusing a push over the size cap, counted."""
    ctx.metrics.telemetry.labels("too_large").inc()
    return _error(413, f"report is over the limit of {ctx.settings.max_telemetry_bytes} bytes")


def admit(ctx: AppContext, identity: Identity | None, body: bytes) -> Received | tuple[int, bytes]:
    """Decode one authenticated push: the push to store, or the (status, JSON body) refusing it."""
    metrics = ctx.metrics.telemetry
    try:
        push = Received.of(decode_report(body, _MAX_PROBLEMS))
    except ReportError as exc:
        metrics.labels("invalid").inc()
        return _error(422, str(exc), problems=exc.problems)
    refused = authorize(ctx, identity, push.digest.node)
    if refused is not None:
        metrics.labels("forbidden").inc()
        return refused
    return push


def _encode(answer: PushAnswer) -> bytes:
    """The answer's JSON: only the fields it was given (an old agent sees the keys it knows)."""
    return orjson.dumps(answer.model_dump(mode="json", exclude_none=True, exclude_unset=True))


@functools.lru_cache(maxsize=8)
def _answer_policy(policy: tuple[float, float, bool, float, int]) -> AnswerPolicy:
    max_temp_c, cool_down_s, saving, threshold_pct, block_mib = policy
    fields: dict[str, Any] = {
        "max_temp_c": max_temp_c,
        "cool_down_s": cool_down_s,
        "power_saving": saving,
        "power_saving_threshold_pct": threshold_pct,
        "memory_block_mib": block_mib,
    }
    try:
        return AnswerPolicy(**fields)
    except ValidationError:  # a policy value the agent takes no part of: sent, it judges
        return AnswerPolicy.model_construct(**fields)


def _build(**fields: Any) -> PushAnswer:
    """The answer with these fields, checked as the agent will read it.

    Validating is the fast way to build a model; a value out of the agent's bounds (a lent
    uuid, a maxTemp under 1 °C) is still sent as it is, for the agent to judge field by field.
    """
    try:
        return PushAnswer(**fields)
    except ValidationError:
        return PushAnswer.model_construct(**fields)


@functools.lru_cache(maxsize=8)
def _usual_answer(policy: tuple[float, float, bool, float, int]) -> bytes:
    said = _answer_policy(policy)
    # ``max_temp_c`` at the top too: agents from before ``policy`` read only that one.
    return _encode(
        _build(accepted=True, performance_gpus=frozenset(), max_temp_c=said.max_temp_c, policy=said)
    )


def answer(ctx: AppContext, node: str, result: PutResult) -> tuple[int, bytes]:
    """The (status, JSON body) for a node's report the state took (``ClusterState.ingest``).

    ``max_temp_c`` tells the agent from which temperature to count its GPUs' ``hot_s_ago``;
    ``policy`` is what the agent's local protection follows (so a policy change reaches it);
    ``self_test`` / ``reboot`` (with an id) are the fault loop's requests of it;
    ``lend_blocks`` (GPU uuid → blocks) the idle blocks its device plugin advertises besides
    each GPU's own (``memory.idleRelease``).
    """
    (ctx.metrics.pushes_accepted if result.accepted else ctx.metrics.pushes_ignored).inc()
    # GPUs holding high-QoS pods: the agent keeps them out of power saving.
    performance = ctx.state.performance_gpus(node)
    spec = ctx.state.policy.spec
    policy = (
        spec.thermal_throttling.max_temp_c,
        spec.thermal_throttling.cool_down_s,
        spec.power_saving.enabled,
        spec.power_saving.threshold_pct,
        spec.memory.block_mib,
    )
    asks = ctx.remediator.requests(node) if ctx.remediator is not None else {}
    lend = ctx.state.lent_blocks(node)
    if result.accepted and not performance and not result.reason and not asks and not lend:
        return 200, _usual_answer(policy)  # the usual answer, kept ready
    fields: dict[str, Any] = {}
    for kind, request in asks.items():
        try:
            fields[kind] = StepAsk(**request) if kind == "maintenance" else Ask(**request)
        except ValidationError as exc:  # the agent would refuse it: it is not sent
            ctx.warn_once(
                f"ask:{kind}", f"telemetry: a {kind} request for {node} is not sent: {exc}"
            )
    if lend:
        fields["lend_blocks"] = lend
    if result.reason:
        fields["reason"] = result.reason
    said = _answer_policy(policy)
    built = _build(
        accepted=result.accepted,
        performance_gpus=frozenset(performance),
        max_temp_c=said.max_temp_c,
        policy=said,
        **fields,
    )
    return 200, _encode(built)


def push(ctx: AppContext, identity: Identity | None, body: bytes) -> tuple[int, bytes]:
    """One authenticated push (``authenticate_push``) → (status, JSON body)."""
    checked = admit(ctx, identity, body)
    if not isinstance(checked, Received):
        return checked
    # A credential that can speak for one node only (a token bound to it, an agent pod on it)
    # cannot invent nodes; pushes without one (loopback, a '*' token) are held to a cap.
    bound = identity is not None and (identity.node is not None or identity.pod_name is not None)
    result = ctx.state.ingest(checked, bound_to_node=bound)
    if result.refused:
        ctx.metrics.telemetry.labels("refused").inc()
        return _error(429, result.reason or "refused")
    return answer(ctx, checked.digest.node, result)


async def _node_agent_only(
    ctx: AppContext, node: str, client: str | None, token: str | None
) -> tuple[int, bytes] | None:
    """The refusal of a caller that may not speak for ``node``'s agent; None when it may."""
    identity = await authenticate(ctx, client, token)
    if isinstance(identity, tuple):
        return identity
    return authorize(ctx, identity, node)


async def assignments(
    ctx: AppContext, node: str, client: str | None, token: str | None
) -> tuple[int, bytes]:
    """``GET /v1/nodes/{node}/assignments`` → (status, JSON body).

    The GPU assignments of the pods on ``node``, for that node's agent only: its device plugin
    gives each container the GPU chosen at bind.
    """
    refused = await _node_agent_only(ctx, node, client, token)
    if refused is not None:
        return refused
    if ctx.sync is not None and not ctx.sync.synced:
        return _error(503, "the pod cache is not synced yet: ask another replica")
    pods = ctx.sync.pods_by_uid if ctx.sync is not None else {}
    rows = []
    for a in ctx.state.allocations.on_node(node):
        pod = pods.get(a.pod_uid) or {}
        try:
            containers = [b for b in per_container(pod, MEM_BLOCK_RESOURCE, a.name) if b]
        except RequestError:
            containers = []
        rows.append(
            {
                "namespace": a.namespace,
                "name": a.name,
                "uid": a.pod_uid,
                "gpu_indices": list(a.gpu_indices),
                "gpu_uuids": list(a.gpu_uuids),
                "blocks": a.mem_blocks,
                "whole": a.whole,
                "assigned_at": a.assigned_at,
                "phase": (pod.get("status") or {}).get("phase"),
                "containers": containers,
            }
        )
    block_mib = ctx.state.policy.spec.memory.block_mib
    return 200, orjson.dumps({"node": node, "block_mib": block_mib, "assignments": rows})


async def claims(
    ctx: AppContext, node: str, client: str | None, token: str | None
) -> tuple[int, bytes]:
    """``GET /v1/nodes/{node}/claims`` → (status, JSON body).

    The ResourceClaims allocated a GPU of ``node``, for that node's agent only: its DRA plugin
    prepares them.
    """
    refused = await _node_agent_only(ctx, node, client, token)
    if refused is not None:
        return refused
    dra = ctx.sync.dra if ctx.sync is not None else None
    if dra is None:
        return _error(404, "this extender runs without DRA (EDGEGPU_DRA)")
    if not (dra.claims_synced and dra.slices_synced):
        return _error(
            503,
            "the claim cache is not synced yet: ask another replica (if it lasts: "
            "does the API server serve resource.k8s.io/v1, and may the extender list "
            "resourceslices and resourceclaims, as overlays/dra/rbac.yaml allows?)",
        )
    return 200, orjson.dumps({"node": node, "claims": dra.claims_on(node)})
