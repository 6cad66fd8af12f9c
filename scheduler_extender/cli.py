"""Command line: ``gpu-sched-extender`` / ``python -m scheduler_extender``.

Flags win over ``EDGEGPU_*`` environment variables; every configuration error is printed at
once and the process exits with status 2.
"""

from __future__ import annotations

import ssl
import sys
from typing import Any

from scheduler_extender import __version__, logs
from scheduler_extender.config import ExtenderSettings, load_policy
from scheduler_extender.errors import PolicyError
from scheduler_extender.flags import SettingsCli
from scheduler_extender.serving import uvicorn_options


def command_line() -> SettingsCli[ExtenderSettings]:
    """The extender's flags: one per setting, plus its own actions."""
    cli = SettingsCli(
        ExtenderSettings,
        prog="gpu-sched-extender",
        description="GPU-aware kube-scheduler extender. Every setting is also read from "
        "EDGEGPU_<NAME>; a flag wins over its variable. --policy FILE is --policy-file FILE.",
        env_prefix="EDGEGPU_",
        aliases={"--policy": "--policy-file"},
    )
    cli.flag("--check-policy", action="store_true", help="validate the policy and exit")
    cli.flag("--version", action="version", version=f"%(prog)s {__version__}")
    return cli


def main(argv: list[str] | None = None) -> int:
    """Parse flags, validate everything, serve."""
    parsed = command_line().parse_or_report(argv)
    if parsed is None:
        return 2
    settings, ns = parsed
    try:
        policy = load_policy(settings.policy_file)
    except PolicyError as exc:
        print(f"gpu-sched-extender: invalid policy {settings.policy_file}:", file=sys.stderr)
        for line in exc.errors:
            print(f"  - {line}", file=sys.stderr)
        return 2
    if ns.check_policy:
        print(f"policy {policy.metadata.name!r} is valid")
        for note in policy.spec.notes():
            print(f"  note: {note}")
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
    options = uvicorn_options(settings.log_level, settings.head_timeout_s)
    uvicorn.run(app, host=settings.host, port=settings.port, **options, **tls)
    return 0
