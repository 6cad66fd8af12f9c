#!/usr/bin/env bash
# Installs what the e2e suite's real nodes need (tests/e2e/realnode.py) from Debian's packages,
# when something is missing: containerd, runc, the CNI plugins (bridge, host-local, loopback)
# and a static busybox (the test images' only program). kubelet itself is built with the control
# plane (build-controlplane.sh). Does nothing when all are there; needs root to install.
set -euo pipefail
need=()
command -v containerd >/dev/null && command -v ctr >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
for p in bridge host-local loopback; do
    [[ -x /usr/lib/cni/$p ]] || { need+=(containernetworking-plugins); break; }
done
# busybox-static, not busybox: the test images hold no libc.
dpkg-query -W -f '${Status}' busybox-static 2>/dev/null | grep -q "ok installed" || need+=(busybox-static)
command -v unshare >/dev/null && command -v nsenter >/dev/null || need+=(util-linux)
command -v ip >/dev/null || need+=(iproute2)
[[ ${#need[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then  # the suite skips the real nodes without root, and says so
    echo "install-node: not root: no real nodes (they would need the Debian packages ${need[*]})" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "install-node: the real nodes need the Debian packages ${need[*]}; install them" >&2
    exit 2
fi
echo "install-node: installing ${need[*]} (Debian packages, for the real nodes)" >&2
start=$SECONDS
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
apt() {  # never waits for ever: on dpkg's lock at most a minute, each call ten at most
    timeout 600 apt-get -o DPkg::Lock::Timeout=60 "$@" >>"$log" 2>&1
}
had_containerd=$(command -v containerd || true)
if ! { apt install -y --no-install-recommends --no-remove "${need[@]}" \
        || { apt update && apt install -y --no-install-recommends --no-remove "${need[@]}"; }; }; then
    echo "install-node: apt-get failed; its last lines:" >&2
    tail -n 20 "$log" >&2
    exit 1
fi
rm -f "$log"
# The real nodes start containerd of their own: the host's service, if the package started one,
# is stopped and left disabled (a host that had containerd keeps it as it was).
if [[ -z $had_containerd ]] && command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
    systemctl disable --now containerd >/dev/null 2>&1 || true
fi
echo "install-node: installed in $((SECONDS - start)) s" >&2
