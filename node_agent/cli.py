"""Command line: ``gpu-node-agent`` / ``python -m node_agent``.

A backend that cannot open exits with status 2 and one line saying why and what to do; an
extender that cannot be reached safely stops the pushes only, never local protection.
SIGTERM and SIGINT stop the loop cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import signal
import ssl
import sys
import time
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, start_http_server

from node_agent import __version__
from node_agent.backends import load_backend
from node_agent.backends.base import GpuBackend
from node_agent.backends.cuda_probe import CudaProbe
from node_agent.config import AgentSettings
from node_agent.deviceplugin.plugin import RESOURCE, SETTLE_S, BlockPlugin
from node_agent.deviceplugin.podresources import holders, pod_devices
from node_agent.deviceplugin.server import DevicePluginServer
from node_agent.deviceplugin.state import StateFile
from node_agent.dra.health import DeviceHealth
from node_agent.dra.plugin import DraPlugin
from node_agent.dra.server import DraServer
from node_agent.errors import BackendUnavailable
from node_agent.loop import Agent
from node_agent.protection import health, power
from node_agent.protection.baseline import Baseline
from node_agent.protection.maintenance import StepRunner
from node_agent.telemetry.exporter import AgentMetrics
from node_agent.telemetry.report import host_boot_id
from node_agent.uplink.pusher import FlappingLinkTransport, Pusher
from node_agent.uplink.trust import ExtenderCa
from scheduler_extender import logs
from scheduler_extender.cli.flags import SettingsCli

log = logging.getLogger("node_agent")


def command_line() -> SettingsCli[AgentSettings]:
    """The agent's flags: one per setting, plus its own actions."""
    cli = SettingsCli(
        AgentSettings,
        prog="gpu-node-agent",
        description="edgegpu node agent. Every setting is also read from EDGEGPU_AGENT_<NAME> "
        "(the node name from NODE_NAME); a flag wins over its variable.",
        env_prefix="EDGEGPU_AGENT_",
    )
    cli.flag("--once", action="store_true", help="one round, then exit")
    cli.flag("--print", action="store_true", dest="print_report", help="print the report JSON")
    cli.flag(
        "--self-test",
        action="store_true",
        help="run the backend's GPU self-test and regression suite (NVIDIA: NVML, nvidia-smi, "
        "dcgmi diag, the CUDA samples, a CUDA context; AMD: amdsmi, amd-smi, rvs, "
        "rocm-bandwidth-test; Intel: xpu-smi diag), print its verdict as JSON and exit",
    )
    cli.flag(
        "--self-test-level",
        type=int,
        choices=[1, 2, 3],
        default=1,
        help="with --self-test: 1 quick, 2 medium (bandwidths), 3 long (P2P, dcgmi diag -r 3)",
    )
    cli.flag("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    cli.flag("--version", action="version", version=f"%(prog)s {__version__}")
    return cli


def _backend(settings: AgentSettings) -> GpuBackend:
    options: dict[str, Any] = {}
    if settings.backend == "simulated":
        options = {
            "gpus": settings.gpus,
            "seed": settings.seed,
            "node": settings.node_name,
            "scenario": settings.scenario,
            "scenario_after_s": settings.scenario_after_s,
            "clock": time.monotonic,
            "load_pct": settings.load_pct,
            "model": settings.model,
            "pod_processes": settings.pod_processes,
        }
    elif settings.backend == "nvml":
        options = {
            "proc_root": settings.proc_root,
            "dev_root": settings.dev_root,
            "device_plugin_socket": settings.device_plugin_socket,
            "cuda_probe": CudaProbe() if settings.cuda_probe_interval_s > 0 else None,
            "probe_interval_s": settings.cuda_probe_interval_s or 60.0,
            "tool_dirs": settings.diag_path,
        }
    elif settings.backend == "jetson":
        options = {"root": settings.sysfs_root, "tool_dirs": settings.diag_path}
    elif settings.backend == "amd":
        options = {"proc_root": settings.proc_root, "tool_dirs": settings.diag_path}
    elif settings.backend == "intel":
        options = {"dev_root": settings.dev_root, "tool_dirs": settings.diag_path}
    return load_backend(settings.backend, **options)


def extender_ca(settings: AgentSettings) -> ExtenderCa | None:
    """The CA the extender's certificate is checked against on https; None: the public CAs.

    The file is read now; while it cannot be, that is logged once and no https push is made.
    """
    if settings.ca_file is None:
        return None
    ca = ExtenderCa(settings.ca_file)
    ca.ready()
    return ca


def extender_client(settings: AgentSettings, ca: ExtenderCa | None) -> httpx.AsyncClient:
    """The client of every push and assignments lookup: certificates always checked."""
    verify: ssl.SSLContext | bool = ca.context if ca is not None else True  # True: httpx's CAs
    transport: httpx.AsyncBaseTransport = httpx.AsyncHTTPTransport(retries=0, verify=verify)
    if settings.backend == "simulated" and settings.scenario == "flapping-link":
        transport = FlappingLinkTransport(transport, time.monotonic)
    return httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(5.0))


def extender_pusher(
    settings: AgentSettings, client: httpx.AsyncClient, ca: ExtenderCa | None
) -> Pusher | None:
    """The pushes to every extender URL configured; None when there is none."""
    if not settings.extender_urls:
        return None
    return Pusher(
        settings.extender_urls,
        client,
        clock=time.monotonic,
        token_file=settings.token_file,
        resolve_all=settings.resolve_all,
        ca=ca,
        server_name=settings.tls_server_name,
    )


async def _nobody() -> None:
    return None


async def _no_claims() -> None:
    return None


async def _run(
    settings: AgentSettings,
    ns: argparse.Namespace,
    backend: GpuBackend,
    ca: ExtenderCa | None,
) -> int:
    registry = CollectorRegistry()
    metrics = AgentMetrics(registry, settings.node_name, dcgm_names=settings.dcgm_names)
    if settings.metrics_port and not ns.once:
        start_http_server(settings.metrics_port, settings.metrics_host, registry=registry)
    async with extender_client(settings, ca) as client:
        pusher = extender_pusher(settings, client, ca)
        agent = Agent(
            backend,
            node=settings.node_name,
            interval_s=settings.interval_s,
            metrics=metrics,
            health_args=health.HealthArgs(
                fatal_xids=frozenset(settings.fatal_xids)
                if settings.fatal_xids
                else health.DEFAULT_FATAL_XIDS,
                max_temp_c=settings.max_temp_c,
            ),
            power_args=power.PowerArgs(
                max_temp_c=settings.max_temp_c,
                cool_down_s=settings.cool_down_s,
                saving_enabled=settings.power_saving,
                threshold_pct=settings.power_saving_threshold_pct,
                window_s=settings.power_saving_window_s,
                saving_clock_mhz=settings.saving_clock_mhz,
            ),
            pusher=pusher,
            dry_run=settings.dry_run,
            power_control=settings.power_control,
            labels=settings.labels,
            reboot_sentinel=settings.reboot_sentinel,
            steps=StepRunner(settings.maintenance_steps, settings.state_dir),
            baseline=Baseline(settings.state_dir, settings.bandwidth_drop_pct),
            block_mib=settings.block_mib,
            host_boot_id=host_boot_id(),
            accept_looser_policy=settings.accept_looser_policy,
            # The block size matters to the device plugin alone: kept only where it runs.
            state=StateFile(settings.state_dir, settings.node_name)
            if settings.state_dir is not None and settings.device_plugin and not ns.once
            else None,
        )
        plugin_server = None
        if settings.device_plugin and not ns.once:
            blocks = agent.blocks
            blocks.plugin = BlockPlugin(
                pusher.assignments(settings.node_name) if pusher is not None else _nobody,
                lambda: blocks.block_mib,
                held=holders(settings.pod_resources_socket, RESOURCE)
                if settings.pod_resources_socket
                else None,
                settle_s=SETTLE_S,
            )
            if settings.pod_resources_socket:
                blocks.pod_devices = pod_devices(
                    settings.pod_resources_socket, RESOURCE, quiet=True
                )
            plugin_server = DevicePluginServer(blocks.plugin, settings.kubelet_dir)
        dra_server = None
        if settings.dra and not ns.once:
            dra_server = DraServer(
                DraPlugin(
                    pusher.claims(settings.node_name) if pusher is not None else _no_claims,
                    settings.cdi_dir,
                    agent.blocks.device_nodes_of,
                    agent.blocks.gpu_uuids,
                ),
                settings.kubelet_registry_dir,
                health=DeviceHealth(
                    settings.node_name,
                    agent.blocks.device_health,
                    timeout_s=max(30, math.ceil(3 * settings.interval_s)),
                ),
            )
            server_now = dra_server
            agent.reporter.dra_registered = lambda: server_now.registered
        try:
            if ns.once:
                result = await agent.round()
                if ns.print_report:
                    print(result.report.model_dump_json(by_alias=True, indent=2))
                    for action in result.actions:
                        print(
                            f"# {action.action.kind} gpu {action.action.index}: {action.outcome}",
                            file=sys.stderr,
                        )
                pushed = result.push.results.values() if result.push is not None else []
                if pushed and not any(r in ("ok", "ignored") for r in pushed):
                    print("gpu-node-agent: the report reached no extender", file=sys.stderr)
                    return 1
                return 0
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            log.info(
                "agent on %s: backend %s, %d gpus, every %.1f s, pushing to %s%s",
                settings.node_name, backend.name, backend.device_count(), settings.interval_s,
                ", ".join(settings.extender_urls) or "nobody",
                " (dry run)" if settings.dry_run else "",
            )  # fmt: skip
            tasks = [asyncio.create_task(agent.run(stop))]
            if plugin_server is not None:
                tasks.append(asyncio.create_task(plugin_server.run(stop)))
            if dra_server is not None:
                tasks.append(asyncio.create_task(dra_server.run(stop)))
            await asyncio.gather(*tasks)
            log.info("stopping")
            return 0
        finally:
            agent.shutdown()


def _stop_self_test(signum: int, frame: object) -> None:
    """A signal during ``--self-test``: exit (the program running is killed on the way)."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, open the backend, run."""
    parsed = command_line().parse_or_report(argv, {"node_name": " (set --node-name or NODE_NAME)"})
    if parsed is None:
        return 2
    settings, ns = parsed
    logs.setup(ns.log_level, settings.node_name)
    plain = [u for u in settings.extender_urls if u.startswith("http://")]
    if plain and settings.token_file is not None:
        log.warning("pushing to %s over plain http: the token and the answers are not "
                    "protected (use https and --ca-file)", ", ".join(plain))  # fmt: skip
    try:
        backend = _backend(settings)
        backend.open()
    except BackendUnavailable as exc:
        print(f"gpu-node-agent: backend {settings.backend}: {exc}", file=sys.stderr)
        return 2
    if ns.self_test:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, _stop_self_test)
        try:
            verdict = backend.self_test(ns.self_test_level)
            gpus = [backend.read(i).uuid for i in range(backend.device_count())]
        finally:
            backend.close()
        try:
            verdict = Baseline(settings.state_dir, settings.bandwidth_drop_pct).judge(verdict, gpus)
        except Exception as exc:  # the verdict stands on its own
            print(f"gpu-node-agent: the last pass's figures not compared: {exc}", file=sys.stderr)
        verdict["node"] = settings.node_name
        print(json.dumps(verdict, indent=2))
        return 0 if verdict["verdict"] == "pass" else 1
    return asyncio.run(_run(settings, ns, backend, extender_ca(settings)))
