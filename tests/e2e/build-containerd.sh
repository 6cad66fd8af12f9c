#!/usr/bin/env bash
# Builds containerd 2 (containerd, ctr, containerd-shim-runc-v2) from the Go module proxy once,
# into ${EDGEGPU_E2E_CACHE:-~/.cache/edgegpu-e2e}/containerd-<version>/, and prints that folder.
# One real node of the e2e suite runs it instead of Debian's containerd 1.6: containerd 2 reads
# CDI specs, so a DRA claim's container gets the GPU's environment from the driver's spec.
# EDGEGPU_E2E_CONTAINERD, when set, names a folder holding those three programs: nothing is built.
set -euo pipefail
version=v2.4.2
if [[ -n "${EDGEGPU_E2E_CONTAINERD:-}" ]]; then
    for c in containerd ctr containerd-shim-runc-v2; do
        [[ -x "$EDGEGPU_E2E_CONTAINERD/$c" ]] || { echo "EDGEGPU_E2E_CONTAINERD: no executable $EDGEGPU_E2E_CONTAINERD/$c" >&2; exit 2; }
    done
    echo "$EDGEGPU_E2E_CONTAINERD"
    exit 0
fi
out="${EDGEGPU_E2E_CACHE:-$HOME/.cache/edgegpu-e2e}/containerd-$version"
if [[ ! -x "$out/containerd" || ! -x "$out/ctr" || ! -x "$out/containerd-shim-runc-v2" ]]; then
    command -v go >/dev/null || { echo "build-containerd: Go is not installed" >&2; exit 2; }
    echo "build-containerd: building containerd $version into $out (about 2 minutes on 2 cores the first time)" >&2
    start=$SECONDS
    mkdir -p "$out"
    module=github.com/containerd/containerd/v2
    # The snapshotters the real nodes do not use are left out (overlayfs is theirs).
    GOBIN="$out" go install -tags no_btrfs,no_zfs,no_devmapper,no_aufs \
        "$module/cmd/containerd@$version" "$module/cmd/ctr@$version" \
        "$module/cmd/containerd-shim-runc-v2@$version"
    echo "build-containerd: built in $((SECONDS - start)) s" >&2
fi
echo "$out"
