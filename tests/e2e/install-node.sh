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
[[ -x /bin/busybox ]] && /bin/busybox --list >/dev/null 2>&1 || need+=(busybox-static)
command -v unshare >/dev/null && command -v nsenter >/dev/null || need+=(util-linux)
command -v ip >/dev/null || need+=(iproute2)
[[ ${#need[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    echo "install-node: the real nodes need the Debian packages ${need[*]}; install them as root" >&2
    exit 2
fi
echo "install-node: installing ${need[*]} (Debian packages, for the real nodes)" >&2
start=$SECONDS
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${need[@]}" >/dev/null \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; }
echo "install-node: installed in $((SECONDS - start)) s" >&2
