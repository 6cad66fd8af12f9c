"""Extender settings (flags and ``EDGEGPU_`` environment variables) and policy file loading.

Validated once at start-up; every error is listed at once. Imports pydantic-settings, yaml and
``policy``; no web framework.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, StringConstraints, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from scheduler_extender.errors import PolicyError
from scheduler_extender.policy.document import DEFAULT_POLICY, Policy, parse_policy


class ExtenderSettings(BaseSettings):
    """Everything the extender process is configured with."""

    model_config = SettingsConfigDict(env_prefix="EDGEGPU_", extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", description="Address to listen on; 0.0.0.0 in a Pod.")
    port: int = Field(8888, ge=1, le=65535, description="Port for the scheduler and telemetry.")
    path_prefix: str = Field(
        "",
        pattern=r"^(/[A-Za-z0-9._~-]+)*$",
        description="Path part of the scheduler's urlPrefix ('' = verbs at the root).",
    )
    policy_file: Path | None = Field(
        None, description="GPUSchedulingPolicy document (JSON or YAML); unset = defaults."
    )
    max_request_bytes: int = Field(
        8 * 1024 * 1024,
        gt=0,
        description="Cap on one scheduler request body (and /debug/explain's), in bytes. The "
        "default fits nodeCacheCapable: true, where the scheduler sends the Pod (the API server "
        "takes none over 3 MiB) and node names; with nodeCacheCapable: false it sends every "
        "candidate Node object (10-20 kB each): raise this, --max-inflight-request-bytes and "
        "the memory limit with it.",
    )
    max_telemetry_bytes: int = Field(
        1024 * 1024, gt=0, description="Cap on one telemetry push (64 GPUs fit in ~100 kB)."
    )
    max_inflight_request_bytes: int = Field(
        32 * 1024 * 1024,
        gt=0,
        description="Scheduler request bodies held at once across every connection, in bytes "
        "(parsing takes a few times a body's size): four bodies at the default cap. A request "
        "that does not fit waits up to 1 s, then is answered with an error in its body.",
    )
    max_inflight_telemetry_bytes: int = Field(
        16 * 1024 * 1024,
        gt=0,
        description="Telemetry push bodies held at once across every connection, in bytes: "
        "thousands of usual reports. A push that does not fit is answered 503 with "
        "Retry-After, and the agent backs off.",
    )
    head_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds a request's line and headers may take to arrive, from the "
        "connection opening (or the request's first byte on a kept-alive one); the connection "
        "is then closed (408 when part of a head came).",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Least severe log level written."
    )
    debug_endpoints: Literal["on", "loopback", "off"] = Field(
        "loopback",
        description="Who may read / and /debug/*: everyone who reaches the port, loopback "
        "clients only (kubectl port-forward, exec), or nobody (404).",
    )
    filter_answer: Literal["best", "all"] = Field(
        "best",
        description="What filter answers when nodes fit: the single best node by the full "
        "policy score (kube-scheduler then skips scoring; its own scorers and the extender "
        "weight no longer matter for the pods sent here), or every node that fits (scored "
        "at prioritize, 0..10 points weighed with kube-scheduler's own scorers).",
    )
    tie_seed: int | None = Field(
        None,
        description="Seed of the random choice among equally good nodes (unset: a new seed "
        "at each start). For reproducible benchmarks.",
    )
    scheduler_names: list[Annotated[str, StringConstraints(min_length=1)]] = Field(
        ["edgegpu-scheduler"],
        min_length=1,
        description="Schedulers (a pod's spec.schedulerName) whose pods bind may bind; a pod of "
        "any other is refused. List every profile whose extenders name this one.",
    )
    # The cluster (no kubeconfig and not in-cluster = embedded mode, no API server at all).
    kubeconfig: Path | None = Field(None, description="kubeconfig file of the cluster.")
    in_cluster: bool = Field(False, description="Use the Pod's ServiceAccount to reach the API.")
    policy_name: str = Field(
        "edge-gpu-policy", min_length=1, description="GPUSchedulingPolicy to watch and follow."
    )
    namespace: str = Field("edgegpu-system", description="Namespace of the extender's Lease.")
    dra: bool = Field(
        False,
        description="Act as the DRA driver gpu.edgegpu.io (Kubernetes 1.36; docs/dra.md): publish "
        "each node's GPUs as a ResourceSlice (leader), with heat and faults as device taints, "
        "and list each node's allocated claims to its agent.",
    )
    leader_elect: bool = Field(True, description="Campaign for the Lease (one replica acts).")
    lease_name: str = Field("edgegpu-extender", description="Name of the leader Lease.")
    identity: str | None = Field(None, description="Leader identity; default host name + pid.")
    agent_namespace: str = Field("edgegpu-system", description="Namespace of the node agents.")
    agent_service_account: str = Field(
        "edgegpu-node-agent", description="ServiceAccount whose tokens may push telemetry."
    )
    token_audience: str = Field(
        "edgegpu",
        min_length=1,
        description="Audience the agents' projected tokens must carry (TokenReview checks it): "
        "a token the API server would take, or one made for another service, is refused.",
    )
    static_token_file: Path | None = Field(
        None, description="'TOKEN NODE' lines: agent tokens without TokenReview (embedded mode)."
    )
    tls_cert_file: Path | None = Field(None, description="Serve HTTPS with this certificate.")
    tls_key_file: Path | None = Field(None, description="Private key of the certificate.")
    client_ca_file: Path | None = Field(
        None,
        description="With TLS: the scheduler's verbs need a client certificate signed by this "
        "CA (kube-scheduler's extender tlsConfig certFile/keyFile) and for one of "
        "--client-cert-names; agents still push with their tokens and no certificate.",
    )
    client_cert_names: list[Annotated[str, StringConstraints(min_length=1)]] = Field(
        ["edgegpu-scheduler"],
        min_length=1,
        description="Names (a client certificate's subject CN or one of its DNS names) of the "
        "schedulers that may call the verbs; any other certificate of the client CA, the "
        "extender's own among them, is refused 403.",
    )
    insecure_open_verbs: bool = Field(
        False,
        description="Serve the verbs with a cluster, on an address other than loopback, "
        "without --client-ca-file: anyone who reaches the port may call them, bind included. "
        "Unless this is given, the extender refuses to start so.",
    )

    @model_validator(mode="after")
    def _each_body_fits_in_flight(self) -> ExtenderSettings:
        problems = [
            f"{cap} ({getattr(self, cap)}) is over {budget} ({getattr(self, budget)}): a body "
            f"at the cap could never be read; raise --{budget.replace('_', '-')}"
            for cap, budget in (
                ("max_request_bytes", "max_inflight_request_bytes"),
                ("max_telemetry_bytes", "max_inflight_telemetry_bytes"),
            )
            if getattr(self, cap) > getattr(self, budget)
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def has_cluster(self) -> bool:
        """Whether the extender talks to an API server."""
        return self.kubeconfig is not None or self.in_cluster


def load_policy_text(text: str, source: str) -> Policy:
    """Parse a policy document from JSON or YAML text; PolicyError lists every problem."""
    try:
        document: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError([f"{source}: not valid YAML or JSON: {exc}"]) from None
    return parse_policy(document)


def load_policy(path: Path | None) -> Policy:
    """The policy from a file, or the defaults when no file is given."""
    if path is None:
        return DEFAULT_POLICY
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError([f"{path}: cannot read: {exc.strerror}"]) from None
    return load_policy_text(text, str(path))
