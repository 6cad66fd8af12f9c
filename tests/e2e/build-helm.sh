#!/usr/bin/env bash
# Builds Helm from the Go module proxy once, into
#   ${EDGEGPU_E2E_CACHE:-~/.cache/edgegpu-e2e}/helm-<version>/helm
# and prints its path (the first build takes a few minutes on 2 cores).
set -euo pipefail
version=v4.3.2  # helm.sh/helm/v4
out="${EDGEGPU_E2E_CACHE:-$HOME/.cache/edgegpu-e2e}/helm-$version"
if [[ ! -x "$out/helm" ]]; then
    command -v go >/dev/null || { echo "build-helm: Go is not installed" >&2; exit 2; }
    echo "build-helm: building helm $version into $out (a few minutes the first time)" >&2
    mkdir -p "$out"
    GOBIN="$out" go install "helm.sh/helm/v4/cmd/helm@$version"
fi
echo "$out/helm"
