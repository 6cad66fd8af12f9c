"""Extender settings (flags and ``EDGEGPU_`` environment variables) and policy file loading.

Validated once at start-up; every error is listed at once. Imports pydantic-settings, yaml and
``policy``; no web framework.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field
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
        256 * 1024 * 1024,
        gt=0,
        description="Cap on a scheduler request body: 5,000 full Node objects are ~50-100 MB.",
    )
    max_telemetry_bytes: int = Field(
        1024 * 1024, gt=0, description="Cap on one telemetry push (64 GPUs fit in ~100 kB)."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Least severe log level written."
    )
    debug_endpoints: Literal["on", "loopback", "off"] = Field(
        "on",
        description="Who may read /debug/*: everyone who reaches the port, loopback clients "
        "only, or nobody (404).",
    )
    # The cluster (no kubeconfig and not in-cluster = embedded mode, no API server at all).
    kubeconfig: Path | None = Field(None, description="kubeconfig file of the cluster.")
    in_cluster: bool = Field(False, description="Use the Pod's ServiceAccount to reach the API.")
    policy_name: str = Field(
        "edge-gpu-policy", min_length=1, description="GPUSchedulingPolicy to watch and follow."
    )
    namespace: str = Field("edgegpu-system", description="Namespace of the extender's Lease.")
    leader_elect: bool = Field(True, description="Campaign for the Lease (one replica acts).")
    lease_name: str = Field("edgegpu-extender", description="Name of the leader Lease.")
    identity: str | None = Field(None, description="Leader identity; default host name + pid.")
    agent_namespace: str = Field("edgegpu-system", description="Namespace of the node agents.")
    agent_service_account: str = Field(
        "edgegpu-node-agent", description="ServiceAccount whose tokens may push telemetry."
    )
    static_token_file: Path | None = Field(
        None, description="'TOKEN NODE' lines: agent tokens without TokenReview (embedded mode)."
    )
    tls_cert_file: Path | None = Field(None, description="Serve HTTPS with this certificate.")
    tls_key_file: Path | None = Field(None, description="Private key of the certificate.")
    client_ca_file: Path | None = Field(
        None,
        description="With TLS: the scheduler's verbs need a client certificate signed by this "
        "CA (kube-scheduler's extender tlsConfig certFile/keyFile); agents still push with "
        "their tokens and no certificate.",
    )

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
