#!/usr/bin/env bash
# Builds Prometheus' promtool from the Go module proxy once, into
#   ${EDGEGPU_E2E_CACHE:-~/.cache/edgegpu-e2e}/promtool-<version>/promtool
# and prints its path (the first build takes about 5 minutes on 2 cores).
set -euo pipefail
version=v0.316.0  # github.com/prometheus/prometheus: Prometheus 3.x's module version
out="${EDGEGPU_E2E_CACHE:-$HOME/.cache/edgegpu-e2e}/promtool-$version"
if [[ ! -x "$out/promtool" ]]; then
    command -v go >/dev/null || { echo "build-promtool: Go is not installed" >&2; exit 2; }
    echo "build-promtool: building promtool $version into $out (about 5 minutes the first time)" >&2
    mkdir -p "$out"
    GOBIN="$out" go install "github.com/prometheus/prometheus/cmd/promtool@$version"
fi
echo "$out/promtool"
