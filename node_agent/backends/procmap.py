"""Map a process id to the Kubernetes pod (and container) it runs in, from its cgroup.

Needs the host's /proc (hostPID in the DaemonSet). Handles cgroup v1 and v2 paths of the
systemd and cgroupfs drivers, containerd and CRI-O. Imports only the standard library.
"""

from __future__ import annotations

import re
from pathlib import Path

# .../kubepods/burstable/pod1b2c.../<container id>      (cgroupfs)
# .../kubepods-burstable-pod1b2c_....slice/cri-containerd-<id>.scope  (systemd: '-' → '_')
_POD = re.compile(
    r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})"
)
_CONTAINER = re.compile(
    r"(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$"
)


def pod_of_pid(pid: int, proc_root: Path = Path("/proc")) -> tuple[str | None, str | None]:
    """(pod uid, container id) of a process, or (None, None) when it is not in a pod."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None, None
    for line in text.splitlines():
        path = line.rsplit(":", 1)[-1]
        match = _POD.search(path)
        if match:
            uid = match.group(1).replace("_", "-")
            container = _CONTAINER.search(path.rstrip("/"))
            return uid, container.group(1) if container else None
    return None, None
