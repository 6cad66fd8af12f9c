"""Agent settings: flags, ``EDGEGPU_AGENT_*`` variables, and ``NODE_NAME`` from the downward API.

Validated once at start-up; every error is listed at once (exit status 2).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from node_agent.backends.selftest import DEFAULT_TOOL_DIRS
from node_agent.backends.simulated import SCENARIOS
from node_agent.model import DEFAULT_BLOCK_MIB, MAX_BLOCK_MIB, MIN_BLOCK_MIB
from node_agent.protection.health import DEFAULT_FATAL_XIDS
from node_agent.protection.reboot import DEFAULT_SENTINEL, WITHDRAW_AFTER_ROUNDS
from scheduler_extender.telemetry.schema import Labels

_DNS_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
"""A host name as a certificate names it: dot-separated labels of at most 63 characters."""


class AgentSettings(BaseSettings):
    """Everything the agent is configured with."""

    model_config = SettingsConfigDict(env_prefix="EDGEGPU_AGENT_", extra="forbid", frozen=True)

    backend: str = Field("nvml", description="nvml | amd | intel | simulated | jetson")
    node_name: str = Field(
        min_length=1,
        description="This node's name; else $NODE_NAME (the downward API in the DaemonSet).",
    )
    extender_urls: list[str] = Field(
        default_factory=list, description="Every extender replica to push to (empty = do not push)."
    )
    ca_file: Path | None = Field(
        None,
        description="CA bundle that signed the extender's certificate (https URLs; the "
        "certificate is always checked, and must name the URL's host or --tls-server-name). "
        "While it cannot be read no https push is made, and it is read again at every push; "
        "unset = the public CAs (certifi's bundle, or $SSL_CERT_FILE).",
    )
    tls_server_name: str | None = Field(
        None,
        description="The name every extender's certificate must hold (and the TLS server "
        "name sent), whatever host the URL names: an extender reached by a NodePort or "
        "LoadBalancer address, e.g. edgegpu-extender.<namespace>.svc; unset = the URL's host.",
    )
    resolve_all: bool = Field(
        False, description="Push to every address the URLs' hosts resolve to (headless Service)."
    )
    interval_s: float = Field(5.0, gt=0, le=3600, description="Seconds between samples (5 s).")
    metrics_port: int = Field(9400, ge=0, le=65535, description="Prometheus port; 0 = off.")
    dcgm_names: bool = Field(
        False,
        description="Export the readings under dcgm-exporter's names too (DCGM_FI_DEV_GPU_TEMP, "
        "DCGM_FI_DEV_POWER_USAGE, DCGM_FI_DEV_FB_USED, ...; labels gpu, UUID, modelName, "
        "Hostname), so NVIDIA's dashboards and alerts work unchanged.",
    )
    metrics_host: str = Field("0.0.0.0", description="Address the metrics server listens on.")
    dry_run: bool = Field(False, description="Plan power changes but apply none.")
    power_control: bool = Field(True, description="Allow the agent to change power limits/clocks.")
    token_file: Path | None = Field(
        None, description="ServiceAccount token sent as a bearer token."
    )
    labels: Labels = Field(
        default_factory=dict,
        description="Node labels sent with reports (checked as the telemetry schema checks them).",
    )
    device_plugin: bool = Field(
        False,
        description="Serve kubelet's device plugin for edgegpu.io/gpu-mem-block (the container "
        "gets the GPU chosen at bind).",
    )
    dra: bool = Field(
        False,
        description="Serve kubelet's DRA plugin for the driver gpu.edgegpu.io (Kubernetes 1.36; "
        "docs/dra.md): the extender publishes this node's GPUs as ResourceSlices once kubelet "
        "has taken the plugin, and each prepared claim gets a CDI spec.",
    )
    kubelet_registry_dir: Path = Field(
        Path("/var/lib/kubelet/plugins_registry"),
        description="kubelet's plugin registration folder: the DRA plugin's socket.",
    )
    cdi_dir: Path = Field(
        Path("/var/run/cdi"),
        description="Where the DRA plugin writes each prepared claim's CDI spec (the container "
        "runtime's CDI spec folder).",
    )
    kubelet_dir: Path = Field(
        Path("/var/lib/kubelet/device-plugins"),
        description="kubelet's device-plugins folder (its kubelet.sock and our socket).",
    )
    pod_resources_socket: Path | None = Field(
        Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        description="kubelet's PodResources API: which containers hold blocks already (after "
        "an agent restart), and which GPU's blocks each pod holds (asked once a round, reported "
        "as holders); unset = not asked.",
    )
    block_mib: int | None = Field(
        None,
        ge=MIN_BLOCK_MIB,
        le=MAX_BLOCK_MIB,
        description="MiB per memory block until an extender says its policy's, when the state "
        f"file does not hold the last it said; unset = the policy's default ({DEFAULT_BLOCK_MIB}).",
    )
    state_dir: Path | None = Field(
        Path("/var/lib/edgegpu"),
        description="Folder of what the device plugin keeps across restarts (the block size the "
        "extender last said; a hostPath in the DaemonSet); unset = nothing kept.",
    )
    reboot_sentinel: Path | None = Field(
        DEFAULT_SENTINEL,
        description="Our own file, written when the extender decides the node must reboot and "
        f"withdrawn after {WITHDRAW_AFTER_ROUNDS} rounds in which every extender answered "
        "without asking; point kured's --reboot-sentinel here. Its folder must exist (a hostPath "
        "in the DaemonSet); unset = only logged.",
    )
    maintenance_steps: Path | None = Field(
        Path("/etc/edgegpu/maintenance-steps.yaml"),
        description="The allow-list of maintenance steps a GPUMaintenance may ask this node to "
        "run (YAML: steps: {name: {command: [...], timeout: 1h, reboot: false}}; docs/"
        "maintenance.md), read at every ask; no file = no step allowed.",
    )
    # Policy (the same values as the GPUSchedulingPolicy; flags so the agent runs offline). The
    # extender's policy may make local protection stricter than these, never looser.
    max_temp_c: float = Field(
        85.0,
        gt=0,
        le=150,
        description="°C: thermal protection starts here (the extender's policy may lower it, "
        "not raise it).",
    )
    cool_down_s: float = Field(
        300.0,
        ge=0,
        description="How long a GPU must stay under maxTemp before a thermal step is given "
        "back while it reads within 5 °C of maxTemp, and after a step given back brought it to "
        "maxTemp again (the extender's policy may lengthen it, not shorten it).",
    )
    power_saving: bool = Field(
        True,
        description="Lower clocks of idle GPUs (the extender's policy may turn it on, not off).",
    )
    power_saving_threshold_pct: float = Field(
        70.0,
        ge=0,
        le=100,
        description="% utilisation below which a GPU counts as idle, so power saving engages "
        "(the extender's policy may raise it, not lower it, while power saving is on).",
    )
    accept_looser_policy: bool = Field(
        False,
        description="Follow the extender's policy even where it is looser than the four "
        "settings above (a higher maxTemp, a shorter cool-down, power saving off, a lower "
        "threshold); off = held at these settings, counted in "
        'edgegpu_agent_answer_fields_ignored_total{reason="looser"}.',
    )
    power_saving_window_s: float = Field(60.0, ge=0, description="Idle this long → save power.")
    saving_clock_mhz: float = Field(800.0, gt=0, description="SM clock while saving (seed: 800).")
    fatal_xids: list[int] = Field(
        default_factory=list,
        description="Replace the fatal XID list "
        f"(default {','.join(map(str, sorted(DEFAULT_FATAL_XIDS)))}).",
    )
    # Simulated backend.
    gpus: int = Field(4, ge=1, le=64, description="Simulated GPUs.")
    seed: int = Field(0, description="Simulation seed.")
    scenario: str = Field("steady", description=f"Simulation scenario: {', '.join(SCENARIOS)}.")
    scenario_after_s: float = Field(20.0, ge=0, description="When the scenario's fault starts.")
    load_pct: float | None = Field(None, ge=0, le=100, description="Fixed simulated load.")
    model: str | None = Field(None, description="Simulated GPU model.")
    pod_processes: Path | None = Field(
        None,
        description="Simulated pods' GPU processes: a JSON file, GPU index → "
        '[{"pod_uid", "used_mib"}], read at every sample.',
    )
    # NVML backend.
    proc_root: Path = Field(Path("/proc"), description="Host /proc (hostPID) for pod mapping.")
    dev_root: Path = Field(Path("/dev"), description="Where the /dev/nvidia* nodes are.")
    device_plugin_socket: Path | None = Field(
        None, description="Device plugin socket to check (pod-level health); unset = not checked."
    )
    cuda_probe_interval_s: float = Field(
        60.0, ge=0, description="Seconds between CUDA context probes; 0 = off."
    )
    # The self-test (the fault loop's and a maintenance's validation).
    diag_path: list[Path] = Field(
        list(DEFAULT_TOOL_DIRS),
        description="Folders searched before PATH for the self-test's programs (deviceQuery, "
        "vectorAdd, bandwidthTest, p2pBandwidthLatencyTest; rvs, rocm-bandwidth-test).",
    )
    bandwidth_drop_pct: float = Field(
        20.0,
        ge=0,
        lt=100,
        description="A self-test bandwidth (GB/s) more than this % below the same check's at "
        "this node's last passing self-test fails it (kept in --state-dir); 0 = not compared.",
    )
    # Jetson backend.
    sysfs_root: Path = Field(Path("/"), description="Root of sysfs/procfs for the Jetson backend.")

    @model_validator(mode="before")
    @classmethod
    def _node_name_from_downward_api(cls, data: object) -> object:
        if isinstance(data, dict) and not data.get("node_name") and os.environ.get("NODE_NAME"):
            return {**data, "node_name": os.environ["NODE_NAME"]}
        return data

    @model_validator(mode="after")
    def _one_dialect(self) -> AgentSettings:
        if self.dra and self.device_plugin:
            raise ValueError(
                "dra and device_plugin are exclusive: both would give the same GPU memory to "
                "two pods; a node serves one dialect"
            )
        return self

    @field_validator("tls_server_name")
    @classmethod
    def _server_name(cls, name: str | None) -> str | None:
        if name is not None and not _DNS_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a DNS name")
        return name

    @field_validator("extender_urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL")
        return urls
