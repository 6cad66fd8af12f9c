"""Command line: ``gpu-sched-extender`` / ``python -m scheduler_extender``.

Flags win over ``EDGEGPU_*`` environment variables; every configuration error is printed at
once and the process exits with status 2.
"""

from __future__ import annotations

import argparse
import ssl
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from scheduler_extender import __version__, logs
from scheduler_extender.config import ExtenderSettings, load_policy
from scheduler_extender.errors import PolicyError
from scheduler_extender.flags import Parser, describe_settings
from scheduler_extender.serving import uvicorn_options


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="gpu-sched-extender",
        description="GPU-aware kube-scheduler extender. Every setting is also read from "
        "EDGEGPU_<NAME>; a flag wins over its variable.",
    )
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8888)")
    p.add_argument("--policy", type=Path, dest="policy_file", help="GPUSchedulingPolicy file")
    p.add_argument("--path-prefix", help="path part of the scheduler's urlPrefix")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--debug-endpoints",
        choices=["on", "loopback", "off"],
        help="who may read /debug/*: anyone (default), loopback clients, nobody",
    )
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig of the cluster (default: embedded)")
    p.add_argument(
        "--in-cluster", action="store_true", default=None, help="use the Pod's ServiceAccount"
    )
    p.add_argument("--policy-name", help="GPUSchedulingPolicy custom resource to follow")
    p.add_argument("--namespace", help="namespace of the leader Lease")
    p.add_argument("--no-leader-elect", action="store_false", dest="leader_elect", default=None)
    p.add_argument("--agent-namespace", help="namespace of the node agents")
    p.add_argument("--agent-service-account", help="ServiceAccount of the node agents")
    p.add_argument("--static-token-file", type=Path, help="'TOKEN NODE' lines for agent auth")
    p.add_argument("--tls-cert-file", type=Path, help="serve HTTPS with this certificate")
    p.add_argument("--tls-key-file", type=Path, help="the certificate's private key")
    p.add_argument(
        "--client-ca-file", type=Path, help="the scheduler's verbs need a client cert of this CA"
    )
    p.add_argument("--check-policy", action="store_true", help="validate the policy and exit")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    describe_settings(p, ExtenderSettings, "EDGEGPU_")
    return p


def settings_from(ns: argparse.Namespace) -> ExtenderSettings:
    """The settings the parsed flags give (flags win over ``EDGEGPU_*``; ValidationError)."""
    overrides: dict[str, Any] = {
        k: v for k, v in vars(ns).items() if v is not None and k != "check_policy"
    }
    return ExtenderSettings(**overrides)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, validate everything, serve."""
    ns = _parser().parse_args(argv)
    try:
        settings = settings_from(ns)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            print(
                f"gpu-sched-extender: {'.'.join(map(str, err['loc']))}: {err['msg']}",
                file=sys.stderr,
            )
        return 2
    try:
        policy = load_policy(settings.policy_file)
    except PolicyError as exc:
        print(f"gpu-sched-extender: invalid policy {settings.policy_file}:", file=sys.stderr)
        for line in exc.errors:
            print(f"  - {line}", file=sys.stderr)
        return 2
    if ns.check_policy:
        print(f"policy {policy.metadata.name!r} is valid")
        return 0

    import uvicorn

    from scheduler_extender.api.app import create_app

    logs.setup(settings.log_level)
    kube = None
    if settings.has_cluster:
        from scheduler_extender.k8s.client import KubeApi, load_api_client

        try:
            kube = KubeApi(load_api_client(settings.kubeconfig))
        except Exception as exc:  # the config loaders raise several unrelated types
            print(
                f"gpu-sched-extender: cannot load the cluster configuration: {exc}", file=sys.stderr
            )
            return 2
    if (settings.tls_cert_file is None) != (settings.tls_key_file is None):
        print("gpu-sched-extender: --tls-cert-file and --tls-key-file go together", file=sys.stderr)
        return 2
    try:
        app = create_app(
            settings,
            policy=policy,
            policy_source=str(settings.policy_file) if settings.policy_file else "defaults",
            kube=kube,
        )
    except (OSError, ValueError) as exc:
        print(f"gpu-sched-extender: {exc}", file=sys.stderr)
        return 2
    if settings.client_ca_file is not None and settings.tls_cert_file is None:
        print("gpu-sched-extender: --client-ca-file needs --tls-cert-file", file=sys.stderr)
        return 2
    tls: dict[str, Any] = {}
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        tls = {
            "ssl_certfile": str(settings.tls_cert_file),
            "ssl_keyfile": str(settings.tls_key_file),
        }
    if settings.client_ca_file is not None:
        # Optional at the TLS layer (agents have none); the verbs check it (api/fast.py).
        tls.update(ssl_ca_certs=str(settings.client_ca_file), ssl_cert_reqs=ssl.CERT_OPTIONAL)
    uvicorn.run(
        app, host=settings.host, port=settings.port, **uvicorn_options(settings.log_level), **tls
    )
    return 0
