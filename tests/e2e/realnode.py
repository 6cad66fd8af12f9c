"""A real Kubernetes node on this machine: the real kubelet, containerd and Debian's runc.

The container runtime is Debian's containerd 1.6, or containerd 2 built from its Go module
(``runtime``; ``build-containerd.sh``), which reads CDI specs: the suite runs one node of each.

Each node lives in mount and PID namespaces of its own (``unshare``), as a host of its own
would: its containerd and its kubelet run inside them, with the node's own ``/run``,
``/var/log`` and ``/var/lib`` (tmpfs; ``/var/lib/kubelet`` is a folder of the run's,
bind-mounted: kubelet's device-plugin folder is fixed at ``/var/lib/kubelet/device-plugins``).
Nothing is made on the host's disk outside the run's folder. The network is the machine's; each
node has a bridge of its own, made before kubelet starts with the first address of the node's
/24, which is the node's InternalIP and where its kubelet listens (kubelet refuses a loopback
node IP). Pods get addresses on that bridge from the CNI bridge plugin. A lock per bridge keeps
two runs on one machine from taking the same one.

Images come from no registry: :func:`write_image` writes an OCI image (Debian's static busybox
as its only program) that ``ctr images import`` loads into the node's containerd, and pods
use ``imagePullPolicy: Never``; every pull from Docker Hub (the agent DaemonSet's image) is sent
to a closed local port. The namespaces' first process is the node: stopping it (or the harness
dying) ends every process of the node, containers included.

kubelet changes a few kernel settings of the host (``kernel.panic``, ``kernel.panic_on_oops``,
``vm.overcommit_memory``, ``vm.panic_on_oom``) and the bridge plugin turns on IPv4
forwarding: :func:`host_settings` reads them before the first node starts and
:func:`restore_host_settings` puts them back after the last one stops. kubelet's iptables
chains are turned off (``makeIPTablesUtilChains: false``).

What stays a double here: there is no GPU and no NVIDIA container toolkit, so a container gets
the device plugin's environment and no ``/dev/nvidia*``; the agent runs as a host process, not
as the DaemonSet's pod.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import yaml

from tests.e2e.controlplane import (
    NEW_EC_KEY,
    ClusterError,
    ControlPlane,
    Fatal,
    Process,
    build_binaries,
    free_port,
    kubeconfig_text,
    openssl,
    wait_until,
)

TAINT = "edgegpu.io/e2e-real-node"
"""The real nodes' NoSchedule taint: only pods made for them (image, toleration) go there."""
IMAGE = "edgegpu.test/busybox:1"
"""The image of the real nodes' test pods (``imagePullPolicy: Never``)."""
PAUSE_IMAGE = "edgegpu.test/pause:1"
"""The pod sandbox image containerd is configured with."""
DEVICES_TAKEN = '"Processed device updates for resource" resourceName="{resource}"'
"""What kubelet's device manager logs (``--v=2``) when it has taken a plugin's device list: the
registration was accepted and ``ListAndWatch`` answered."""

BUSYBOX = Path("/bin/busybox")
CNI_BIN = Path("/usr/lib/cni")
APPLETS = ("sh", "env", "sleep", "cat", "echo", "ls", "grep", "sort", "ps", "wc", "true")
"""busybox's programs linked into the image (``kubectl exec`` finds a shell)."""

NEEDED = {
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "ip": "iproute2",
}
"""The programs a real node needs, and the Debian package of each."""

KUBELET_DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
"""Where kubelet always looks for device plugins (not under its --root-dir)."""

NODE_INIT = r"""
import os, signal, subprocess, sys
root = sys.argv[1]
def mount(*args):
    subprocess.run(["mount", *args], check=True)
mount("--make-rprivate", "/")
mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", "/run")
mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", "/var/log")
mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", "/var/lib")
os.mkdir("/var/lib/kubelet")
mount("--bind", root + "/kubelet", "/var/lib/kubelet")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("node namespaces ready", flush=True)
while True:  # the namespaces' first process: it reaps the orphans (shims, containers)
    try:
        os.wait()
    except ChildProcessError:
        signal.pause()
"""
"""The node's first process: its mounts, then it reaps orphans until it is stopped."""


CONTAINERD2_SCRIPT = Path(__file__).resolve().parent / "build-containerd.sh"


def containerd2() -> Path:
    """The folder of containerd 2's programs: built once and cached (``build-containerd.sh``)."""
    return build_binaries(CONTAINERD2_SCRIPT)


def missing_programs() -> dict[str, str]:
    """What a real node lacks on this machine: program → the Debian package that has it."""
    missing = {p: pkg for p, pkg in NEEDED.items() if shutil.which(p) is None}
    if not _static_elf(BUSYBOX):
        missing[f"{BUSYBOX} (statically linked)"] = "busybox-static"
    for plugin in ("bridge", "host-local", "loopback"):
        if not (CNI_BIN / plugin).is_file():
            missing[str(CNI_BIN / plugin)] = "containernetworking-plugins"
    return missing


def _static_elf(path: Path) -> bool:
    """Whether ``path`` is a 64-bit ELF program with no interpreter (statically linked): the
    images have no libc for any other."""
    try:
        head = path.read_bytes()[:65536]
    except OSError:
        return False
    if head[:5] != b"\x7fELF\x02":
        return False
    order: Literal["little", "big"] = "little" if head[5] == 1 else "big"
    if int.from_bytes(head[18:20], order) != 62:  # EM_X86_64: the images say amd64
        return False
    phoff = int.from_bytes(head[32:40], order)
    size, count = int.from_bytes(head[54:56], order), int.from_bytes(head[56:58], order)
    for i in range(count):
        entry = head[phoff + i * size : phoff + i * size + 4]
        if len(entry) < 4:
            return False
        if int.from_bytes(entry, order) == 3:  # PT_INTERP: a dynamic loader is needed
            return False
    return True


HOST_SETTINGS = ("kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory",
                 "vm/panic_on_oom", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
                 "net/ipv4/ip_forward")  # fmt: skip
"""The host's kernel settings that kubelet changes (and forwarding, which a CNI plugin may turn
on). Saved and put back per run: two runs at once on one machine can leave kubelet's values."""


def host_settings() -> dict[str, str]:
    """The host's ``HOST_SETTINGS`` now (to put back after the run)."""
    saved = {}
    for name in HOST_SETTINGS:
        with contextlib.suppress(OSError):
            saved[name] = (Path("/proc/sys") / name).read_text().strip()
    return saved


def restore_host_settings(saved: Mapping[str, str]) -> None:
    """Put back the settings ``host_settings`` read."""
    for name, value in saved.items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / name).write_text(value + "\n")


def why_no_real_node() -> str | None:
    """Why real nodes cannot start here (None when they can)."""
    if os.geteuid() != 0:
        return "real nodes need root (kubelet, containerd and runc run as root)"
    missing = missing_programs()
    if missing:
        packages = " ".join(sorted(set(missing.values())))
        return (
            f"missing {', '.join(sorted(missing))}: tests/e2e/install-node.sh installs "
            f"the Debian packages {packages}"
        )
    return None


# -- images ----------------------------------------------------------------------------------------


def _blob(out: tarfile.TarFile, data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest[7:]}")
    info.size = len(data)
    out.addfile(info, io.BytesIO(data))
    return {"digest": digest, "size": len(data)}


def _layer() -> bytes:
    """busybox at /bin/busybox and its applets as links to it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for folder in ("bin", "tmp", "etc"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            layer.addfile(info)
        data = BUSYBOX.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(data), 0o755
        layer.addfile(info, io.BytesIO(data))
        for applet in APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            layer.addfile(info)
    return buf.getvalue()


def write_image(path: Path, name: str, entrypoint: list[str]) -> None:
    """An OCI image layout as a tar (what ``ctr images import`` takes), named ``name``."""
    layer = _layer()
    with tarfile.open(path, "w") as out:
        layer_desc = _blob(out, layer)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/bin"], "Entrypoint": entrypoint, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        }
        config_desc = _blob(out, json.dumps(config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_desc}],
        }
        manifest_desc = _blob(out, json.dumps(manifest).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **manifest_desc,
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                    },
                }
            ],
        }
        for member, doc in (("index.json", index), ("oci-layout", {"imageLayoutVersion": "1.0.0"})):
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(member)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))


def real_pod(pod: dict[str, Any], command: str) -> dict[str, Any]:
    """``pod`` (a GPU pod of the suite's) made to run on a real node: the imported image,
    ``imagePullPolicy: Never``, ``command`` run by its shell, the real nodes' taint tolerated."""
    (container,) = pod["spec"]["containers"]
    container.update(image=IMAGE, imagePullPolicy="Never", command=["/bin/sh", "-c", command])
    pod["spec"].setdefault("tolerations", []).append(
        {"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}
    )
    return pod


# -- one node --------------------------------------------------------------------------------------


@dataclass
class RealNode:
    """One node run by the real kubelet; ``start()`` returns once the Node is Ready."""

    cp: ControlPlane
    name: str
    index: int
    """Picks the node's bridge and pod subnet: the first at or above it that no other node on
    this machine holds (``start`` locks it)."""
    labels: dict[str, str] = field(default_factory=dict)
    runtime: Path | None = None
    """A folder of containerd 2 (``containerd``, ``ctr``, ``containerd-shim-runc-v2``:
    ``build-containerd.sh``) to run instead of Debian's containerd 1.6; it reads CDI specs."""
    init: Process | None = None
    containerd: Process | None = None
    kubelet: Process | None = None
    lock: IO[bytes] | None = None

    @property
    def root(self) -> Path:
        """The node's folder: containerd's root and state, kubelet's root, pod logs."""
        return self.cp.folder / "real-nodes" / self.name

    @property
    def kubelet_dir(self) -> Path:
        """kubelet's root folder, seen from the host (``/var/lib/kubelet`` in the node)."""
        return self.root / "kubelet"

    @property
    def device_plugins(self) -> Path:
        """kubelet's device-plugin folder, seen from the host."""
        return self.kubelet_dir / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        """kubelet's PodResources socket, seen from the host."""
        return self.kubelet_dir / "pod-resources" / "kubelet.sock"

    @property
    def containerd_socket(self) -> Path:
        """The node's containerd socket."""
        return self.root / "containerd.sock"

    @property
    def ip(self) -> str:
        """The node's InternalIP: its bridge's address."""
        return f"10.217.{self.index}.1"

    @property
    def bridge(self) -> str:
        """The node's CNI bridge."""
        return f"egpu-e2e-{self.index}"

    # -- start ---------------------------------------------------------------------------------
    def start(self, timeout_s: float = 180.0) -> None:
        """Namespaces, containerd with the images, kubelet; until the Node is Ready."""
        why = why_no_real_node()
        if why:
            raise ClusterError(f"real node {self.name}: {why}")
        for sub in ("kubelet/device-plugins", "kubelet/pod-resources", "containerd", "cni",
                    "pod-logs", "images", "certs.d/docker.io"):  # fmt: skip
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._take_bridge()
        self._write_pki()
        self._make_bridge()
        self._write_containerd_config()
        self._write_kubelet_config()
        self.init = self.cp.spawn(
            f"{self.name}-node",
            ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child",
             "python3", "-c", NODE_INIT, str(self.root)],
        )  # fmt: skip
        wait_until(f"real node {self.name}: its namespaces", self._namespaces_ready, 20.0)
        program = str(self.runtime / "containerd") if self.runtime else "containerd"
        self.containerd = self.cp.spawn(
            f"{self.name}-containerd",
            self._inside(program, "--config", str(self.root / "containerd.toml")),
            # containerd 2 finds its own shim on PATH first.
            env={"PATH": f"{self.runtime}:{os.environ.get('PATH', os.defpath)}"}
            if self.runtime
            else None,
        )
        wait_until(f"real node {self.name}: containerd", self._containerd_ready, 60.0, 0.5)
        self._import_images()
        self.kubelet = self.cp.spawn(f"{self.name}-kubelet", self._kubelet_argv())
        wait_until(f"real node {self.name}: Node Ready", self.ready, timeout_s, 1.0)

    def _take_bridge(self) -> None:
        """Lock the first free bridge index at or above ``index`` (a run on this machine that
        holds one keeps it until its node stops, or until it dies)."""
        folder = Path("/run/lock") if Path("/run/lock").is_dir() else Path("/tmp")
        for index in range(self.index, 250):
            if _routed(f"10.217.{index}.1/24"):
                continue  # a network of this machine's: the bridge would take it over
            try:  # never a file someone else made there, nor one a link points to
                fd = os.open(folder / f"edgegpu-e2e-bridge-{index}.lock",
                             os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)  # fmt: skip
            except OSError:
                continue
            handle = os.fdopen(fd, "r+b")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                continue
            self.index, self.lock = index, handle
            return
        raise ClusterError(f"real node {self.name}: every bridge index from {self.index} is "
                           "held by another run, or 10.217.<i>.0/24 is routed here")  # fmt: skip

    def _make_bridge(self) -> None:
        # A bridge of this name is left by a run that died: the lock says none uses it now.
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        for args in (["link", "add", self.bridge, "type", "bridge"],
                     ["addr", "add", f"{self.ip}/24", "dev", self.bridge],
                     ["link", "set", self.bridge, "up"]):  # fmt: skip
            proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise ClusterError(f"real node {self.name}: ip {' '.join(args)}: {proc.stderr}")

    def _kubelet_argv(self) -> list[str]:
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        return self._inside(
            self.cp.binary("kubelet"), f"--config={self.root / 'kubelet.yaml'}",
            f"--kubeconfig={self.root / 'kubelet.kubeconfig'}", "--root-dir=/var/lib/kubelet",
            f"--hostname-override={self.name}", f"--node-ip={self.ip}",
            *([f"--node-labels={labels}"] if labels else []),
            f"--register-with-taints={TAINT}=true:NoSchedule", "--v=2",
        )  # fmt: skip

    def _inside(self, *argv: str) -> list[str]:
        """A command run in the node's namespaces: unshare's own mount namespace, and the PID
        namespace of its child (the node's first process)."""
        assert self.init is not None
        ns = f"/proc/{self.init.popen.pid}/ns"
        return ["nsenter", f"--mount={ns}/mnt", f"--pid={ns}/pid_for_children", "--", *argv]

    def _namespaces_ready(self) -> bool:
        self._check_alive()
        return "node namespaces ready" in self.init.log.read_text(errors="replace")  # type: ignore[union-attr]

    def _check_alive(self) -> None:
        for proc in (self.init, self.containerd, self.kubelet):
            if proc is not None and not proc.alive():
                raise Fatal(f"real node {self.name}: {proc.name} exited:\n{proc.tail()}")

    def ctr(self, *args: str, timeout_s: float = 60.0) -> str:
        """Run ``ctr`` on the node's containerd (namespace k8s.io, kubelet's)."""
        proc = subprocess.run(
            [str(self.runtime / "ctr") if self.runtime else "ctr",
             f"--address={self.containerd_socket}", "--namespace=k8s.io", *args],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise ClusterError(f"real node {self.name}: ctr {' '.join(args)}: {proc.stderr}")
        return proc.stdout

    def _containerd_ready(self) -> bool:
        self._check_alive()
        return self.containerd_socket.exists() and bool(self.ctr("version", timeout_s=5.0))

    def _import_images(self) -> None:
        for name, entrypoint in ((IMAGE, ["/bin/sh"]), (PAUSE_IMAGE, ["/bin/sleep", "2147483647"])):
            tar = self.root / "images" / (name.replace("/", "_").replace(":", "_") + ".tar")
            write_image(tar, name, entrypoint)
            self.ctr("images", "import", "--no-unpack=false", str(tar))
        listed = self.ctr("images", "ls", "-q")
        for name in (IMAGE, PAUSE_IMAGE):
            if name not in listed.split():
                raise ClusterError(f"real node {self.name}: {name} not in containerd: {listed}")

    def node(self) -> dict[str, Any] | None:
        """The Node object."""
        return self.cp.get(f"/api/v1/nodes/{self.name}")

    def ready(self) -> bool:
        """Whether the Node says Ready=True (raises when a part of the node exited; a
        ClusterError that names the Ready condition's message when it is not Ready)."""
        self._check_alive()
        node = self.node()
        conditions = ((node or {}).get("status") or {}).get("conditions") or []
        ready = next((c for c in conditions if c["type"] == "Ready"), None)
        if ready is not None and ready["status"] != "True":
            raise ClusterError(f"Node {self.name} not Ready: {ready.get('message')}")
        return ready is not None

    # -- configuration -------------------------------------------------------------------------
    def _write_pki(self) -> None:
        """The kubelet's client certificate: system:node:<name> in system:nodes (the Node
        authorizer and NodeRestriction apply to it)."""
        pki = self.cp.folder / "pki"
        key, csr, crt = (self.root / f"kubelet-client.{x}" for x in ("key", "csr", "crt"))
        openssl("req", "-new", *NEW_EC_KEY, "-keyout", str(key), "-out", str(csr),
                "-subj", f"/O=system:nodes/CN=system:node:{self.name}")  # fmt: skip
        openssl("x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey",
                str(pki / "ca.key"), "-CAcreateserial", "-days", "7", "-out", str(crt))  # fmt: skip
        (self.root / "kubelet.kubeconfig").write_text(kubeconfig_text(
            self.cp.server, self.cp.ca, None, f"system:node:{self.name}", cert=(crt, key)
        ))  # fmt: skip

    @property
    def cdi_dir(self) -> Path:
        """Where containerd 2 reads CDI specs (``runtime`` nodes; a DRA driver writes them)."""
        return self.root / "cdi"

    def _write_containerd_config(self) -> None:
        if self.runtime is not None:
            self._write_containerd2_config()
            return
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        (self.root / "containerd.toml").write_text(f"""\
{self._containerd_head(2, ["aufs", "btrfs", "zfs", "devmapper"], [])}[plugins."io.containerd.internal.v1.opt"]
  path = "{self.root / "containerd" / "opt"}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  # This machine's sandbox cannot lower oom_score_adj: without this runc fails at start.
  restrict_oom_score_adj = true
[{cri}.registry]
  config_path = "{self.root / "certs.d"}"
[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{self.root / "cni"}"
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
""")
        self._write_network_config()

    def _containerd_head(self, version: int, snapshotters: list[str], plugins: list[str]) -> str:
        """The start of either containerd's configuration: where it keeps its data and listens,
        and the plugins it does not load (snapshotters the nodes do not use, tracing)."""
        off = [f"io.containerd.snapshotter.v1.{s}" for s in snapshotters]
        off += ["io.containerd.tracing.processor.v1.otlp", *plugins]
        return f"""\
version = {version}
root = "{self.root / "containerd" / "root"}"
state = "{self.root / "containerd" / "state"}"
disabled_plugins = {json.dumps(off)}
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{self.root / "containerd-ttrpc.sock"}"
[debug]
  address = ""
[metrics]
  address = ""
"""

    def _write_containerd2_config(self) -> None:
        """containerd 2's configuration (version 3: the CRI plugin split in images, runtime
        and server), with the same settings as 1.6's, and CDI specs read from ``cdi_dir``."""
        images, runtime = (
            "plugins.'io.containerd.cri.v1.images'",
            "plugins.'io.containerd.cri.v1.runtime'",
        )
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        (self.root / "containerd.toml").write_text(f"""\
{self._containerd_head(3, ["btrfs", "zfs", "devmapper"], ["io.containerd.nri.v1.nri"])}[plugins.'io.containerd.internal.v1.opt']
  path = "{self.root / "containerd" / "opt"}"
[{images}]
  snapshotter = "overlayfs"
[{images}.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
[{images}.registry]
  config_path = "{self.root / "certs.d"}"
[{runtime}]
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["{self.cdi_dir}"]
[{runtime}.cni]
  bin_dirs = ["{CNI_BIN}"]
  conf_dir = "{self.root / "cni"}"
[{runtime}.containerd]
  default_runtime_name = "runc"
[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{runtime}.containerd.runtimes.runc.options]
  SystemdCgroup = false
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
""")
        self._write_network_config()

    def _write_network_config(self) -> None:
        # The agent DaemonSet's image is on Docker Hub: its pod on a real node never pulls it
        # (the agent runs as a host process), whatever this machine can reach.
        # (containerd 1.6 ignores a hosts.toml without a host tree, and asks Docker Hub.)
        (self.root / "certs.d" / "docker.io" / "hosts.toml").write_text(
            'server = "http://127.0.0.1:9"\n\n[host."http://127.0.0.1:9"]\n'
            '  capabilities = ["pull", "resolve"]\n'
        )
        (self.root / "cni" / "10-edgegpu-e2e.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0",
            "name": f"edgegpu-e2e-{self.index}",
            "plugins": [{
                # No gateway: the pods need no way out, and the host's forwarding stays off.
                "type": "bridge", "bridge": self.bridge, "isGateway": False, "ipMasq": False,
                "ipam": {"type": "host-local", "dataDir": str(self.root / "cni-ipam"),
                         "ranges": [[{"subnet": f"10.217.{self.index}.0/24"}]]},
            }],
        }, indent=1))  # fmt: skip

    def _write_kubelet_config(self) -> None:
        self.port, self.healthz_port = free_port(), free_port()
        (self.root / "kubelet.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.ip,
            "port": self.port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            # The API server's requests (logs, exec) come with its kubelet client certificate.
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cp.ca)}},
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            # What runs on this kernel (cgroup v1 hierarchies) without systemd.
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "podLogsDir": str(self.root / "pod-logs"),
            # The imported images are the only ones: never collect them, whatever the disk.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "maxPods": 30,
            "nodeStatusUpdateFrequency": "5s",
            "serializeImagePulls": False,
            # The pods need no DNS; the host's resolv.conf may point into its /run.
            "resolvConf": str(self.root / "resolv.conf"),
            "makeIPTablesUtilChains": False,
        }))  # fmt: skip
        (self.root / "resolv.conf").write_text("nameserver 127.0.0.1\n")

    # -- what the suite reads and does ---------------------------------------------------------
    def tasks(self) -> list[str]:
        """The containers running on the node (containerd's task list)."""
        return self.ctr("tasks", "ls", "-q").split()

    def device_lists(self, resource: str, healthy: int) -> int:
        """How many device lists of ``resource`` with ``healthy`` healthy devices kubelet has
        taken from a plugin (every kubelet of this node's run)."""
        assert self.kubelet is not None
        mark = DEVICES_TAKEN.format(resource=resource)
        lines = self.kubelet.log.read_text(errors="replace").splitlines()
        count = f"healthyCount={healthy}"
        return sum(mark in line and line.rstrip().endswith(count) for line in lines)

    def restart_kubelet(self) -> None:
        """Stop kubelet (SIGTERM; its containers keep running under containerd) and start it
        again with the same configuration and root folder."""
        assert self.kubelet is not None
        _stop_group(self.kubelet)
        self.cp.retire(self.kubelet)
        self.kubelet = self.cp.spawn(f"{self.name}-kubelet", self._kubelet_argv())

    # -- stop ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """kubelet, then containerd, then the namespaces (every container with them); the
        bridge is removed and the Node deleted."""
        containers: list[str] = []
        if self.containerd is not None and self.containerd.alive():
            with contextlib.suppress(Exception):
                containers = self.ctr("containers", "ls", "-q", timeout_s=10.0).split()
        for proc in (self.kubelet, self.containerd, self.init):
            if proc is not None:
                _stop_group(proc)  # unshare ignores SIGTERM: its group's first process does not
        for proc in (self.kubelet, self.containerd, self.init):
            if proc is not None and proc in self.cp.processes:
                self.cp.processes.remove(proc)
        self.kubelet = self.containerd = self.init = None
        if self.lock is not None:  # a bridge of that index is ours only while we hold its lock
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        _remove_cgroups(containers)
        with contextlib.suppress(Exception):
            self.cp.request("DELETE", f"/api/v1/nodes/{self.name}")
        if self.lock is not None:
            self.lock.close()
            self.lock = None


def _routed(network: str) -> bool:
    """Whether a route of this machine overlaps ``network``.

    Any table; the default route and the real nodes' own bridges aside.
    """
    out = subprocess.run(["ip", "-j", "route", "show", "table", "all"], capture_output=True,
                         text=True, check=False).stdout  # fmt: skip
    wanted = ipaddress.ip_network(network, strict=False)
    for route in json.loads(out or "[]"):
        dst = route.get("dst", "")
        if route.get("type", "unicast") not in ("unicast", "local") or dst in ("default", ""):
            continue
        if str(route.get("dev", "")).startswith("egpu-e2e-"):
            continue  # a real node's bridge: its lock says whether a run holds it
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False)
            if net.version == 4 and net.overlaps(wanted):
                return True
    return False


def _remove_cgroups(containers: list[str]) -> None:
    """The cgroups runc made for ``containers`` (empty once the node's processes are gone), and
    containerd's parent ``k8s.io`` where nothing else uses it; a cgroup in use stays."""
    root = Path("/sys/fs/cgroup")
    for hierarchy in (root, *(p for p in root.iterdir() if p.is_dir())):  # v2, then v1's
        parent = hierarchy / "k8s.io"
        for cid in containers:
            with contextlib.suppress(OSError):
                (parent / cid).rmdir()
        with contextlib.suppress(OSError):
            parent.rmdir()


def _stop_group(proc: Process, timeout_s: float = 15.0) -> None:
    """SIGTERM to the process's group (nsenter and what it runs), SIGKILL after ``timeout_s``."""
    if proc.popen.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.popen.pid, signal.SIGTERM)
    try:
        proc.popen.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait()
