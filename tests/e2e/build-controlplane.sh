#!/usr/bin/env bash
# Builds the control plane the e2e suite runs against (tests/e2e/controlplane) once, into
#   ${EDGEGPU_E2E_CACHE:-~/.cache/edgegpu-e2e}/<kubernetes version>-<source hash>/
# and prints that folder. A folder already built for the same sources is reused.
# EDGEGPU_E2E_BIN, when set, names a folder of ready binaries (etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager, kubelet, kubectl) to use instead: nothing is built.
set -euo pipefail
here="$(cd "$(dirname "$0")/controlplane" && pwd)"

if [[ -n "${EDGEGPU_E2E_BIN:-}" ]]; then
    for c in etcd kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl; do
        [[ -x "$EDGEGPU_E2E_BIN/$c" ]] || { echo "EDGEGPU_E2E_BIN: no executable $EDGEGPU_E2E_BIN/$c" >&2; exit 2; }
    done
    echo "$EDGEGPU_E2E_BIN"
    exit 0
fi

command -v go >/dev/null || { echo "build-controlplane: Go is not installed (the e2e suite builds Kubernetes from its Go modules)" >&2; exit 2; }
k8s="$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$here/go.mod")"
[[ -n "$k8s" ]] || { echo "build-controlplane: no k8s.io/kubernetes in $here/go.mod" >&2; exit 2; }
hash="$(cat "$here"/go.mod "$here"/go.sum "$here"/*.go | sha256sum | cut -c1-12)"
out="${EDGEGPU_E2E_CACHE:-$HOME/.cache/edgegpu-e2e}/$k8s-$hash"

if [[ ! -x "$out/controlplane" ]]; then
    mkdir -p "$out"
    minor="${k8s#v1.}"; minor="${minor%%.*}"
    pkg=k8s.io/component-base/version
    ldflags="-s -w -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "build-controlplane: building Kubernetes $k8s into $out (the first build takes a few minutes: 197-243 s measured on 2 cores)" >&2
    start=$SECONDS
    (cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$out/controlplane.tmp" .)
    mv "$out/controlplane.tmp" "$out/controlplane"
    echo "build-controlplane: built in $((SECONDS - start)) s" >&2
fi
for c in etcd kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl; do
    ln -sf controlplane "$out/$c"
done
"$out/controlplane" version | sed 's/^/build-controlplane: /' >&2
echo "$out"
