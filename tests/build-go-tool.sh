#!/usr/bin/env bash
# Builds a Go command from the Go module proxy once, into
#   ${EDGEGPU_E2E_CACHE:-~/.cache/edgegpu-e2e}/<name>-<version>/<name>
# and prints its path. The suite's tools:
#   tests/build-go-tool.sh promtool github.com/prometheus/prometheus/cmd/promtool v0.316.0  (~5 min)
#   tests/build-go-tool.sh helm helm.sh/helm/v4/cmd/helm v4.3.2                            (~2 min)
set -euo pipefail
name=$1 package=$2 version=$3
out="${EDGEGPU_E2E_CACHE:-$HOME/.cache/edgegpu-e2e}/$name-$version"
if [[ ! -x "$out/$name" ]]; then
    command -v go >/dev/null || { echo "build-go-tool: Go is not installed" >&2; exit 2; }
    echo "build-go-tool: building $name $version into $out (minutes the first time)" >&2
    mkdir -p "$out"
    GOBIN="$out" go install "$package@$version"
fi
echo "$out/$name"
