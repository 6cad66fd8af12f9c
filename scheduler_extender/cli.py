"""Command line: ``gpu-sched-extender`` / ``python -m scheduler_extender``.

Flags win over ``EDGEGPU_*`` environment variables; every configuration error is printed at
once and the process exits with status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from scheduler_extender import __version__
from scheduler_extender.config import ExtenderSettings, load_policy
from scheduler_extender.errors import PolicyError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-sched-extender", description="GPU-aware kube-scheduler extender."
    )
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8888)")
    p.add_argument("--policy", type=Path, dest="policy_file", help="GPUSchedulingPolicy file")
    p.add_argument("--path-prefix", help="path part of the scheduler's urlPrefix")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--check-policy", action="store_true", help="validate the policy and exit")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse flags, validate everything, serve."""
    ns = _parser().parse_args(argv)
    overrides: dict[str, Any] = {
        k: v for k, v in vars(ns).items() if v is not None and k != "check_policy"
    }
    try:
        settings = ExtenderSettings(**overrides)
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

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    app = create_app(
        settings,
        policy=policy,
        policy_source=str(settings.policy_file) if settings.policy_file else "defaults",
    )
    # uvloop and httptools when present: the scheduler waits on every call we answer.
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        server_header=False,
    )
    return 0
