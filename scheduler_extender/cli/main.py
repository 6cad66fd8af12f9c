"""Command line: ``gpu-sched-extender`` / ``python -m scheduler_extender``.

Flags win over ``EDGEGPU_*`` environment variables; every configuration error is printed at
once and the process exits with status 2. With a cluster, the extender does not serve its verbs
open beyond loopback unless told to (``--insecure-open-verbs``).
"""

from __future__ import annotations

import logging
import sys

from scheduler_extender import __version__, logs
from scheduler_extender.api.server import raise_open_files_limit, uvicorn_options
from scheduler_extender.api.tls import ServingTls
from scheduler_extender.cli.flags import SettingsCli
from scheduler_extender.config import ExtenderSettings, load_policy
from scheduler_extender.errors import PolicyError

log = logging.getLogger("scheduler_extender")


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
    from scheduler_extender.api.ingest import is_loopback

    open_verbs = settings.has_cluster and settings.client_ca_file is None
    open_verbs = open_verbs and not is_loopback(settings.host)
    if open_verbs and not settings.insecure_open_verbs:
        print(
            f"gpu-sched-extender: with a cluster and --host {settings.host}, anyone who reaches "
            "the port could call the scheduler verbs, bind included: give --client-ca-file (and "
            "--tls-cert-file) so that only the scheduler's client certificate may, or "
            "--insecure-open-verbs to serve them open",
            file=sys.stderr,
        )
        return 2
    logs.setup(settings.log_level)
    if open_verbs:
        log.warning(
            "the scheduler verbs, bind included, answer anyone who reaches %s:%d "
            "(--insecure-open-verbs; --client-ca-file closes them)",
            settings.host,
            settings.port,
        )
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
    options = uvicorn_options(settings.log_level, settings.head_timeout_s)
    raise_open_files_limit()
    tls = None
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        try:
            tls = ServingTls(
                settings.tls_cert_file,
                settings.tls_key_file,
                settings.client_ca_file,
                on_expiry=app.state.ctx.metrics.certificate_expiry.set,
            )
        except OSError as exc:  # ssl.SSLError among them
            print(f"gpu-sched-extender: cannot load the TLS files: {exc}", file=sys.stderr)
            return 2
        options.update(tls.uvicorn_options())
        tls.start()
    try:
        uvicorn.run(app, host=settings.host, port=settings.port, **options)
    finally:
        if tls is not None:
            tls.stop()
    return 0
