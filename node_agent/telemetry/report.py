"""The telemetry report an agent pushes (DESIGN.md §3), built from one sample.

Each report carries the agent's boot id and the next sequence number, and for each GPU how long
ago it was last hot. A reading the contract refuses is reported as null, a holder it refuses is
left out: one nonsense value never costs the node its report. Its readings are those of the
extender's field table, each under its name. Imports ``model`` and the extender's telemetry
schema and field table.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from node_agent import __version__
from node_agent.model import GpuHealth, GpuHolder, Snapshot
from scheduler_extender.domain import MAX_HOLDERS_PER_NODE
from scheduler_extender.telemetry.fields import REPORTED
from scheduler_extender.telemetry.schema import GpuReport, PodHolder, TelemetryReport

DEFAULT_HOT_THRESHOLD_C = 85.0
"""The GPU temperature counted as hot until an extender says its maxTemp."""

log = logging.getLogger("node_agent")


def host_boot_id(path: Path = Path("/proc/sys/kernel/random/boot_id")) -> str | None:
    """The host's boot id (the same inside a container), or None where there is none."""
    try:
        return path.read_text(encoding="ascii").strip()[:64] or None
    except (OSError, UnicodeDecodeError):
        return None


def _within_contract(gpu: dict[str, Any]) -> dict[str, Any] | None:
    """One GPU's report with the readings the contract refuses made null.

    NaN, infinite and out-of-range values are reported as readings the backend could not
    take; None when even that is not valid (an index or UUID). A driver that returns one
    nonsense value must not cost the node every other GPU's report.
    """
    for _ in range(8):
        try:
            GpuReport.model_validate(gpu)
        except ValidationError as exc:
            for error in exc.errors(include_url=False, include_input=False):
                if not error["loc"]:
                    return None  # the GPU as a whole, not one reading
                *parents, leaf = error["loc"]
                target: Any = gpu
                for key in parents:
                    target = target[key]
                if isinstance(target, dict) and target.get(leaf) is not None:
                    where = ".".join(map(str, error["loc"]))
                    log.warning(
                        "gpu %s: %s %r is not a valid reading; reported as null",
                        gpu.get("index"),
                        where,
                        target[leaf],
                    )
                    target[leaf] = None
                else:
                    return None
        else:
            return gpu
    return None


def _holders_within_contract(holders: list[GpuHolder] | None) -> list[dict[str, Any]] | None:
    """The holders the contract takes, at most ``MAX_HOLDERS_PER_NODE`` of them.

    One holder the contract refuses (a name kubelet should never have) is left out with a
    warning rather than cost the node its report.
    """
    if holders is None:
        return None
    out = []
    for h in holders:
        doc = {"namespace": h.namespace, "name": h.name, "gpu_uuid": h.gpu_uuid, "blocks": h.blocks}
        try:
            PodHolder.model_validate(doc)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False)
            )
            log.warning("holder %r of gpu %r left out of the report: %s",
                        f"{h.namespace}/{h.name}"[:300], h.gpu_uuid[:128], problems)  # fmt: skip
            continue
        out.append(doc)
    if len(out) > MAX_HOLDERS_PER_NODE:
        log.warning("%d holders of GPU blocks: only the first %d are reported",
                    len(out), MAX_HOLDERS_PER_NODE)  # fmt: skip
        out = out[:MAX_HOLDERS_PER_NODE]
    return out


class Reporter:
    """The reports of one agent: its boot id and sequence, and when each GPU was last hot."""

    def __init__(
        self,
        *,
        node: str,
        backend: str,
        interval_s: float,
        labels: dict[str, str],
        wall: Callable[[], float],
        host_boot_id: str | None,
    ) -> None:
        self.node = node
        self.backend = backend
        self.interval_s = interval_s
        self.labels = labels
        self.wall = wall
        self.host_boot_id = host_boot_id
        """The host's boot id, sent with every report (a new one: the node rebooted)."""
        self.boot_id = str(uuid.uuid4())
        self.seq = 0
        self.hot_threshold_c = DEFAULT_HOT_THRESHOLD_C
        """The extender's maxTemp, as its last answer said."""
        self.dra_registered: Callable[[], bool | None] = lambda: None
        """Whether kubelet accepted the agent's DRA plugin (None: it serves none)."""
        self._hot_at: dict[str, float] = {}
        """By GPU uuid: when it last read at or above ``hot_threshold_c`` (sample time)."""

    @property
    def boot(self) -> str:
        """The boot this agent reports: the host's, else its own (what a reboot ask names)."""
        return self.host_boot_id or self.boot_id

    def new_boot(self) -> None:
        """Start a new boot id, which resets the extenders' ordering of our reports."""
        self.boot_id, self.seq = str(uuid.uuid4()), 0

    def build(
        self,
        snap: Snapshot,
        healths: Mapping[int, GpuHealth],
        *,
        xid_last: Mapping[int, int | None],
        self_test: dict[str, str] | None,
        holders: list[GpuHolder] | None,
        maintenance: dict[str, Any] | None = None,
    ) -> TelemetryReport:
        """The telemetry push for a snapshot (DESIGN.md §3); the next in sequence.

        ``xid_last``: by GPU index, the last XID seen; ``self_test``: the verdict of the last
        self-test asked for; ``holders``: which pods hold which GPU's blocks (None: not known);
        ``maintenance``: the result of the last maintenance step asked for.
        """
        self.seq += 1
        gpus = []
        for r in snap.readings:
            if r.temperature_c is not None and r.temperature_c >= self.hot_threshold_c:
                self._hot_at[r.uuid] = snap.taken_at
            hot_at = self._hot_at.get(r.uuid)
            h = healths.get(r.index) or GpuHealth("healthy")
            gpus.append(
                {
                    "index": r.index,
                    "uuid": r.uuid,
                    "model": r.model,
                    "vendor": r.vendor,
                    "driver_version": r.driver_version,
                    "vbios_version": r.vbios_version,
                    "inforom_version": r.inforom_version,
                    "firmware_version": r.firmware_version,
                    **{f.name: getattr(r, f.name) for f in REPORTED},
                    "throttle_reasons": list(r.throttle_reasons),
                    "ecc_uncorrected": r.ecc_uncorrected,
                    "xid_last": xid_last.get(r.index),
                    "health": h.level,
                    "health_reasons": list(h.reasons),
                    "processes": [
                        {
                            "pid": p.pid,
                            "pod_uid": p.pod_uid,
                            "container": p.container,
                            "used_mib": p.used_mib,
                        }
                        for p in r.processes
                    ],
                    "hot_s_ago": None if hot_at is None else max(snap.taken_at - hot_at, 0.0),
                }
            )
        gpus = [g for g in (_within_contract(g) for g in gpus) if g is not None]
        c = snap.checks
        return TelemetryReport.model_validate(
            {
                "schema": "edgegpu.io/telemetry/v1",
                "node": self.node,
                "agent": {
                    "version": __version__,
                    "backend": self.backend,
                    "boot_id": self.boot_id,
                    "seq": self.seq,
                },
                "sampled_at": datetime.fromtimestamp(self.wall(), UTC),
                "interval_s": self.interval_s,
                "labels": self.labels,
                "node_health": {
                    "driver_ok": c.driver_ok,
                    "device_nodes_ok": c.device_nodes_ok,
                    "device_plugin_ok": c.device_plugin_ok,
                    "dra_plugin_registered": self.dra_registered(),
                    "cuda_ctx_success_ratio": c.cuda_ctx_success_ratio,
                },
                "gpus": gpus,
                "hot_threshold_c": self.hot_threshold_c,
                "self_test": self_test,
                "maintenance": maintenance,
                "host_boot_id": self.host_boot_id,
                "holders": _holders_within_contract(holders),
            }
        )
